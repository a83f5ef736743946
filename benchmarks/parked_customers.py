"""Refunds waiting on their customers beside refunds waiting on approvers, in one worker (Postgres).

A refund whose policy asks its customer (``ask_customer``: here "My parcel never arrived." on an order the carrier
shows delivered with a photo at the door, question ``delivery``) waits as rows, like a parked approval: the
question's row and two DELAYED workflows (``{id}/answer-reminder``, ``{id}/answer-deadline``); its deciding
workflow ended. Three arms, each on fresh databases, one worker each (``benchmarks.parked_worker``, the evidence
look-ups against the evidence sandbox), all in one run:

- ``none``: nothing waiting;
- ``approvers``: N refunds parked for approval;
- ``both``: N waiting on their customers beside N parked for approval.

1. Parking: ``approvers`` parks N in chunks; ``both`` alternates a chunk that asks and a chunk that parks (which
   goes first alternates by round) until N of each wait. Checked per chunk: the refunds' rows, the questions open
   and their timers DELAYED (asking), the approval deadlines DELAYED (parking).
2. Restarts: R rounds, each giving every arm a turn in an order that rotates by round, so one worker runs at a
   time and the arms meet the same moments of a shared machine. A turn: counted, the PENDING workflows (what DBOS
   would recover), the DELAYED ones and the open questions; a new worker (same executor id) is spawned and timed
   until ``runtime.start`` returned; an auto-approved refund is submitted as soon as it is ready and timed to its
   workflow's end; the worker idles (its CPU and that of its arm's Postgres backends, its RSS); then SIGKILL.

Reported per arm: medians over the restarts, and ratios: each arm against ``none``, ``both`` against
``approvers`` (of the medians, and the median of the ratios within each round).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import harness, parked
from benchmarks.harness import Databases, fmt
from benchmarks.parked_common import Store, Worker, idle_sample, opened, probe_auto, worker_env

#: What each restart measures, and what the ratios compare.
MEASURES = ("spawn_to_ready_s", "new_refund_s", "worker_cpu_pct", "postgres_cpu_pct", "rss_mb")
PAIRS = (("approvers", "none"), ("both", "none"), ("both", "approvers"))


@dataclass
class Arm:
    name: str
    customers: int
    approvers: int
    dbs: Databases
    env: dict[str, str]
    log: Path


@contextmanager
def _arms(n: int, server: str, sandbox_url: str, workdir: Path, evidence_port: int) -> Iterator[list[Arm]]:
    with ExitStack() as stack:
        arms = []
        for name, customers, approvers in (("none", 0, 0), ("approvers", 0, n), ("both", n, n)):
            dbs = stack.enter_context(harness.databases("postgres", server, workdir))
            env = worker_env(dbs, sandbox_url, workdir, EVIDENCE_SANDBOX_PORT=str(evidence_port))
            arms.append(Arm(name, customers, approvers, dbs, env, workdir / f"customers-{name}.log"))
        yield arms


def _waiting(store: Store) -> dict[str, Any]:
    """What waits in an arm's databases: refund rows by status, questions by state, workflows DELAYED and PENDING."""
    return {
        "refund_rows": dict(store.all_refund_rows()),
        "questions": dict(store.questions()),
        "delayed": store.count_status("DELAYED"),
        "pending": store.count_status("PENDING"),
    }


def _park(arm: Arm, workdir: Path, chunk: int, timeout: float) -> dict[str, Any]:
    """A first worker: a warm-up refund, then the arm's waits; SIGKILLed once they are all waiting."""
    out: dict[str, Any] = {"arm": arm.name, "customers": arm.customers, "approvers": arm.approvers}
    with opened(arm.dbs, workdir) as (store, client):
        worker = Worker(arm.env, arm.log)
        try:
            worker.wait_ready()
            probe_auto(client, store, f"{arm.name}-warm-up")
            if arm.approvers:
                kinds = ("ask", "park") if arm.customers else ("park",)
                out["throughput"] = parked.throughput(
                    client, store, worker, arm.approvers, chunk, timeout, kinds=kinds, tag=f"{arm.name}-"
                )
                out["rss_after_parking_mb"] = worker.rss_mb()
        finally:
            worker.kill()
        out["waiting"] = _waiting(store)
    return out


def _turn(arm: Arm, r: int, *, server: str, workdir: Path, idle_seconds: float) -> dict[str, Any]:
    """One restart of the arm's worker: counted before the spawn, timed to ready and through one refund, idle."""
    with opened(arm.dbs, workdir) as (store, client):
        sample: dict[str, Any] = {
            "round": r,
            "pending_at_restart": store.count_status("PENDING"),
            "enqueued_at_restart": store.count_status("ENQUEUED"),
            "delayed_at_restart": store.count_status("DELAYED"),
            "open_questions_at_restart": sum(n for k, n in store.questions().items() if k.endswith(":open")),
        }
        worker = Worker(arm.env, arm.log)
        try:
            sample["spawn_to_ready_s"] = worker.wait_ready() - worker.spawned_at
            sample["new_refund_s"] = probe_auto(client, store, f"{arm.name}-restart-{r}")
            sample.update(idle_sample(worker, server, arm.dbs, idle_seconds))
        finally:
            worker.kill()
    return sample


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"samples": samples, "pending_at_restart": max(s["pending_at_restart"] for s in samples)}
    for key in MEASURES:
        values = [s[key] for s in samples if s[key] is not None]
        out[key] = harness.median(values)
        out[f"{key}_range"] = [min(values), max(values)] if values else None
    return out


