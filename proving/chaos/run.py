"""`refund-agent chaos`: a seeded soak with random kills and payment faults that ends in a counted verdict."""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import subprocess
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from dbos import DBOSClient, WorkflowStatus

from agent.approvals import family
from agent.domain import refund_id_of
from agent.ops.checkpoints import SERIALIZER
from agent.status import speaking
from proving.chaos.cluster import Cluster
from proving.chaos.driver import Driver
from proving.chaos.evidence import evidence_seed
from proving.chaos.plan import Plan, make_plan
from proving.chaos.seeding import insert_orders, provider_charges
from proving.chaos.verdict import TERMINAL, Observed, judge, render
from steps import audit, clients
from steps.lookups import TRACK_SHIPMENT_STEP
from steps.store import create_engine, orders, refunds

log = logging.getLogger(__name__)

MAX_REFUNDS, MAX_KILLS, MAX_SECONDS = 5000, 500, 6 * 3600
MARKER = ".refund-agent-chaos"
#: A workflow in one of these has work left (DELAYED timers are rows waiting for their time, not work).
_MOVING = ("PENDING", "ENQUEUED")
_WORKFLOW_END = {"ERROR": "failed", "MAX_RECOVERY_ATTEMPTS_EXCEEDED": "failed", "CANCELLED": "cancelled"}


@dataclass
class ChaosConfig:
    refunds: int = 40
    kills: int = 5
    workers: int = 2
    seed: int = 1
    postgres_url: str | None = None
    """A Postgres server (admin URL) to create the run's two fresh databases on; None: SQLite files."""
    fail_rate: float = 0.1
    drop_rate: float = 0.1
    latency_ms: int = 20
    pending_rate: float = 0.15
    """Share of provider refunds that stay ``pending`` and settle later (by webhook or re-read)."""
    pending_fail_share: float = 0.3
    """Of those, the share the provider then fails (``insufficient_funds``): nothing is paid."""
    settle_after_ms: int = 2000
    pg_restart: str | None = None
    """``VERSION/CLUSTER`` of the local cluster behind ``postgres_url``: restart it once, mid-run."""
    max_unanswered: int = 2
    """Approval requests deliberately left unanswered (they stay parked: rows, no running workflow)."""
    max_seconds: float = 900.0
    settle_seconds: float = 180.0
    work_dir: Path = field(default_factory=lambda: Path(".refund-agent/chaos"))
    out: Path | None = None
    keep: bool = False

    def check(self) -> None:
        if not (1 <= self.refunds <= MAX_REFUNDS and 0 <= self.kills <= MAX_KILLS and self.workers >= 1):
            raise ValueError(f"refunds must be 1-{MAX_REFUNDS}, kills 0-{MAX_KILLS}, workers at least 1")
        if not 0 < self.settle_seconds < self.max_seconds <= MAX_SECONDS:
            raise ValueError(f"need 0 < settle_seconds < max_seconds <= {MAX_SECONDS}")
        if self.pg_restart and not self.postgres_url:
            raise ValueError("--pg-restart needs --postgres-url pointing at that cluster")


def _databases(config: ChaosConfig, tag: str) -> tuple[str, str, list[str]]:
    if config.postgres_url is None:
        data = config.work_dir.resolve()
        return f"sqlite:///{data}/dbos_system.sqlite", f"sqlite:///{data}/refund_agent.sqlite", []
    admin = config.postgres_url.replace("postgresql+psycopg://", "postgresql://")
    names = [f"chaos_{tag}_sys", f"chaos_{tag}_app"]
    with psycopg.connect(admin, autocommit=True) as conn:
        for name in names:
            conn.execute(f'CREATE DATABASE "{name}"')  # names are ours: a seed and random hex
    server = admin.rsplit("/", 1)[0]
    return f"{server}/{names[0]}", f"{server}/{names[1]}", names


def _drop(config: ChaosConfig, names: list[str]) -> None:
    if names and config.postgres_url and not config.keep:
        admin = config.postgres_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _fresh_work_dir(path: Path) -> None:
    """Empty the work directory of an earlier run; never delete a directory this command did not make."""
    marker = path / MARKER
    if path.exists() and any(path.iterdir()) and not marker.exists():
        raise ValueError(f"{path} is not empty and not a chaos work directory; pass another --dir")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    marker.write_text("work directory of `refund-agent chaos`; emptied by the next run\n")


