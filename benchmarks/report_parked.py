"""The parked-approval section's tables, its targets (what a parked refund may cost a worker) and its plot."""

from __future__ import annotations

from typing import Any

from benchmarks.harness import fmt, median, ratio

#: Results of the parked section before a parked refund became rows (they measured waits in ``recv``).
RECV_DESIGN = "recv"


def design(parked: dict[str, Any]) -> str:
    return str(parked.get("design", RECV_DESIGN))


def _met(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def _ms(summary: dict[str, Any] | None) -> str:
    if not summary or not summary.get("n"):
        return "n/a"
    return f"{fmt(summary['p50'], 0)} / {fmt(summary['p99'], 0)} / {fmt(summary['max'], 0)} ms"


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if values else 0.0


def _ok(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((r for r in runs if "error" not in r), key=lambda r: int(r["parked"]))


def tables(parked: dict[str, Any]) -> list[str]:
    if design(parked) == RECV_DESIGN:
        return ["These results measured refunds waiting in `DBOS.recv` (the earlier design); see the JSON."]
    runs = _ok(parked["runs"])
    base = next((r for r in runs if r["parked"] == 0), None)
    lines = [f"| {r['parked']:,} | failed: {r['error']} |" for r in parked["runs"] if "error" in r]
    if lines:
        lines = ["| parked | run |", "|---:|---|", *lines, ""]
    settings = parked.get("settings", {})
    lines += [
        f"Restart: SIGKILL, then a new worker with the same executor id ({settings.get('restarts')} times per "
        "count; medians), and an auto-approved refund submitted as soon as it is ready:",
        "",
        "| parked | PENDING workflows at restart | spawn -> ready | new refund submitted at ready: completed after "
        "| vs 0 parked |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        rs = r["restarts"]
        vs = ratio(rs["new_refund_s"], base["restarts"]["new_refund_s"]) if base else None
        samples = ", ".join(fmt(s["new_refund_s"], 2) for s in rs["samples"])
        lines.append(
            f"| {r['parked']:,} | {rs['pending_at_restart']} | {fmt(rs['spawn_to_ready_s'], 2)} s "
            f"| {fmt(rs['new_refund_s'], 2)} s ({samples}) | {fmt(vs, 2)}x |"
        )
    lines += [
        "",
        f"Idle: each restarted worker once its refund is done, {fmt(settings.get('idle_seconds'), 0)} s with nothing "
        "to do; median [min-max] over the restarts:",
        "",
        "| parked | worker CPU, % of a core | Postgres backends of the run, % of a core | worker RSS, MB | threads |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        samples = r["restarts"]["samples"]
        lines.append(
            f"| {r['parked']:,} | {_range([s['worker_cpu_pct'] for s in samples])} "
            f"| {_range([s['postgres_cpu_pct'] for s in samples])} | {_range([s['rss_mb'] for s in samples])} "
            f"| {_range([float(s['threads']) for s in samples], 0)} |"
        )
    lines += _throughput(runs) + _approvals(runs) + _wake(parked.get("wake")) + _expiry(parked.get("expiry"))
    return [*lines, "", *targets(parked)]


def _range(values: list[float], digits: int = 1) -> str:
    if not values:
        return "n/a"
    return f"{fmt(median(values), digits)} [{fmt(min(values), digits)}-{fmt(max(values), digits)}]"


def _throughput(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "Throughput, from the first submit of a chunk to the end of its last deciding workflow (chunks of "
        "auto-approved and of parking refunds alternating; median chunk):",
        "",
        "| parked | chunk | auto-approved | parking | parking / auto-approved | parking chunks, first -> last "
        "| full GCs while parking (longest) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        t = r.get("throughput")
        if not t:
            continue
        parks = [c["per_s"] for c in t["chunks"] if c["kind"] == "park"]
        lines.append(
            f"| {r['parked']:,} | {t['chunk']:,} | {fmt(t['auto_per_s'])} /s | {fmt(t['park_per_s'])} /s "
            f"| {fmt(t['park_vs_auto'], 2)}x | {fmt(parks[0])} -> {fmt(parks[-1])} /s "
            f"| {t['full_gc']['count']} ({fmt(t['full_gc']['max_ms'], 0)} ms) |"
        )
    return lines


def _approvals(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "Approve -> completed (the continuation's end), approvals at a steady rate, p50 / p99 / max:",
        "",
        "| parked | decision path | completed | approve -> completed | the decision call | full GCs meanwhile |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    paths = {"api": "API: `decide_here` in the worker", "cli": "CLI: `decider_via_queue` from a client"}
    for r in runs:
        a = r.get("approvals")
        if not a:
            continue
        for path, label in paths.items():
            p = a[path]
            lines.append(
                f"| {r['parked']:,} | {label} | {p['completed']}/{p['approved']} at {fmt(a['rate_per_s'], 0)}/s "
                f"| {_ms(p['approve_to_completed_ms'])} | {_ms(p['decision_call_ms'])} "
                f"| {p['full_gc']['count']} ({fmt(p['full_gc']['max_ms'], 0)} ms) |"
            )
    return lines


def _wake(wake: dict[str, Any] | None) -> list[str]:
    if not wake:
        return []
    lines = [
        "",
        f"Wake -> start of a workflow on the `approvals` queue, same worker ({wake['wakes']} wakes each, "
        "alternating), p50 / p99 / max:",
        "",
        "| how the workflow is woken | wake -> dequeued |",
        "|---|---:|",
    ]
    lines += [f"| {arm} | {_ms(wake[arm]['wake_to_start_ms'])} |" for arm in wake["arms"]]
    return lines


def _expiry(e: dict[str, Any] | None) -> list[str]:
    if not e:
        return []
    if "error" in e:
        return ["", f"{e['expiring']:,} refunds expiring at once: failed: {e['error']}"]
    n = e["expiring"]
    return [
        "",
        f"{n:,} refunds expiring at once (approval timeout {fmt(e['approval_timeout_s'], 0)} s; all due when the "
        "new worker starts):",
        "",
        "| parked in | deadlines due before the restart | drain (first start -> last end) | expired /s "
        "| decisions | refund rows | provider refunds | unfinished | new refunds before / during the drain |",
        "|---:|---:|---:|---:|---|---|---:|---:|---:|",
        f"| {fmt(e['park_s'])} s | {e['decided_before_restart']} | {fmt(e['drain_s'])} s "
        f"(ready -> last {fmt(e['ready_to_drained_s'])} s) | {fmt(e['expired_per_s'])} "
        f"| {_counts(e['decisions'])} | {_counts(e['refund_rows'])} | {e['paid']} | {e['not_final']} "
        f"| {_ms(e['before_ms'])} ({e['before_ms']['n']}) / {_ms(e['during_ms'])} ({e['during_ms']['n']}) |",
    ]


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items())) or "none"


def targets(parked: dict[str, Any]) -> list[str]:
    """The parked-approval targets, each met or missed by this run's numbers."""
    runs = _ok(parked["runs"])
    by_n = {r["parked"]: r for r in runs}
    base, top = by_n.get(0), (runs[-1] if runs and runs[-1]["parked"] else None)
    rows = []
    if base and top:
        b = base["restarts"]
        cells, ok = [], True
        for r in runs[1:]:
            rs = r["restarts"]
            x = ratio(rs["new_refund_s"], b["new_refund_s"])
            ready_ok, ready_cell = _within_noise(
                [s["spawn_to_ready_s"] for s in b["samples"]],
                [s["spawn_to_ready_s"] for s in rs["samples"]],
                "s",
                2,
                only_above=True,
            )
            ok = ok and x is not None and x <= 1.5 and rs["pending_at_restart"] == 0 and ready_ok
            cells.append(
                f"{r['parked']:,} parked: {fmt(rs['new_refund_s'], 2)} s ({fmt(x, 2)}x), {rs['pending_at_restart']} "
                f"PENDING, ready in {ready_cell}"
            )
        rows.append(
            (
                "new refund at restart <= 1.5x its time with 0 parked; ready as fast (within noise); no recovery work",
                f"0 parked: {fmt(b['new_refund_s'], 2)} s; " + "; ".join(cells),
                _met(ok),
            )
        )
        rows.append(_idle_target(base, top))
    for r in runs:
        t = r.get("throughput")
        if t:
            x = t["park_vs_auto"]
            rows.append(
                (
                    f"parking >= 0.8x auto-approve throughput ({r['parked']:,} parked)",
                    f"{fmt(t['park_per_s'])} vs {fmt(t['auto_per_s'])} refunds/s: {fmt(x, 2)}x",
                    _met(x is not None and x >= 0.8),
                )
            )
    if top and top.get("approvals"):
        api, cli = top["approvals"]["api"], top["approvals"]["cli"]
        p99 = api["approve_to_completed_ms"]["p99"]
        rows.append(
            (
                f"approve -> completed p99 <= 1 s with {top['parked']:,} parked",
                f"API path p99 {fmt(p99, 0)} ms (p50 {fmt(api['approve_to_completed_ms']['p50'], 0)}, "
                f"{api['completed']}/{api['approved']} completed); CLI path p99 "
                f"{fmt(cli['approve_to_completed_ms']['p99'], 0)} ms",
                _met(p99 is not None and p99 <= 1000 and api["completed"] == api["approved"]),
            )
        )
    e = parked.get("expiry")
    if e and "error" not in e:
        n = e["expiring"]
        ok = (
            e["decisions"] == {"expired": n}
            and e["refund_rows"] == {"rejected": n}
            and e["paid"] == 0
            and e["not_final"] == 0
            and e["during_ms"]["n"] > 0
            and e["during_not_completed"] == 0
        )
        rows.append(
            (
                f"{n:,} expiring at once: all expired, none paid, none lost, new refunds keep flowing",
                f"{e['decisions'].get('expired', 0):,} expired, {e['paid']} paid, {e['not_final']} unfinished, "
                f"drained in {fmt(e['drain_s'])} s; new refunds p50 {fmt(e['during_ms']['p50'], 0)} ms during the "
                f"drain ({e['during_ms']['n']}, {e['during_not_completed']} not completed) vs "
                f"{fmt(e['before_ms']['p50'], 0)} ms before",
                _met(ok),
            )
        )
    return ["| target | measured | |", "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows)]


def _within_noise(
    base: list[float], other: list[float], unit: str, digits: int = 1, *, only_above: bool = False
) -> tuple[bool, str]:
    """Equal within noise: the medians differ by no more than the spread (max - min) between the repeats of
    either (``only_above``: ``other``'s is not higher than ``base``'s by more than that)."""
    a, b = median(base), median(other)
    diff = (b or 0) - (a or 0) if only_above else abs((b or 0) - (a or 0))
    noise = max(_spread(base), _spread(other))
    cell = (
        f"{fmt(b, digits)} vs {fmt(a, digits)} {unit} ({fmt(ratio(b, a), 2)}x; difference {fmt(diff, digits)}, "
        f"spread between repeats {fmt(noise, digits)})"
    )
    return diff <= noise, cell


def _idle_target(base: dict[str, Any], top: dict[str, Any]) -> tuple[str, str, str]:
    def samples(run: dict[str, Any], key: str) -> list[float]:
        return [s[key] for s in run["restarts"]["samples"]]

    # Parked refunds could only add: lower with them parked is noise too.
    rss_ok, rss = _within_noise(samples(base, "rss_mb"), samples(top, "rss_mb"), "MB", only_above=True)
    cpu_ok, cpu = _within_noise(
        samples(base, "worker_cpu_pct"), samples(top, "worker_cpu_pct"), "% of a core", only_above=True
    )
    return (
        f"worker RSS and idle CPU with {top['parked']:,} parked = with 0 (not above it by more than noise)",
        f"RSS {rss}; idle CPU {cpu}",
        _met(rss_ok and cpu_ok),
    )


def plot(results: dict[str, Any], save: Any) -> str | None:
    """Restart probes by count, and the expiry drain with the new refunds submitted during it."""
    parked = results.get("parked")
    if not parked or design(parked) == RECV_DESIGN:
        return None
    import matplotlib.pyplot as plt

    runs = _ok(parked["runs"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    for i, r in enumerate(runs):
        samples = [s["new_refund_s"] for s in r["restarts"]["samples"] if s["new_refund_s"] is not None]
        ax.scatter([i] * len(samples), samples, color="tab:blue", s=14)
        ax.scatter([i], [r["restarts"]["spawn_to_ready_s"]], color="tab:orange", marker="s", s=20)
    ax.scatter([], [], color="tab:blue", s=14, label="new refund at restart, s")
    ax.scatter([], [], color="tab:orange", marker="s", s=20, label="spawn -> ready, s (median)")
    ax.set_xticks(list(range(len(runs))), [f"{r['parked']:,} parked" for r in runs])
    ax.set_ylim(bottom=0)
    ax.set_ylabel("seconds")
    ax.set_title("SIGKILL + restart")
    ax.legend(fontsize=7, loc="center right")
    e = parked.get("expiry")
    ax = axes[1]
    if e and "error" not in e:
        done, total = [], 0
        for count in e["timeline_per_s"]:
            total += count
            done.append(total)
        ax.plot(range(1, len(done) + 1), done, label="deadlines ended (cumulative)")
        ax.set_xlabel("s after the new worker was ready")
        twin = ax.twinx()
        points = e["during_samples"]
        twin.scatter(
            [p[0] for p in points], [p[1] * 1000 for p in points], color="tab:red", s=10, label="new refund, ms"
        )
        twin.set_ylabel("new refund: submit -> completed, ms")
        ax.set_title(f"{e['expiring']:,} deadlines due at once")
        ax.set_ylabel("deadline workflows ended")
        ax.legend(fontsize=7, loc="upper left")
        twin.legend(fontsize=7, loc="lower right")
    return str(save(fig, "parked"))
