"""HTTP load: N auto-approved refunds through `refund-agent serve` on Postgres, C at a time.

    python -m benchmarks.http_load --refunds 100 --concurrency 8 [--postgres-url URL] [--timeout 300]

What runs, all on 127.0.0.1: two fresh Postgres databases (DBOS system + application) on the given
server, seeded with the demo orders by `refund-agent seed`; the payments sandbox and the service
(`refund-agent serve`: HTTP API and a queue worker in one process, offline model) as subprocesses.

The load is C concurrent clients (a closed loop): each submits a refund (POST /refunds, its own
Idempotency-Key), follows it with GET /refunds/{id} until it is completed, rejected or failed, then
takes the next, until N were submitted. Every refund is a minor unit ("0.01", or "1" JPY) on a seeded
order with room for thousands, so policy auto-approves it and the workflow pays it. A submit answered
with a 5xx or a dropped connection is sent again with the same Idempotency-Key (at most 3 attempts),
as a client should; those answers are counted in the report. Status polls are not free (each GET runs
several queries and lists the step timeline), so the poll interval (--poll-interval, 0.25 s) changes
the result: see benchmarks/README.md.

Reported: refunds/s (completed / wall time from the first submit to the last completion), p50/p99
of submit latency (the POST round trip) and of submit-to-completed, counts by final status. The
completion time of a refund is the end of its last DBOS step as the service recorded it (same host,
same clock), so the poll interval does not blur latencies; when the timeline is missing it is the
time the poll saw the final status. Printed as Markdown; written as JSON to
benchmarks/results/http_load-<timestamp>.json. Subprocesses are stopped and the databases dropped
at the end, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
from psycopg import sql

from agent.ops.processes import free_port, http_ok, wait_for
from benchmarks.limits import SERIAL_RULE_OFF_ENV

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
RESULTS = Path(__file__).resolve().parent / "results"
TERMINAL = {"completed", "rejected", "failed", "cancelled"}
SUBMIT_ATTEMPTS = 3

#: Seeded orders that are paid, undisputed and inside the refund window, with the minor unit refunded
#: each time. ord_1001 alone has room for 4,200 refunds of 0.01; spreading over orders avoids making
#: every payment update the same order row.
LOAD_ORDERS: list[tuple[str, str, str]] = [
    ("ord_1001", "USD", "0.01"),
    ("ord_1002", "USD", "0.01"),
    ("ord_1003", "EUR", "0.01"),
    ("ord_1006", "JPY", "1"),
    ("ord_1007", "USD", "0.01"),
    ("ord_1010", "GBP", "0.01"),
]
#: Environment variables that would change what is measured if inherited from the caller's shell.
DROPPED_ENV = (
    "REFUND_AGENT_MODEL",
    "REFUND_AGENT_MODEL_BASE_URL",
    "REFUND_AGENT_MODEL_API_KEY",
    "REFUND_AGENT_CRASH_AT",
    "REFUND_AGENT_PUBLIC_URL",
    "SLACK_WEBHOOK_URL",
    "SLACK_SIGNING_SECRET",
    "AUTO_APPROVE_LIMIT",
    "AUTO_APPROVE_LIMITS",
    "ABSOLUTE_REFUND_CAP",
    "ABSOLUTE_REFUND_CAPS",
    "REFUND_WINDOW_DAYS",
    "PAYMENTS_API_KEY",
    "PAYMENTS_KEY_TTL_SECONDS",
    "QUEUE_WORKER_CONCURRENCY",
)


@dataclass
class Refund:
    index: int
    refund_id: str
    order_id: str
    amount: str
    currency: str
    submitted_at: float = 0.0  # wall clock (time.time), so it compares with the service's step timestamps
    submit_latency_s: float | None = None
    submit_status: int | None = None
    submit_attempts: int = 0
    submit_errors: list[str] = field(default_factory=list)
    final_status: str = "not_submitted"
    observed_done_at: float | None = None
    server_done_at: float | None = None
    polls: int = 0
    error: str | None = None

    @property
    def done_at(self) -> float | None:
        return self.server_done_at or self.observed_done_at

    @property
    def latency_s(self) -> float | None:
        return None if self.done_at is None else self.done_at - self.submitted_at


@dataclass
class Run:
    refunds: int
    concurrency: int
    timeout_s: float
    poll_interval_s: float
    worker_concurrency: int | None
    postgres_server: str
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    load_average_at_start: list[float] = field(default_factory=lambda: [round(x, 2) for x in os.getloadavg()])


# ---------------------------------------------------------------------------------------------- setup


def _local_only(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if host not in LOCAL_HOSTS:
        raise SystemExit(f"--postgres-url must point at 127.0.0.1 (this benchmark talks to nothing else), got {host!r}")


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url.replace("postgresql+psycopg://", "postgresql://"))
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextmanager
def fresh_databases(server_url: str, prefix: str) -> Iterator[tuple[str, str]]:
    """Two new databases (system, app) on the server; dropped (WITH FORCE) on the way out."""
    admin = server_url.replace("postgresql+psycopg://", "postgresql://")
    names = [f"{prefix}_sys", f"{prefix}_app"]
    created: list[str] = []
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in names:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                created.append(name)
        yield _with_database(admin, names[0]), _with_database(admin, names[1])
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in created:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


class Processes:
    """Children started with ``python -m agent.cli ...``; all stopped (TERM, then KILL) on exit."""

    def __init__(self, workdir: Path, env: Mapping[str, str]) -> None:
        self.workdir = workdir
        self.env = dict(env)
        self.children: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def run(self, name: str, args: Sequence[str], timeout: float) -> None:
        with self.log(name).open("ab") as out:
            done = subprocess.run(
                [sys.executable, "-m", "agent.cli", *args],
                env=self.env,
                cwd=self.workdir,  # no .env or dbos-config.yaml of the caller's directory
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        if done.returncode != 0:
            raise RuntimeError(f"`refund-agent {' '.join(args)}` exited {done.returncode}; see {self.log(name)}")

    def start(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        out = self.log(name).open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", *args],
            env=self.env,
            cwd=self.workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        self.children.append((name, proc, out))
        return proc

    def alive(self, proc: subprocess.Popen[bytes]) -> bool:
        return proc.poll() is None

    def stop_all(self) -> None:
        for _, proc, _ in reversed(self.children):
            if proc.poll() is None:
                proc.terminate()
        for _, proc, out in reversed(self.children):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out.close()
        self.children.clear()

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.log(name)
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _wait_ready(proc: subprocess.Popen[bytes], url: str, what: str, timeout: float) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready")
        return http_ok(url)

    wait_for(ready, timeout=timeout, what=what, interval=0.1)


# ----------------------------------------------------------------------------------------------- load


def _parse_ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


def _last_step_end(status: Mapping[str, Any]) -> float | None:
    ends = [ts for step in status.get("steps") or [] if (ts := _parse_ts(step.get("end"))) is not None]
    return max(ends) if ends else None


def _why(status: Mapping[str, Any]) -> str:
    """The first step that raised, else the refund's reason: what ended a refund that did not complete."""
    steps = status.get("steps") or []
    for step in steps:
        if step.get("error"):
            return f"step {step['name']}: {step['error']}"[:300]
    last = steps[-1]["name"] if steps else "none"
    outcome = status.get("outcome") or {}
    detail = outcome.get("detail") if isinstance(outcome, dict) else None
    return f"{status['status']} (last step recorded: {last}): {detail or status.get('reason') or 'no detail'}"[:300]


