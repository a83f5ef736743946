"""A rolling upgrade under load: the API and N workers on one Postgres replaced one by one while refunds flow.

What a Kubernetes rolling update with ``maxUnavailable: 0, maxSurge: 1`` does to each Deployment
(deploy/kubernetes), done with processes: start the new release's process, wait until it is ready (the API's
``/readyz``, a worker's metrics port, as the probes ask), take the old one out of the endpoints, wait the preStop
pause, SIGTERM it, and wait for it to exit within the grace period. Meanwhile clients submit refunds (small ones
pay at once, large ones park for a person) to whichever API is in the endpoints, retrying another on a refused
connection or a 5xx, and an approver approves every parked refund.

The new release pins the same ``REFUND_AGENT_APP_VERSION`` (docs/operations/upgrades.md), so what an old worker
leaves PENDING at its stop is recovered by the new ones; each new process has a new executor id, as a new pod does.

At the end it counts, from the API and the payment provider's ledger: refunds lost (submitted, never accepted or
unknown to the service), duplicated (paid more than once), stuck (not final after the approvals and a drain window),
and the longest pause a client saw between its first attempt and the accepted answer.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psycopg

from agent.ops.processes import child_env, free_port, http_ok, spawn, wait_for
from proving.chaos.plan import Limits, Plan, PlannedRefund
from proving.chaos.seeding import insert_orders, provider_charges
from steps import audit, clients
from steps.store import create_engine

FINAL = ("completed", "rejected", "failed", "cancelled")
APP_VERSION = "compat-1"
SMALL, LARGE, CAPTURED = Decimal("20.00"), Decimal("300.00"), Decimal("500.00")
MESSAGE = "It arrived broken; please refund it."  # no number in it: the amount asked is the request's own
MARKER = ".refund-agent-rolling-upgrade"
_DROP = ("REFUND_AGENT_CRASH_AT", "SLACK_WEBHOOK_URL", "REFUND_AGENT_MODEL", "REFUND_AGENT_MODEL_BASE_URL",
         "CARRIER_API_BASE", "RETURNS_API_BASE", "TICKETS_API_BASE", "REFUND_AGENT_EXECUTOR_ID")  # fmt: skip


@dataclass
class DrillConfig:
    postgres_url: str
    """A Postgres server (admin URL): the drill creates its two databases there and drops them after."""
    workers: int = 3
    apis: int = 2
    refunds: int = 60
    large_every: int = 3
    """Every this-many-th refund is large: it parks for a person, who approves it."""
    submit_interval_s: float = 0.1
    """Each client's pause between two submissions."""
    clients: int = 4
    """Clients submitting at once."""
    roll_after: int = 5
    """Refunds accepted before the first process is replaced."""
    pre_stop_s: float = 5.0
    """Out of the endpoints this long before SIGTERM (the Deployment's preStop sleep)."""
    shutdown_timeout_s: int = 20
    grace_s: float = 45.0
    """SIGKILL after this long past SIGTERM (terminationGracePeriodSeconds)."""
    drain_s: float = 120.0
    """After the last approval, how long refunds may take to become final before they count as stuck."""
    work_dir: Path = field(default_factory=lambda: Path(".refund-agent/rolling-upgrade"))
    out: Path | None = None
    keep: bool = False


@dataclass
class Process:
    name: str
    role: str
    release: int
    proc: subprocess.Popen[bytes]
    url: str
    """The API's base URL, or the worker's metrics URL."""
    started: float
    args: list[str]
    env: dict[str, str]
    ready_s: float | None = None
    restarts: int = 0
    exit_code: int | None = None
    drain_s: float | None = None
    killed: bool = False
    rss_kib: int | None = None


@dataclass
class Call:
    first_attempt: float
    answered: float | None = None
    attempts: int = 0
    status: int | None = None