def restart_postgres(cluster: str, url: str) -> None:
    """``pg_ctlcluster VERSION NAME restart``, only for the cluster whose port the run's URL names."""
    version, _, name = cluster.partition("/")
    listing = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True).stdout
    ports = {(f[0], f[1]): f[2] for f in (line.split() for line in listing.splitlines()) if len(f) >= 3}
    port = str(sa.make_url(url).port or 5432)
    if ports.get((version, name)) != port:
        raise ValueError(f"cluster {cluster} does not serve port {port} of the run's database; not restarting it")
    subprocess.run(["pg_ctlcluster", version, name, "restart"], check=True, capture_output=True)


def _observe(plan: Plan, engine: sa.Engine, client: DBOSClient, accepted: set[str]) -> dict[str, Observed]:
    # Workflows first, then the book: a workflow that had ended had written its book rows, so a book read
    # afterwards is final for it (read the other way round, a refund finishing in between looks stuck).
    # A refund is several workflows (deciding run, decision, continuation, timers): while any of them is
    # queued or running the refund is still moving, whatever its row says.
    ids = [wid for p in plan.refunds for wid in family(p.refund_id)]
    workflows: dict[str, list[WorkflowStatus]] = defaultdict(list)
    for i in range(0, len(ids), 200):
        for w in client.list_workflows(workflow_ids=ids[i : i + 200], load_input=False, load_output=False):
            workflows[refund_id_of(w.workflow_id)].append(w)
    with engine.connect() as conn:
        rows = {r.refund_id: r.status for r in conn.execute(sa.select(refunds.c.refund_id, refunds.c.status))}
        books = {r.order_id: r.amount_refunded_minor for r in conn.execute(sa.select(orders))}
    observed = {}
    for p in plan.refunds:
        family_flows = workflows.get(p.refund_id, [])
        moving = [w.status for w in family_flows if w.status in _MOVING]
        carrier = speaking(family_flows, p.refund_id)
        flow = moving[0] if moving else (carrier.status if carrier else None)
        status = rows.get(p.refund_id)
        if flow in _WORKFLOW_END:
            status = _WORKFLOW_END[flow]
        observed[p.refund_id] = Observed(p.refund_id in accepted, status, flow, books.get(p.order_id))
    return observed


def _tracking_look_ups(plan: Plan, client: DBOSClient) -> dict[str, int]:
    """Recorded tracking look-up steps per investigating refund (its deciding workflow's steps; one listing each)."""
    found: dict[str, int] = {}
    for p in plan.refunds:
        if p.carrier_says is not None:
            steps = client.list_workflow_steps(p.refund_id, load_output=False)
            found[p.refund_id] = sum(1 for s in steps if s["function_name"] == TRACK_SHIPMENT_STEP)
    return found


def _settled(plan: Plan, observed: dict[str, Observed]) -> bool:
    for p in plan.refunds:
        seen = observed[p.refund_id]
        if not seen.accepted:
            continue
        parked_as_planned = p.expected == "awaiting_approval" and seen.status == "awaiting_approval"
        if parked_as_planned:
            continue
        if seen.workflow in _MOVING or seen.workflow is None or seen.status not in TERMINAL:
            return False
    return True