async def _submit(http: httpx.AsyncClient, refund: Refund, body: dict[str, str]) -> bool:
    """POST the refund. On a 5xx or a dropped connection, send it again with the same Idempotency-Key (what
    the key is for: the service returns the refund if the first attempt got through). Counted, not hidden."""
    refund.submitted_at = time.time()
    started = time.perf_counter()
    for attempt in range(1, SUBMIT_ATTEMPTS + 1):
        refund.submit_attempts = attempt
        try:
            response = await http.post("/refunds", json=body, headers={"Idempotency-Key": refund.refund_id})
        except httpx.TransportError as error:
            refund.submit_errors.append(f"{type(error).__name__}: {error}"[:200])
        else:
            refund.submit_status = response.status_code
            if response.status_code < 500:
                break
            refund.submit_errors.append(f"{response.status_code}: {response.text[:200]}")
        if attempt < SUBMIT_ATTEMPTS:
            await asyncio.sleep(0.1 * attempt)
    refund.submit_latency_s = time.perf_counter() - started
    if refund.submit_status in (200, 202):  # 200: an attempt that looked lost had been accepted
        refund.final_status = "unfinished"  # until a poll sees it end
        return True
    refund.final_status = "submit_error"
    refund.error = refund.submit_errors[-1] if refund.submit_errors else f"{refund.submit_status}"
    return False