class Drill:
    def __init__(self, config: DrillConfig, env: dict[str, str], say: Any) -> None:
        self.config, self.env, self.say = config, env, say
        self.logs = config.work_dir / "logs"
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.endpoints: list[str] = []
        self.processes: list[Process] = []
        self.submits: dict[str, Call] = {}
        self.approvals: dict[str, Call] = {}
        self.counts: Counter[str] = Counter()
        self.violations: list[str] = []
        self.submitting_done = threading.Event()
        self.stopping = threading.Event()
        self.api_token = env["REFUND_AGENT_API_TOKEN"]
        self.approver_key = ""
        self._next = 0
        self.peak_connections = 0

    def sample_connections(self, admin: str, databases: list[str]) -> None:
        """The most connections the service held on its two databases at once (sampled each second)."""
        with psycopg.connect(admin, autocommit=True) as conn:
            while not self.stopping.wait(1.0):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = ANY(%s)", (databases,)
                ).fetchone()
                self.peak_connections = max(self.peak_connections, int(row[0]) if row else 0)

    def at(self) -> str:
        return f"[{time.monotonic() - self.t0:6.1f}s]"

    # -- processes -------------------------------------------------------------------------------
    def launch(self, role: str, index: int, release: int) -> Process:
        name = f"{role}-r{release}-{index}"  # a new pod, a new name: the executor id is the pod's name
        port = free_port()
        env = {**self.env, "REFUND_AGENT_EXECUTOR_ID": name}
        if role == "api":
            args, url = ["serve", "--no-worker", "--port", str(port)], f"http://127.0.0.1:{port}"
        else:
            args, url = ["worker"], f"http://127.0.0.1:{port}"
            env["REFUND_AGENT_METRICS_PORT"] = str(port)
        proc = spawn(args, env=env, log=self.logs / f"{name}.log")
        process = Process(name, role, release, proc, url, time.monotonic(), args, env)
        with self.lock:
            self.processes.append(process)
        return process

    def wait_ready(self, process: Process) -> None:
        """Until the readiness probe answers; a process that exits first is started again, as its pod's container
        would be (same name, so the same executor id), after a pause that doubles each time."""
        probe = f"{process.url}/readyz" if process.role == "api" else f"{process.url}/healthz"
        backoff = 1.0

        def ready() -> bool:
            nonlocal backoff
            if process.proc.poll() is not None:
                process.restarts += 1
                self.counts[f"restarts_before_ready:{process.proc.returncode}"] += 1
                self.say(f"{self.at()} {process.name} exited {process.proc.returncode} before it was ready; restarting")
                time.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                process.proc = spawn(process.args, env=process.env, log=self.logs / f"{process.name}.log")
                return False
            return http_ok(probe)

        wait_for(ready, timeout=300, what=f"{process.name} to be ready", interval=0.2)
        process.ready_s = round(time.monotonic() - process.started, 2)
        if process.role == "api":
            with self.lock:
                self.endpoints.append(process.url)

    def retire(self, process: Process) -> None:
        """Out of the endpoints, the preStop pause, SIGTERM, and the grace period before a SIGKILL."""
        if process.role == "api":
            with self.lock:
                self.endpoints.remove(process.url)
            time.sleep(self.config.pre_stop_s)
        process.rss_kib = _rss_kib(process.proc.pid)
        signalled = time.monotonic()
        process.proc.send_signal(signal.SIGTERM)
        try:
            process.exit_code = process.proc.wait(self.config.grace_s)
        except subprocess.TimeoutExpired:
            process.killed = True
            process.proc.kill()
            process.exit_code = process.proc.wait()
        process.drain_s = round(time.monotonic() - signalled, 2)

    def roll(self, role: str, old: list[Process]) -> None:
        """One Deployment's rolling update: for each old process, a new one ready before the old one stops."""
        for i, previous in enumerate(old, start=1):
            if self.stopping.is_set():
                return
            new = self.launch(role, i, release=2)
            try:
                self.wait_ready(new)
            except TimeoutError as error:  # the rollout stalls here, as past progressDeadlineSeconds
                self.violation(f"rollout of {role} stalled: {error}")
                return
            time.sleep(0.5)  # minReadySeconds, scaled down
            self.retire(previous)
            self.say(f"{self.at()} {previous.name} -> {new.name}: new ready in {new.ready_s}s, old exited "
                     f"{previous.exit_code} after {previous.drain_s}s")  # fmt: skip

    # -- clients ---------------------------------------------------------------------------------
    def call(self, call: Call, method: str, path: str, headers: dict[str, str], **kwargs: Any) -> httpx.Response | None:
        """One client call, tried on the endpoints in turn until one answers below 500 (or the run stops)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not self.stopping.is_set():
            with self.lock:
                endpoints = list(self.endpoints)
                self._next += 1
                turn = self._next
            call.attempts += 1
            if endpoints:
                try:
                    url = endpoints[turn % len(endpoints)]
                    response = httpx.request(method, url + path, headers=headers, timeout=30, **kwargs)
                    if response.status_code < 500:
                        call.answered, call.status = time.monotonic(), response.status_code
                        return response
                    self.counts["client_5xx_retried"] += 1
                except httpx.TransportError:
                    self.counts["client_unreachable_retried"] += 1
            time.sleep(0.05)
        return None

    def submit_all(self, plan: Plan) -> None:
        """``clients`` submitters at once, each taking the next refund of the plan in turn."""
        queue = list(reversed(plan.refunds))

        def submitter() -> None:
            auth = {"Authorization": f"Bearer {self.api_token}"}
            while not self.stopping.wait(self.config.submit_interval_s):
                with self.lock:
                    if not queue:
                        return
                    p = queue.pop()
                    call = Call(time.monotonic())
                    self.submits[p.refund_id] = call
                body = {"order_id": p.order_id, "message": p.message, "amount": str(p.amount), "currency": p.currency}
                response = self.call(call, "POST", "/refunds", {**auth, "Idempotency-Key": p.refund_id}, json=body)
                if response is not None and response.status_code not in (200, 202):
                    self.violation(f"submitting {p.refund_id} answered {response.status_code}: {response.text[:200]}")

        threads = [threading.Thread(target=submitter, daemon=True) for _ in range(self.config.clients)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        finally:
            self.submitting_done.set()

    def approve_all(self, large: set[str]) -> None:
        """Approve each large refund once the service says it awaits approval."""
        auth = {"Authorization": f"Bearer {self.approver_key}"}
        waiting = set(large)
        while waiting and not self.stopping.is_set():
            for refund_id in sorted(waiting & self.submits.keys()):
                submit = self.submits[refund_id]
                if submit.status not in (200, 202):
                    continue
                status = self.call(Call(time.monotonic()), "GET", f"/refunds/{refund_id}", auth)
                record = status.json() if status is not None and status.status_code == 200 else {}
                asked = (record.get("approval") or {}).get("request")
                if record.get("status") in FINAL:
                    waiting.discard(refund_id)
                    self.violation(f"{refund_id} ended {record['status']} without an approval")
                if record.get("status") != "awaiting_approval" or not asked:
                    continue
                call = Call(time.monotonic())
                self.approvals[refund_id] = call
                body = {"decision": "approve", "amount": asked["amount"], "currency": asked["currency"]}
                answer = self.call(call, "POST", f"/refunds/{refund_id}/approval", auth, json=body)
                if answer is not None and answer.status_code != 200:
                    self.violation(f"approving {refund_id} answered {answer.status_code}: {answer.text[:200]}")
                waiting.discard(refund_id)
            if self.submitting_done.is_set() and not (waiting & {r for r, c in self.submits.items() if c.status}):
                return
            time.sleep(0.3)

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)
        self.say(f"{self.at()} VIOLATION {text}")

    # -- the end ---------------------------------------------------------------------------------
    def final_statuses(self, refund_ids: list[str]) -> dict[str, str | None]:
        """Each refund's status by the API (None: unknown to it), polled until all are final or the window ends."""
        auth = {"Authorization": f"Bearer {self.api_token}"}
        statuses: dict[str, str | None] = {}
        until = time.monotonic() + self.config.drain_s
        while True:
            for refund_id in refund_ids:
                if statuses.get(refund_id) in FINAL:
                    continue
                response = self.call(Call(time.monotonic()), "GET", f"/refunds/{refund_id}", auth)
                found = response is not None and response.status_code == 200
                statuses[refund_id] = response.json()["status"] if found and response is not None else None
            if all(s in FINAL for s in statuses.values()) or time.monotonic() > until:
                return statuses
            time.sleep(0.5)


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _plan(config: DrillConfig) -> Plan:
    refunds = tuple(
        PlannedRefund(
            refund_id=f"roll-{i:04d}",
            order_id=f"ord_roll_{i:04d}",
            customer_id=f"cus_roll_{i:04d}",  # one customer each: the serial-claimant rule stays out of it
            currency="USD",
            captured=CAPTURED,
            refunded=Decimal(0),
            order_status="paid",
            days_since_payment=5,
            amount=LARGE if i % config.large_every == 0 else SMALL,
            message=MESSAGE,
            decision="approve" if i % config.large_every == 0 else None,
            expected="completed",
            expected_amount=LARGE if i % config.large_every == 0 else SMALL,
        )
        for i in range(1, config.refunds + 1)
    )
    return Plan(seed=0, limits=Limits(), refunds=refunds, kills=(), pg_restart_after=None, payment_fault_seed=0)


