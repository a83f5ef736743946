"""What every benchmark section shares: databases, the sandbox process, the runtime, counters, stats."""

from __future__ import annotations

import asyncio
import os
import resource
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import sqlalchemy as sa
from dbos import DBOSClient, DBOSConfig
from psycopg import sql

from agent import runtime
from agent.domain import RefundRequest
from agent.ops.processes import free_port, http_ok, stop, wait_for
from agent.settings import Settings
from benchmarks import http_load
from benchmarks.identities import BENCH_REQUESTER
from benchmarks.limits import SERIAL_RULE_OFF
from steps import audit
from steps.refunds import register_request
from steps.seed import seed
from steps.store import app_db, close_app_database, customers, open_app_database, orders

T = TypeVar("T")
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
RESULTS = Path(__file__).resolve().parent / "results"
BACKENDS = ("postgres", "sqlite")
#: Orders the benchmark refunds against: far more captured than all runs together refund.
BENCH_ORDERS = [f"ord_bench_{i:02d}" for i in range(16)]
AUTO_AMOUNT = Decimal("0.01")  # paid at once (auto-approve limit 100.00)
APPROVAL_AMOUNT = Decimal("150.00")  # above the auto-approve limit: waits for a person
#: Orders whose parcel the carrier shows delivered with a photo at the door (the evidence sandbox ``evidence_sandbox``
#: starts): a claim that it never arrived asks the customer to confirm (question ``delivery``).
SHIPPED_ORDERS = [f"ord_bench_ship_{i:02d}" for i in range(16)]
SHIPPED_DAYS_AGO = 5  # paid then; delivered two days later


def admin_url(server: str) -> str:
    return server.replace("postgresql+psycopg://", "postgresql://")


def pg_url(server: str, name: str) -> str:
    return admin_url(server).rsplit("/", 1)[0] + f"/{name}"


@dataclass
class Databases:
    """The databases of one backend: DBOS system, application, and LangGraph's checkpoints."""

    backend: str
    system_url: str
    app_url: str
    langgraph_url: str
    pg_names: list[str] = field(default_factory=list)

    @property
    def sqlite_dir(self) -> Path | None:
        if self.backend != "sqlite":
            return None
        return Path(self.system_url.removeprefix("sqlite:///")).parent


@contextmanager
def databases(backend: str, server: str, workdir: Path) -> Iterator[Databases]:
    """Fresh databases for one backend, dropped (Postgres) or deleted with ``workdir`` afterwards."""
    if backend == "sqlite":
        d = workdir / f"sqlite-{secrets.token_hex(3)}"
        d.mkdir(parents=True)
        yield Databases(
            backend, f"sqlite:///{d}/dbos_system.sqlite", f"sqlite:///{d}/app.sqlite", f"{d}/langgraph.sqlite"
        )
        return
    prefix = f"ra_bench_{secrets.token_hex(3)}"
    names = [f"{prefix}_sys", f"{prefix}_app", f"{prefix}_lg"]
    created: list[str] = []
    try:
        with psycopg.connect(admin_url(server), autocommit=True) as conn:
            for name in names:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                created.append(name)
        system, app, langgraph = (pg_url(server, n) for n in names)
        yield Databases(backend, system, app, langgraph, pg_names=names)
    finally:
        drop_pg(server, created)


def drop_pg(server: str, names: Sequence[str]) -> None:
    with psycopg.connect(admin_url(server), autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def sandbox(workdir: Path) -> Iterator[str]:
    """The payments sandbox as its own process (its CPU is not the client's), SQLite ledger."""
    port = free_port()
    log = (workdir / f"sandbox-{port}.log").open("ab")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "agent.cli", "sandbox-payments", "--port", str(port)),
            *("--database-url", f"sqlite:///{workdir}/sandbox-{port}.sqlite"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "REFUND_AGENT_DATA_DIR": str(workdir / "sandbox-data")},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_ok(f"{base}/_sandbox/healthz"), timeout=60, what="the payments sandbox")
        add_bench_charges(base)
        yield base
    finally:
        stop(proc, 20)
        log.close()


def add_bench_charges(sandbox_url: str) -> None:
    """The benchmark orders' charges at the sandbox (it starts with the demo orders' only)."""
    new = [
        {"id": f"ch_{order_id}", "amount": 100_000_000 - 1, "currency": "usd"}
        for order_id in [*BENCH_ORDERS, *SHIPPED_ORDERS]
    ]
    httpx.post(
        f"{sandbox_url}/_sandbox/charges", json=new, headers={"Authorization": "Bearer sk_test_bench"}, timeout=30
    ).raise_for_status()