async def _follow(
    http: httpx.AsyncClient, refund: Refund, body: dict[str, str], deadline: float, poll_interval: float
) -> None:
    if not await _submit(http, refund, body):
        return
    while time.monotonic() < deadline:
        await asyncio.sleep(poll_interval)
        refund.polls += 1
        try:
            polled = await http.get(f"/refunds/{refund.refund_id}")
        except httpx.HTTPError as error:
            refund.error = f"poll: {type(error).__name__}: {error}"
            continue
        if polled.status_code != 200:
            refund.error = f"poll: {polled.status_code}: {polled.text[:300]}"
            continue
        status = polled.json()
        if status["status"] in TERMINAL:
            refund.observed_done_at = time.time()
            refund.final_status = status["status"]
            refund.server_done_at = _last_step_end(status)
            if refund.final_status != "completed":
                refund.error = _why(status)
            return


async def run_load(
    base_url: str, token: str, refunds: list[Refund], concurrency: int, timeout: float, poll_interval: float
) -> None:
    deadline = time.monotonic() + timeout
    queue: asyncio.Queue[Refund] = asyncio.Queue()
    for refund in refunds:
        queue.put_nowait(refund)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits, timeout=60) as http:

        async def client() -> None:
            while time.monotonic() < deadline:
                try:
                    refund = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                body = {
                    "order_id": refund.order_id,
                    "message": f"Benchmark refund {refund.index}: please refund {refund.amount} {refund.currency}.",
                    "amount": refund.amount,
                    "currency": refund.currency,
                }
                await _follow(http, refund, body, deadline, poll_interval)

        await asyncio.gather(*(client() for _ in range(concurrency)))


# -------------------------------------------------------------------------------------------- results


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(refunds: list[Refund]) -> dict[str, Any]:
    completed = [r for r in refunds if r.final_status == "completed" and r.done_at is not None]
    submitted = [r.submitted_at for r in refunds if r.submitted_at]
    wall = (max(r.done_at for r in completed if r.done_at) - min(submitted)) if completed and submitted else None
    submit = [r.submit_latency_s for r in refunds if r.submit_latency_s is not None]
    latency = [r.latency_s for r in completed if r.latency_s is not None]
    ms = 1000.0

    def scaled(value: float | None) -> float | None:
        return None if value is None else round(value * ms, 1)

    return {
        "completed": len(completed),
        "wall_time_s": None if wall is None else round(wall, 3),
        "refunds_per_s": None if not wall else round(len(completed) / wall, 2),
        "submit_latency_ms": {"p50": scaled(percentile(submit, 50)), "p99": scaled(percentile(submit, 99))},
        "submit_to_completed_ms": {"p50": scaled(percentile(latency, 50)), "p99": scaled(percentile(latency, 99))},
        "by_status": dict(Counter(r.final_status for r in refunds).most_common()),
        "completion_time_source": dict(
            Counter("server step timeline" if r.server_done_at else "poll" for r in completed)
        ),
        "polls": sum(r.polls for r in refunds),
        "submit_5xx": sum(e[:1] == "5" for r in refunds for e in r.submit_errors),
        "submit_transport_errors": sum(e[:1] != "5" for r in refunds for e in r.submit_errors),
        "submits_retried": sum(r.submit_attempts > 1 for r in refunds),
        "errors": dict(Counter(r.error[:200] for r in refunds if r.error).most_common(5)),
    }