def _admin(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _databases(admin: str, tag: str) -> tuple[str, str, list[str]]:
    admin = _admin(admin)
    names = [f"rolling_{tag}_sys", f"rolling_{tag}_app"]
    with psycopg.connect(admin, autocommit=True) as conn:
        for name in names:
            conn.execute(f'CREATE DATABASE "{name}"')  # names are ours: random hex
    server = admin.rsplit("/", 1)[0]
    return f"{server}/{names[0]}", f"{server}/{names[1]}", names


def _drop(admin: str, names: list[str]) -> None:
    with psycopg.connect(_admin(admin), autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _fresh_work_dir(path: Path) -> None:
    marker = path / MARKER
    if path.exists() and any(path.iterdir()) and not marker.exists():
        raise ValueError(f"{path} is not empty and not a rolling-upgrade work directory; pass another --dir")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    marker.write_text("work directory of the rolling-upgrade drill; emptied by the next run\n")


def _ledger(sandbox_url: str, key: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    after: str | None = None
    with httpx.Client(base_url=sandbox_url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        while True:
            params: dict[str, Any] = {"limit": 100, **({"starting_after": after} if after else {})}
            page = http.get("/v1/refunds", params=params).raise_for_status().json()
            found.extend(page["data"])
            if not page["has_more"]:
                return found
            after = page["data"][-1]["id"]


def _pauses(calls: dict[str, Call]) -> dict[str, Any]:
    waits = sorted(c.answered - c.first_attempt for c in calls.values() if c.answered is not None)
    if not waits:
        return {"count": 0}
    return {
        "count": len(waits),
        "longest_s": round(waits[-1], 3),
        "p99_s": round(waits[min(len(waits) - 1, int(len(waits) * 0.99))], 3),
        "median_s": round(waits[len(waits) // 2], 3),
        "retried": sum(1 for c in calls.values() if c.attempts > 1),
    }


def run_drill(config: DrillConfig, *, say: Any = print) -> dict[str, Any]:
    """Run the drill; return the report (also written to ``config.out`` when set)."""
    from agent import runtime
    from agent.settings import Settings

    if min(config.workers, config.apis, config.refunds, config.large_every, config.clients) < 1:
        raise ValueError("need at least one worker, API, refund and client")
    started = time.monotonic()
    _fresh_work_dir(config.work_dir)
    data_dir = config.work_dir.resolve() / "data"
    system_url, app_url, names = _databases(config.postgres_url, secrets.token_hex(4))
    sandbox_port, evidence_port = free_port(), free_port()
    sandbox_url = f"http://127.0.0.1:{sandbox_port}"
    payments_key = f"sk_test_{secrets.token_hex(12)}"
    env = child_env(
        {
            "REFUND_AGENT_DATA_DIR": str(data_dir),
            "DBOS_SYSTEM_DATABASE_URL": system_url,
            "DATABASE_URL": app_url,
            "REFUND_AGENT_API_TOKEN": secrets.token_hex(32),
            "APPROVAL_SIGNING_SECRET": secrets.token_hex(32),
            "REFUND_AGENT_AUDIT_KEY": secrets.token_hex(32),
            "STRIPE_WEBHOOK_SECRET": f"whsec_{secrets.token_hex(16)}",
            "PAYMENTS_API_BASE": sandbox_url,
            "PAYMENTS_API_KEY": payments_key,
            "EVIDENCE_SANDBOX_PORT": str(evidence_port),
            "REFUND_AGENT_APP_VERSION": APP_VERSION,
            "SHUTDOWN_TIMEOUT_SECONDS": str(config.shutdown_timeout_s),
            "APPROVAL_ESCALATE_AFTER_SECONDS": "86400",
            "APPROVAL_TIMEOUT_SECONDS": "259200",
            "PYTHONUNBUFFERED": "1",
        },
        drop=_DROP,
    )
    plan = _plan(config)
    large = {p.refund_id for p in plan.refunds if p.decision}
    drill = Drill(config, env, say)
    helpers: list[subprocess.Popen[bytes]] = []
    say(f"rolling upgrade: {config.apis} API + {config.workers} workers on one Postgres, {config.refunds} refunds "
        f"({len(large)} parked for approval); logs in {config.work_dir}")  # fmt: skip
    try:
        # The migration Job: once, before any process of the release.
        settings = Settings(refund_agent_data_dir=data_dir, dbos_system_database_url=system_url, database_url=app_url)
        runtime.migrate_databases(settings)
        engine = create_engine(app_url)
        insert_orders(engine, plan)
        audit.use_key(bytes.fromhex(env["REFUND_AGENT_AUDIT_KEY"]))
        _, drill.approver_key = clients.add_client(
            engine, name="rolling-approver", scopes=["approvals:decide", "refunds:read"], actor="drill"
        )
        engine.dispose()
        sandbox_db = f"sqlite:///{config.work_dir.resolve()}/sandbox.sqlite"
        sandbox_args = ["sandbox-payments", "--port", str(sandbox_port), "--database-url", sandbox_db]
        helpers.append(spawn(sandbox_args, env=env, log=drill.logs / "payments-sandbox.log"))
        helpers.append(
            spawn(["sandbox-evidence", "--port", str(evidence_port)], env=env, log=drill.logs / "evidence.log")
        )
        wait_for(lambda: http_ok(f"{sandbox_url}/_sandbox/healthz"), timeout=60, what="the payments sandbox")
        wait_for(lambda: http_ok(f"http://127.0.0.1:{evidence_port}/_sandbox/healthz"), timeout=60, what="evidence")
        httpx.post(
            f"{sandbox_url}/_sandbox/charges",
            json=provider_charges(plan),
            headers={"Authorization": f"Bearer {payments_key}"},
            timeout=60,
        ).raise_for_status()

        old = {
            "api": [drill.launch("api", i, release=1) for i in range(1, config.apis + 1)],
            "worker": [drill.launch("worker", i, release=1) for i in range(1, config.workers + 1)],
        }
        for process in [*old["api"], *old["worker"]]:
            drill.wait_ready(process)
        say(f"{drill.at()} release 1 ready: {', '.join(p.name for p in drill.processes)}")

        sampler = threading.Thread(
            target=drill.sample_connections, args=(_admin(config.postgres_url), names), name="sampler", daemon=True
        )
        sampler.start()
        clients_ = [
            threading.Thread(target=drill.submit_all, args=(plan,), name="submitter", daemon=True),
            threading.Thread(target=drill.approve_all, args=(large,), name="approver", daemon=True),
        ]
        for thread in clients_:
            thread.start()
        wait_for(
            lambda: sum(1 for c in list(drill.submits.values()) if c.status) >= min(config.roll_after, config.refunds),
            timeout=120,
            what="the first refunds to be accepted",
        )
        roll_started = time.monotonic()
        say(f"{drill.at()} rolling out release 2 (each Deployment one process at a time, maxUnavailable 0)")
        rollers = [threading.Thread(target=drill.roll, args=(role, old[role]), name=f"roll-{role}") for role in old]
        for thread in rollers:
            thread.start()
        for thread in rollers:
            thread.join()
        roll_ended = time.monotonic()
        roll_s = roll_ended - roll_started
        say(f"{drill.at()} rollout ended after {roll_s:.1f}s")
        for thread in clients_:
            thread.join(600)
        submitted = list(drill.submits)
        statuses = drill.final_statuses([r for r, c in drill.submits.items() if c.status in (200, 202)])
        ledger = _ledger(sandbox_url, payments_key)
    finally:
        drill.stopping.set()
        for process in drill.processes:
            if process.proc.poll() is None:
                process.proc.terminate()
        for process in drill.processes:
            if process.exit_code is None:
                try:
                    process.proc.wait(config.grace_s)
                except subprocess.TimeoutExpired:
                    process.proc.kill()
                    process.proc.wait()
        for helper in helpers:
            helper.terminate()
            helper.wait(10)
        if not config.keep:
            _drop(config.postgres_url, names)

    paid: Counter[str] = Counter(r["metadata"].get("idempotency_key", "") for r in ledger if r["status"] == "succeeded")
    orders = {p.refund_id: p.order_id for p in plan.refunds}
    never_accepted = [r for r in submitted if drill.submits[r].status not in (200, 202)]
    unknown = [r for r, s in statuses.items() if s is None]
    stuck = sorted(r for r, s in statuses.items() if s is not None and s not in FINAL)
    duplicated = sorted(r for r in submitted if paid[f"refund:{r}:{orders[r]}"] > 1)
    outcomes = Counter(s or "unknown" for s in statuses.values())
    unpaid = sorted(r for r, s in statuses.items() if s == "completed" and paid[f"refund:{r}:{orders[r]}"] == 0)
    stray = sorted(k for k in paid if not any(k == f"refund:{r}:{orders[r]}" for r in submitted))
    retired = [p for p in drill.processes if p.release == 1]
    report: dict[str, Any] = {
        "lost": len(never_accepted) + len(unknown),
        "duplicated": len(duplicated),
        "stuck": len(stuck),
        "longest_client_pause_s": _pauses(drill.submits).get("longest_s"),
        "submitted": len(submitted),
        "accepted": len(submitted) - len(never_accepted),
        "parked_and_approved": len(drill.approvals),
        "outcomes": dict(outcomes),
        "provider_refunds": sum(paid.values()),
        "completed_but_unpaid": len(unpaid),
        "provider_refunds_of_no_submitted_refund": len(stray),
        "submit_pauses": _pauses(drill.submits),
        "approval_pauses": _pauses(drill.approvals),
        "counts": dict(drill.counts),
        "peak_database_connections": drill.peak_connections,
        "rollout_s": round(roll_s, 1),
        "submitted_during_rollout": sum(
            1 for c in drill.submits.values() if roll_started <= c.first_attempt <= roll_ended
        ),
        "processes": [
            {
                "name": p.name,
                "ready_s": p.ready_s,
                "exit_code": p.exit_code,
                "drain_s": p.drain_s,
                "killed_after_grace": p.killed,
                "restarts_before_ready": p.restarts,
                "rss_kib_at_stop": p.rss_kib,
            }
            for p in drill.processes
        ],
        "retired_exit_codes": dict(Counter(str(p.exit_code) for p in retired)),
        "retired_killed_after_grace": sum(1 for p in retired if p.killed),
        "longest_drain_s": max((p.drain_s or 0.0 for p in retired), default=0.0),
        "violations": drill.violations,
        "examples": {"stuck": stuck[:10], "duplicated": duplicated[:10], "lost": (never_accepted + unknown)[:10]},
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items() if k != "postgres_url"},
        "duration_s": round(time.monotonic() - started, 1),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    report["ok"] = (
        report["lost"] == report["duplicated"] == report["stuck"] == 0
        and not unpaid
        and not stray
        and outcomes == Counter({"completed": len(submitted)})
        and report["retired_exit_codes"] == {"0": len(retired)}
        and not drill.violations
    )
    say(
        f"lost {report['lost']}, duplicated {report['duplicated']}, stuck {report['stuck']}; longest client pause "
        f"{report['longest_client_pause_s']}s; {report['provider_refunds']} provider refunds for {len(submitted)} "
        f"refunds; old processes exited {report['retired_exit_codes']} (longest drain {report['longest_drain_s']}s)"
        f"; {'OK' if report['ok'] else 'FAILED'}"
    )
    if config.out is not None:
        config.out.parent.mkdir(parents=True, exist_ok=True)
        config.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        say(f"report written to {config.out}")
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os

    p = argparse.ArgumentParser(prog="python -m proving.rolling_upgrade", description=__doc__.split("\n")[0])
    p.add_argument("--postgres-url", default=os.environ.get("REFUND_AGENT_TEST_POSTGRES_URL"), required=False)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--apis", type=int, default=2)
    p.add_argument("--refunds", type=int, default=400)
    p.add_argument("--large-every", type=int, default=3, help="every n-th refund parks for approval")
    p.add_argument("--clients", type=int, default=4, help="clients submitting at once")
    p.add_argument("--interval", type=float, default=0.1, help="each client's pause between submissions")
    p.add_argument("--pre-stop", type=float, default=5.0, help="seconds out of the endpoints before SIGTERM")
    p.add_argument("--shutdown-timeout", type=int, default=20, help="SHUTDOWN_TIMEOUT_SECONDS")
    p.add_argument("--grace", type=float, default=45.0, help="terminationGracePeriodSeconds")
    p.add_argument("--dir", default=".refund-agent/rolling-upgrade", help="work directory (logs, sandbox ledger)")
    p.add_argument("--out", help="write the JSON report here")
    p.add_argument("--keep", action="store_true", help="keep the drill's Postgres databases")
    args = p.parse_args(argv)
    if not args.postgres_url:
        p.error(
            "--postgres-url (or REFUND_AGENT_TEST_POSTGRES_URL): a Postgres server the drill may create databases on"
        )
    config = DrillConfig(
        postgres_url=args.postgres_url,
        workers=args.workers,
        apis=args.apis,
        refunds=args.refunds,
        large_every=args.large_every,
        submit_interval_s=args.interval,
        clients=args.clients,
        pre_stop_s=args.pre_stop,
        shutdown_timeout_s=args.shutdown_timeout,
        grace_s=args.grace,
        work_dir=Path(args.dir),
        out=Path(args.out) if args.out else None,
        keep=args.keep,
    )
    return 0 if run_drill(config)["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