def run_chaos(config: ChaosConfig, *, say: Any = print) -> dict[str, Any]:
    """Run the soak and return the verdict (also written to ``config.out`` when set)."""
    from agent import runtime
    from agent.settings import Settings

    config.check()
    t0 = time.monotonic()
    plan = make_plan(
        seed=config.seed,
        refunds=config.refunds,
        kills=config.kills,
        workers=config.workers,
        pg_restart=bool(config.pg_restart),
        max_unanswered=config.max_unanswered,
    )
    _fresh_work_dir(config.work_dir)
    system_url, app_url, names = _databases(config, f"{config.seed}_{secrets.token_hex(3)}")
    backend = "postgres" if config.postgres_url else "sqlite"
    say(f"chaos: seed {config.seed}, plan {plan.fingerprint()}, {config.refunds} refunds, {len(plan.kills)} kills, "
        f"{config.workers} workers + serve on {backend}; logs in {config.work_dir}")  # fmt: skip
    limits = plan.limits
    env = {
        "REFUND_AGENT_DATA_DIR": str(config.work_dir.resolve()),
        "DBOS_SYSTEM_DATABASE_URL": system_url,
        "DATABASE_URL": app_url,
        "REFUND_AGENT_API_TOKEN": secrets.token_urlsafe(24),
        "APPROVAL_SIGNING_SECRET": secrets.token_urlsafe(24),
        "PAYMENTS_API_KEY": f"sk_test_{secrets.token_hex(12)}",
        "AUTO_APPROVE_LIMIT": str(limits.auto_approve),
        "ABSOLUTE_REFUND_CAP": str(limits.absolute_cap),
        "REFUND_WINDOW_DAYS": str(limits.window_days),
        "AUTO_APPROVE_LIMITS": "{}",
        "ABSOLUTE_REFUND_CAPS": "{}",
        "APPROVAL_ESCALATE_AFTER_SECONDS": "86400",
        "APPROVAL_TIMEOUT_SECONDS": "259200",
        "QUEUE_POLLING_INTERVAL_SECONDS": "0.2",
        "NOTIFICATION_POLLING_INTERVAL_SECONDS": "0.2",
        "STRIPE_WEBHOOK_SECRET": f"whsec_{secrets.token_hex(16)}",
        "PAYMENT_RECHECK_SECONDS": "3",
    }
    settings = Settings(
        refund_agent_data_dir=config.work_dir, dbos_system_database_url=system_url, database_url=app_url
    )
    runtime.migrate_databases(settings)
    engine = create_engine(app_url)
    insert_orders(engine, plan)
    audit.use_key(settings.audit_key())  # the approvers' client is added to the audit chain, under the cluster's key
    _, approver_key = clients.add_client(engine, name="chaos-approver", scopes=["approvals:decide"], actor="chaos")
    engine.dispose()
    cluster = Cluster(
        env=env,
        workers=config.workers,
        logs=config.work_dir / "logs",
        sandbox_db=f"sqlite:///{config.work_dir.resolve()}/sandbox.sqlite",
    )
    driver: Driver | None = None
    try:
        cluster.start()
        cluster.add_charges(provider_charges(plan))
        cluster.load_evidence(evidence_seed(plan.refunds))
        cluster.send_webhooks(env["STRIPE_WEBHOOK_SECRET"])
        cluster.set_payment_faults(
            fail_rate=config.fail_rate,
            drop_response_rate=config.drop_rate,
            latency_ms=config.latency_ms,
            pending_rate=config.pending_rate,
            pending_fail_share=config.pending_fail_share,
            settle_after_ms=config.settle_after_ms,
            failure_reason="insufficient_funds",
            seed=plan.payment_fault_seed,
        )
        faults_until = t0 + config.max_seconds - config.settle_seconds
        restart = (lambda: restart_postgres(config.pg_restart, system_url)) if config.pg_restart else None  # type: ignore[arg-type]
        driver = Driver(
            plan,
            cluster,
            api_token=env["REFUND_AGENT_API_TOKEN"],
            approver_key=approver_key,
            deadline=faults_until,
            restart_db=restart,
            say=say,
        )
        driver.run()
        cluster.set_payment_faults()  # faults stop here; every refund now has settle_seconds to finish
        cluster.disarm_all()
        stopped = time.monotonic()
        say(f"[{stopped - t0:7.1f}s] faults stopped; waiting up to {config.settle_seconds:.0f}s for refunds to settle")
        settle_until = min(stopped + config.settle_seconds, t0 + config.max_seconds)
        engine, client = create_engine(app_url), DBOSClient(system_database_url=system_url, serializer=SERIALIZER)
        while True:
            try:
                observed = _observe(plan, engine, client, driver.accepted)
            except sa.exc.OperationalError:
                observed = {}
            if (observed and _settled(plan, observed)) or time.monotonic() > settle_until:
                break
            time.sleep(1.0)
        settle_s = time.monotonic() - stopped
        ledger = cluster.ledger()
        stats = cluster.sandbox_stats()
        carrier_requests = cluster.evidence_stats()["carrier"]
        look_ups = _tracking_look_ups(plan, client)
        with engine.connect() as conn:
            chain = audit.verify(conn, key=settings.audit_key())
        client.destroy()
        engine.dispose()
        faults = {
            **cluster.counts,
            "payment_faults_injected": stats["faults_injected"],
            "provider_create_requests": stats["create_requests"],
            "provider_replays": stats["replays"],
            "provider_refunds_failed_late": stats["refunds_failed"],
            "provider_settlement_webhooks": stats["events_delivered"],
            **driver.counts,
        }
        verdict = judge(
            plan,
            observed,
            ledger,
            audit={"ok": chain.ok, "entries": chain.entries, "first_broken_seq": chain.first_broken_seq},
            faults=faults,
            extra_violations=driver.violations,
            look_ups=look_ups,
        )
        verdict["investigating"]["carrier_requests"] = carrier_requests
    finally:
        if driver is not None:
            driver.stop()
        cluster.close()
        _drop(config, names)
    verdict.update(
        backend=backend,
        duration_s=round(time.monotonic() - t0, 1),
        settle_s=round(settle_s, 1),
        finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
        config={k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items() if k != "postgres_url"},
    )
    say(render(verdict))
    if config.out is not None:
        config.out.parent.mkdir(parents=True, exist_ok=True)
        config.out.write_text(json.dumps(verdict, indent=2, sort_keys=True) + "\n")
        say(f"verdict written to {config.out}")
    return verdict