def markdown(run: Run, summary: dict[str, Any]) -> str:
    def fmt(value: Any, unit: str = "") -> str:
        return "n/a" if value is None else f"{value:,}{unit}"

    statuses = ", ".join(f"{name} {count}" for name, count in summary["by_status"].items())
    rows = [
        ("refunds submitted / concurrency", f"{run.refunds} / {run.concurrency}"),
        ("completed", fmt(summary["completed"])),
        ("wall time, first submit to last completion", fmt(summary["wall_time_s"], " s")),
        ("**refunds/s**", f"**{fmt(summary['refunds_per_s'])}**"),
        (
            "submit latency p50 / p99",
            f"{fmt(summary['submit_latency_ms']['p50'])} / {fmt(summary['submit_latency_ms']['p99'])} ms",
        ),
        (
            "submit to completed p50 / p99",
            f"{fmt(summary['submit_to_completed_ms']['p50'])} / {fmt(summary['submit_to_completed_ms']['p99'])} ms",
        ),
        ("final status", statuses),
        ("refunds applied at the payments provider", fmt(summary.get("provider", {}).get("refunds_applied"))),
        (
            "submit 5xx / dropped connections (retried, same key)",
            f"{summary['submit_5xx']} / {summary['submit_transport_errors']}",
        ),
    ]
    lines = ["| metric | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]
    if summary["errors"]:
        lines += ["", "Refunds that did not complete (the last step in a timeline is the one that raised):"]
        lines += [f"- {count}x {error}" for error, count in summary["errors"].items()]
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    commit = None
    with suppress(OSError, subprocess.SubprocessError):
        commit = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, check=False
            ).stdout.strip()
            or None
        )
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "commit": commit,
    }


# ----------------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.http_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--refunds", type=int, default=100, help="refunds to submit (1-2000; default 100)")
    p.add_argument("--concurrency", type=int, default=8, help="concurrent clients (1-256; default 8)")
    p.add_argument("--postgres-url", default=DEFAULT_POSTGRES, help=f"Postgres server (default {DEFAULT_POSTGRES})")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the load phase (default 300)")
    p.add_argument("--poll-interval", type=float, default=0.25, help="seconds between status polls (default 0.25)")
    p.add_argument("--worker-concurrency", type=int, default=None, help="QUEUE_WORKER_CONCURRENCY (default: service's)")
    p.add_argument("--keep-logs", action="store_true", help="keep the work directory (process logs) and print it")
    p.add_argument("--no-write", action="store_true", help="print only; do not write benchmarks/results/*.json")
    args = p.parse_args(argv)
    if not 1 <= args.refunds <= 2000:
        p.error("--refunds must be between 1 and 2000")
    if not 1 <= args.concurrency <= 256:
        p.error("--concurrency must be between 1 and 256")
    if not 0 < args.timeout <= 3600:
        p.error("--timeout must be between 0 and 3600 seconds")
    if not 0.01 <= args.poll_interval <= 5:
        p.error("--poll-interval must be between 0.01 and 5 seconds")
    _local_only(args.postgres_url)
    return args