def tracking_code(order_id: str) -> str:
    return f"9400100000{order_id.removeprefix('ord_bench_ship_'):0>12}"


def _delivered_with_photo(order_id: str) -> dict[str, Any]:
    """The carrier's tracker of a shipped benchmark order, in the evidence sandbox's seed format."""

    def event(days_ago: float, status: str, message: str) -> dict[str, Any]:
        return {"at": {"days": -days_ago}, "status": status, "message": message, "city": "Chicago", "country": "US"}

    paid = SHIPPED_DAYS_AGO
    return {
        "carrier": "USPS",
        "tracking_code": tracking_code(order_id),
        "status": "delivered",
        "status_detail": "arrived_at_destination",
        "photo": True,
        "events": [
            event(paid - 0.1, "pre_transit", "Shipping label created"),
            event(paid - 0.6, "in_transit", "Accepted at origin facility"),
            event(paid - 1.8, "out_for_delivery", "Out for delivery"),
            event(paid - 2.0, "delivered", "Delivered"),
        ],
    }


@contextmanager
def evidence_sandbox(workdir: Path) -> Iterator[int]:
    """The evidence sandbox (carrier, returns, helpdesk) as its own process, serving the shipped benchmark orders'
    trackers; its port, for ``EVIDENCE_SANDBOX_PORT`` (a worker with no evidence base URL set reads it there)."""
    port = free_port()
    log = (workdir / f"evidence-{port}.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.cli", "sandbox-evidence", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "REFUND_AGENT_DATA_DIR": str(workdir / "sandbox-data")},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_ok(f"{base}/_sandbox/healthz"), timeout=60, what="the evidence sandbox")
        seed = {"trackers": [_delivered_with_photo(order_id) for order_id in SHIPPED_ORDERS]}
        admin = {"Authorization": "Bearer bench-admin"}  # the local sandbox takes any non-empty credential
        httpx.put(f"{base}/_sandbox/data", json=seed, headers=admin, timeout=30).raise_for_status()
        yield port
    finally:
        stop(proc, 20)
        log.close()


def sandbox_ledger(workdir: Path, sandbox_url: str) -> Path:
    """The SQLite ledger of the sandbox ``sandbox`` started at ``sandbox_url``."""
    return workdir / f"sandbox-{sandbox_url.rsplit(':', 1)[1]}.sqlite"


def settings_for(dbs: Databases, sandbox_url: str, workdir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "refund_agent_data_dir": workdir / "data",
        "dbos_system_database_url": dbs.system_url,
        "database_url": dbs.app_url,
        "payments_api_base": sandbox_url,
        "refund_agent_executor_id": "bench-executor",
        **SERIAL_RULE_OFF,
    }
    values.update(overrides)
    return Settings(**values)


@contextmanager
def submitting(data_dir: Path, system_url: str, app_url: str) -> Iterator[tuple[Settings, DBOSClient]]:
    """What submits refunds the product's way (``POST /refunds`` calls ``submit_refund``) from a benchmark's own
    process: the app database opened as the API opens it, the audit chain under the workers' key, a DBOS client."""
    settings = Settings(refund_agent_data_dir=data_dir, dbos_system_database_url=system_url, database_url=app_url)
    open_app_database(settings.database.app_database_url)
    audit.use_key(settings.audit_key())  # submitting appends to the audit chain, under the workers' key
    client = runtime.client(settings)
    try:
        yield settings, client
    finally:
        client.destroy()
        close_app_database()


_DROP = object()


def drop_key() -> object:
    """A config override that removes the key, so that DBOS's own default applies."""
    return _DROP


def _with_overrides(config: DBOSConfig, overrides: Mapping[str, Any]) -> DBOSConfig:
    for key, value in overrides.items():
        if value is _DROP:
            config.pop(key, None)  # type: ignore[misc]
        else:
            config[key] = value  # type: ignore[literal-required]
    return config


@contextmanager
def started(settings: Settings, config_overrides: Mapping[str, Any] | None = None) -> Iterator[runtime.Runtime]:
    """The product runtime (DBOS launched in this process), demo orders and benchmark orders seeded.

    ``config_overrides`` change the DBOSConfig the runtime builds (tuning runs only)."""
    product_config = runtime.dbos_config
    overrides = dict(config_overrides or {})
    runtime.dbos_config = lambda s: _with_overrides(product_config(s), overrides)  # type: ignore[assignment]
    try:
        rt = runtime.start(settings)
    finally:
        runtime.dbos_config = product_config
    try:
        seed_orders()
        yield rt
    finally:
        runtime.stop()