def _ratios(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``a_vs_b`` per measure: the ratio of the medians, and the median over rounds of the ratio within a round."""
    out: dict[str, Any] = {}
    for a, b in PAIRS:
        ra, rb = runs[a]["restarts"], runs[b]["restarts"]
        by_round = {s["round"]: s for s in rb["samples"]}
        pair: dict[str, Any] = {}
        for key in MEASURES:
            within = [harness.ratio(s[key], by_round[s["round"]][key]) for s in ra["samples"] if s["round"] in by_round]
            pair[key] = harness.ratio(ra[key], rb[key])
            pair[f"{key}_paired"] = harness.median([x for x in within if x is not None])
        out[f"{a}_vs_{b}"] = pair
    return out


def run_section(
    *,
    n: int,
    chunk: int,
    restarts: int,
    idle_seconds: float,
    server: str,
    sandbox_url: str,
    workdir: Path,
    timeout: float,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "settings": {"n": n, "chunk": chunk, "restarts": restarts, "idle_seconds": idle_seconds},
        "load_average_start": harness.os_load(),
    }
    with harness.evidence_sandbox(workdir) as port, _arms(n, server, sandbox_url, workdir, port) as arms:
        runs: dict[str, dict[str, Any]] = {}
        for arm in arms:
            print(f"  customer waits: parking arm {arm.name} ({arm.customers:,} + {arm.approvers:,})", flush=True)
            runs[arm.name] = _park(arm, workdir, chunk, timeout)
        samples: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
        for r in range(restarts):
            t0 = time.monotonic()
            for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
                samples[arm.name].append(_turn(arm, r, server=server, workdir=workdir, idle_seconds=idle_seconds))
            print(f"  customer waits: restart round {r + 1}/{restarts} ({time.monotonic() - t0:.0f} s)", flush=True)
        for arm in arms:
            runs[arm.name]["restarts"] = _summary(samples[arm.name])
            with opened(arm.dbs, workdir) as (store, _):
                runs[arm.name]["waiting_at_end"] = _waiting(store)
    out["arms"] = list(runs.values())
    out["ratios"] = _ratios(runs)
    out["load_average_end"] = harness.os_load()
    return out


def run_or_error(**kwargs: Any) -> dict[str, Any]:
    try:
        return run_section(**kwargs)
    except (TimeoutError, RuntimeError) as error:
        return {"settings": {"n": kwargs["n"]}, "error": str(error)}


# ------------------------------------------------------------------------------------------------ report


def tables(section: dict[str, Any]) -> list[str]:
    if "error" in section:
        return [f"failed: {section['error']}"]
    s = section["settings"]
    arms = {a["arm"]: a for a in section["arms"]}
    lines = [
        f"{s['restarts']} restarts per arm, arms in turn (rotating by round); medians [min-max]; "
        f"idle window {fmt(s['idle_seconds'], 0)} s:",
        "",
        "| arm | waiting on customers + approvers | DELAYED at restart | PENDING at restart | spawn -> ready "
        "| new refund completed after | worker idle CPU, % of a core | Postgres idle CPU, % | RSS, MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, a in arms.items():
        rs = a["restarts"]
        delayed = max(x["delayed_at_restart"] for x in rs["samples"])
        cells = [_cell(rs, "spawn_to_ready_s", 2, " s"), _cell(rs, "new_refund_s", 2, " s")]
        cells += [_cell(rs, "worker_cpu_pct"), _cell(rs, "postgres_cpu_pct"), _cell(rs, "rss_mb")]
        lines.append(
            f"| {name} | {a['customers']:,} + {a['approvers']:,} | {delayed:,} | {rs['pending_at_restart']} "
            f"| {' | '.join(cells)} |"
        )
    lines += ["", "| ratio (of medians; median of per-round ratios) | " + " | ".join(MEASURES) + " |"]
    lines.append("|---|" + "---:|" * len(MEASURES))
    for pair, r in section["ratios"].items():
        cells = [f"{fmt(r[k], 2)}x; {fmt(r[f'{k}_paired'], 2)}x" for k in MEASURES]
        lines.append(f"| {pair.replace('_vs_', ' / ')} | " + " | ".join(cells) + " |")
    both = arms["both"].get("throughput")
    if both:
        lines += [
            "",
            f"Parking (arm both, chunks of {both['chunk']:,} alternating): asking {fmt(both['ask_per_s'])} /s, "
            f"parking for approval {fmt(both['park_per_s'])} /s (median chunk; "
            f"{fmt(harness.ratio(both['ask_per_s'], both['park_per_s']), 2)}x); arm approvers parking "
            f"{fmt(arms['approvers']['throughput']['park_per_s'])} /s.",
        ]
    return lines


def _cell(rs: dict[str, Any], key: str, digits: int = 1, unit: str = "") -> str:
    lo_hi = rs[f"{key}_range"]
    if lo_hi is None:
        return "n/a"
    return f"{fmt(rs[key], digits)}{unit} [{fmt(lo_hi[0], digits)}-{fmt(lo_hi[1], digits)}]"