def _terminate_on_sigterm() -> None:
    def handler(signum: int, _: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def _serve_and_load(
    procs: Processes,
    args: argparse.Namespace,
    refunds: list[Refund],
    token: str,
    sandbox_port: int,
    service_port: int,
    app_url: str,
    provider: dict[str, int],
) -> bool:
    """Seed, start the sandbox and the service, run the load, read the provider's counters into
    ``provider``. False if the service died meanwhile."""
    print(f"seeding {app_url.rsplit('/', 1)[-1]} (migrates it too) ...", flush=True)
    procs.run("seed", ["seed"], timeout=120)
    sandbox_db = f"sqlite:///{procs.workdir}/sandbox.sqlite"
    sandbox = procs.start("sandbox", ["sandbox-payments", "--port", str(sandbox_port), "--database-url", sandbox_db])
    _wait_ready(sandbox, f"http://127.0.0.1:{sandbox_port}/_sandbox/healthz", "the payments sandbox", 60)
    service = procs.start("service", ["serve"])
    base_url = f"http://127.0.0.1:{service_port}"
    _wait_ready(service, f"{base_url}/readyz", "the service", 120)
    print(f"service ready on {base_url}: {args.refunds} refunds, {args.concurrency} clients", flush=True)
    asyncio.run(run_load(base_url, token, refunds, args.concurrency, args.timeout, args.poll_interval))
    stats = httpx.get(
        f"http://127.0.0.1:{sandbox_port}/_sandbox/stats", headers={"Authorization": "Bearer sk_test_sandbox"}
    )
    provider.update(stats.json() if stats.status_code == 200 else {})
    if not procs.alive(service):
        print(f"the service exited with {service.returncode} during the load", file=sys.stderr)
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _terminate_on_sigterm()
    server = urlsplit(args.postgres_url)
    run = Run(
        refunds=args.refunds,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        poll_interval_s=args.poll_interval,
        worker_concurrency=args.worker_concurrency,
        postgres_server=f"{server.hostname}:{server.port or 5432}",
    )
    tag = f"bench_{secrets.token_hex(4)}"
    token = secrets.token_urlsafe(24)
    refunds = [
        Refund(index=i, refund_id=f"{tag}-{i:06d}", order_id=order_id, currency=currency, amount=amount)
        for i in range(args.refunds)
        for order_id, currency, amount in [LOAD_ORDERS[i % len(LOAD_ORDERS)]]
    ]
    failed = False
    provider: dict[str, int] = {}
    try:
        # Unwinds in reverse: processes stopped, then databases dropped, then the work directory removed.
        with ExitStack() as stack:
            workdir = Path(tempfile.mkdtemp(prefix="http_load-"))
            if args.keep_logs:
                stack.callback(print, f"logs kept in {workdir}", file=sys.stderr)
            else:
                stack.callback(shutil.rmtree, workdir, ignore_errors=True)
            system_url, app_url = stack.enter_context(fresh_databases(args.postgres_url, tag))
            sandbox_port, service_port = free_port(), free_port()
            overrides = {
                "DBOS_SYSTEM_DATABASE_URL": system_url,
                "DATABASE_URL": app_url,
                "PAYMENTS_API_BASE": f"http://127.0.0.1:{sandbox_port}",
                "REFUND_AGENT_API_TOKEN": token,
                "REFUND_AGENT_DATA_DIR": str(workdir / "data"),
                "REFUND_AGENT_HOST": "127.0.0.1",
                "REFUND_AGENT_PORT": str(service_port),
                "REFUND_AGENT_EXECUTOR_ID": f"{tag}-executor",
                "QUEUE_POLLING_INTERVAL_SECONDS": "0.1",
                "NOTIFICATION_POLLING_INTERVAL_SECONDS": "0.1",
                **SERIAL_RULE_OFF_ENV,
            }
            if args.worker_concurrency:
                overrides["QUEUE_WORKER_CONCURRENCY"] = str(args.worker_concurrency)
            env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV} | overrides
            procs = Processes(workdir, env)
            stack.callback(procs.stop_all)
            try:
                failed = not _serve_and_load(procs, args, refunds, token, sandbox_port, service_port, app_url, provider)
            except BaseException:
                for name in ("seed", "sandbox", "service"):  # the logs go with the work directory
                    if tail := procs.tail(name):
                        print(f"--- last lines of {name}.log ---\n{tail}", file=sys.stderr)
                raise
    except (Exception, KeyboardInterrupt) as error:
        failed = True
        print(f"benchmark failed: {type(error).__name__}: {error}", file=sys.stderr)
    summary = summarize(refunds) | {"provider": provider}
    print()
    print(markdown(run, summary))
    if not args.no_write and any(r.submitted_at for r in refunds):
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"http_load-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
        payload = {
            "benchmark": "http_load",
            "run": asdict(run),
            "environment": environment(),
            "summary": summary,
            "refunds": [asdict(r) | {"latency_s": r.latency_s} for r in refunds],
        }
        path.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {path}")
    return 0 if summary["completed"] == args.refunds and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