def seed_orders() -> None:
    """The demo orders and the benchmark's own, once (an order already there is left alone)."""
    engine = app_db().engine
    seed(engine)
    _seed_bench_orders(engine)


def _seed_bench_orders(engine: sa.Engine) -> None:
    now = datetime.now(UTC)
    with engine.begin() as conn:
        for order_id in [*BENCH_ORDERS, *SHIPPED_ORDERS]:
            if conn.execute(sa.select(orders.c.order_id).where(orders.c.order_id == order_id)).first():
                continue
            if not conn.execute(sa.select(customers.c.customer_id).where(customers.c.customer_id == "cus_ada")).first():
                raise RuntimeError("demo customers are missing")
            shipped = order_id in SHIPPED_ORDERS
            conn.execute(
                orders.insert().values(
                    order_id=order_id,
                    customer_id="cus_ada",
                    currency="USD",
                    amount_captured_minor=100_000_000,
                    amount_refunded_minor=0,
                    status="paid",
                    paid_at=now - timedelta(days=SHIPPED_DAYS_AGO) if shipped else now,
                    charge_id=f"ch_{order_id}",
                    items=["Benchmark item"],
                    notes="",
                    carrier="USPS" if shipped else "",
                    tracking_code=tracking_code(order_id) if shipped else "",
                )
            )


_ids = Counter[str]()


def new_refund(tag: str, amount: Decimal = AUTO_AMOUNT) -> tuple[str, RefundRequest]:
    """A registered refund request (its refunds row exists, as after POST /refunds), not yet started."""
    _ids[tag] += 1
    n = _ids[tag]
    refund_id = f"bench-{tag}-{n}-{secrets.token_hex(3)}"
    order_id = BENCH_ORDERS[n % len(BENCH_ORDERS)]
    request = RefundRequest(order_id=order_id, message="Please refund this.", amount=amount, currency="USD")
    register_request(
        refund_id=refund_id,
        order_id=order_id,
        request_hash="bench",
        currency="USD",
        requested=amount,
        requester=BENCH_REQUESTER,
    )
    return refund_id, request


# ------------------------------------------------------------------------------------------- counters


def cpu_seconds() -> float:
    """CPU time (user + system) of this process, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pg_commits(dbs: Databases, server: str) -> int:
    """Committed transactions in this backend's own Postgres databases (read-only ones included)."""
    with psycopg.connect(admin_url(server), autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(xact_commit), 0) FROM pg_stat_database WHERE datname = ANY(%s)", (dbs.pg_names,)
        ).fetchone()
    return int(row[0]) if row else 0


def pg_wal_lsn(server: str) -> int:
    """The cluster's WAL position in bytes: shared with every other user of this server."""
    with psycopg.connect(admin_url(server), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


class SqliteCommits:
    """Counts COMMITs issued on SQLite connections of this process (write transactions)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def trace(self, statement: str) -> None:
        if statement.lstrip()[:6].upper() == "COMMIT":
            with self._lock:
                self.count += 1

    def attach(self, conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(self.trace)


sqlite_commits = SqliteCommits()


@sa.event.listens_for(sa.engine.Engine, "connect")
def _trace_sqlite(dbapi_conn: Any, _record: Any) -> None:
    if isinstance(dbapi_conn, sqlite3.Connection):
        sqlite_commits.attach(dbapi_conn)


def settle_pg_stats() -> None:
    """Backends report their counters to pg_stat_database at most every ~1 s, idle ones after up to
    10 s; wait that out before reading commit counts."""
    time.sleep(11.0)


# ---------------------------------------------------------------------------------------------- stats


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def os_load() -> list[float]:
    """The machine's load averages (1, 5, 15 minutes): it is shared, so every run records them."""
    return [round(x, 2) for x in os.getloadavg()]


def environment() -> dict[str, Any]:
    env = http_load.environment()
    env["load_average"] = env.pop("load_average_at_end")
    return env


def utc_stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


@contextmanager
def workdir(keep: bool = False) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ra-bench-"))
    try:
        yield path
    finally:
        if not keep:
            import shutil

            shutil.rmtree(path, ignore_errors=True)


#: Threads this harness owns (DBOS replaces the event loop's default executor with its own, and shuts
#: it down on destroy): DBOS launch/destroy and LangGraph's synchronous graphs run here.
_pool = ThreadPoolExecutor(max_workers=80, thread_name_prefix="bench")


async def off_loop(func: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_pool, func, *args)


def timed(func: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    func()
    return time.perf_counter() - t0
