"""Fixtures: real databases (SQLite files and fresh Postgres databases), a real sandbox, real DBOS."""

from __future__ import annotations

import os
import secrets
import sqlite3
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pydantic_ai.models
import pytest
import sqlalchemy as sa

from agent import runtime
from agent.settings import Settings
from sandbox.evidence import RiskSeed
from sandbox.ledger_records import Charge
from sandbox.payments import create_app
from steps import audit
from steps.seed import demo_charges, seed
from steps.seed_evidence import demo_risk
from steps.store import app_db, create_engine
from tests import web, zygote
from tests.evidence_server import EvidenceServer
from tests.servers import ThreadedServer

pydantic_ai.models.ALLOW_MODEL_REQUESTS = False

#: Fixtures kept beside what they make: the crash tests' cluster (tests/crash_cluster.py).
pytest_plugins = ["tests.crash_cluster"]

#: Postgres server for the Postgres half of the suite; "off" runs SQLite only (never silently skipped).
PG_SERVER = os.environ.get("REFUND_AGENT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = ["sqlite"] + ([] if PG_SERVER.lower() in ("", "off") else ["postgres"])
API_KEY = "sk_test_suite"
#: How often a test's DBOS looks for queued work. Each look is two queries per queue, so an idle process at 0.1 s
#: spends about 8% of a core (and the server its share) on looking; at 0.2 s about 4%, and the suite keeps
#: several alive on 2 cores. A queued refund starts at most this much later.
QUEUE_POLL_SECONDS = 0.2


#: The files that take longest, longest first (per-file times of a full run). With ``--no-loadscope-reorder`` (in
#: pyproject.toml) xdist hands files out in collection order, so these start first and no long file starts last;
#: every other file follows in its usual order.
LONGEST_FIRST = [
    "test_crash_matrix.py",
    "test_crash_settling.py",
    "test_docs.py",
    "test_benchmarks_smoke.py",
    "test_http.py",
    "test_scale.py",
    "test_evals.py",
    "test_console.py",
    "test_crash_questions.py",
    "test_upgrade.py",
    "test_identities.py",
    "test_workflow.py",
    "test_dbos_cli.py",
    "test_console_oidc.py",
    "test_customer_questions.py",
    "test_tools.py",
    "test_openapi_fuzz.py",
    "test_provider_events.py",
    "test_console_browser.py",
    "test_outcome_messages.py",
    "test_console_sessions.py",
    "test_obeying_model.py",
    "test_investigation.py",
    "test_console_lead.py",
    "test_model_outages.py",
    "test_chaos.py",
    "test_question_leads.py",
    "test_docker.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept


def _pg_admin_url() -> str:
    return PG_SERVER.replace("postgresql+psycopg://", "postgresql://")


@dataclass
class Databases:
    system_url: str
    app_url: str
    cleanup: list[str]


def make_databases(backend: str, tmp_path: Path, *, migrated: bool = True) -> Databases:
    """Fresh databases for one test. ``migrated``: copies of this process's migrated templates (DBOS's tables and
    the application schema at head), so a test pays a file copy or a ``CREATE DATABASE ... TEMPLATE`` instead of
    every migration; without it, empty databases (for tests of migrating itself)."""
    if backend == "sqlite":  # the embedded default's layout, so the dbos CLI finds it via dbos-config.yaml
        (tmp_path / ".refund-agent").mkdir(exist_ok=True)
        system = tmp_path / ".refund-agent" / "dbos_system.sqlite"
        app = tmp_path / ".refund-agent" / "refund_agent.sqlite"
        if migrated:
            template = _template("sqlite")
            _copy_sqlite(template.system_url, system)
            _copy_sqlite(template.app_url, app)
        return Databases(f"sqlite:///{system}", f"sqlite:///{app}", [])
    return _postgres.take() if migrated else _create_postgres(None)


def _create_postgres(template: Databases | None) -> Databases:
    base = f"ra_test_{secrets.token_hex(4)}"
    names = [f"{base}_sys", f"{base}_app"]
    sources = template.cleanup if template is not None else [None, None]
    with psycopg.connect(_pg_admin_url(), autocommit=True) as conn:
        for name, source in zip(names, sources, strict=True):
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{source}"' if source else ""))
    server = _pg_admin_url().rsplit("/", 1)[0]
    return Databases(f"{server}/{names[0]}", f"{server}/{names[1]}", names)


#: This process's migrated template databases by backend, made on first use and dropped when the session ends.
_templates: dict[str, Databases] = {}


def _template(backend: str) -> Databases:
    if backend not in _templates:
        root = Path(tempfile.mkdtemp(prefix="ra-template-"))
        dbs = make_databases(backend, root, migrated=False)
        runtime.migrate_databases(
            Settings(
                refund_agent_data_dir=root / "data",
                dbos_system_database_url=dbs.system_url,
                database_url=dbs.app_url,
                payments_api_base="http://127.0.0.1:9",
            )
        )
        if dbs.cleanup:  # CREATE DATABASE ... TEMPLATE needs the template to have no sessions
            with psycopg.connect(_pg_admin_url(), autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ANY(%s)", (dbs.cleanup,)
                )
        _templates[backend] = dbs
    return _templates[backend]


def _copy_sqlite(url: str, target: Path) -> None:
    """A consistent copy of a SQLite database (its WAL included) through SQLite's backup API."""
    source = sqlite3.connect(url.removeprefix("sqlite:///"))
    copy = sqlite3.connect(target)
    try:
        source.backup(copy)
    finally:
        copy.close()
        source.close()


class _PostgresPool:
    """Postgres databases for tests, made from the template one test ahead and dropped behind the tests, each in a
    thread of its own: a test waits for neither (both cost about a second on a busy server)."""

    def __init__(self) -> None:
        self.making = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-make")
        self.dropping = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-drop")
        self.next: Future[Databases] | None = None

    def take(self) -> Databases:
        template = _template("postgres")
        ready = self.next.result() if self.next is not None else _create_postgres(template)
        self.next = self.making.submit(_create_postgres, template)
        return ready

    def drop(self, dbs: Databases) -> None:
        self.dropping.submit(_drop_now, dbs)

    def close(self) -> None:
        if self.next is not None:
            self.drop(self.next.result())
            self.next = None
        self.making.shutdown(wait=True)
        self.dropping.shutdown(wait=True)


_postgres = _PostgresPool()


@pytest.fixture(scope="session", autouse=True)
def _warm_launcher() -> Iterator[None]:
    """``refund-agent`` commands the tests start are forked from a process that has imported them (tests/zygote.py)."""
    zygote.install()
    yield
    zygote.close()


@pytest.fixture(scope="session", autouse=True)
def _drop_templates() -> Iterator[None]:
    yield
    _postgres.close()
    for dbs in _templates.values():
        _drop_now(dbs)
    _templates.clear()


def drop_databases(dbs: Databases) -> None:
    """Drop a test's Postgres databases (behind the tests, in a thread; before the session ends)."""
    if dbs.cleanup:
        _postgres.drop(dbs)


def _drop_now(dbs: Databases) -> None:
    if not dbs.cleanup:
        return
    with psycopg.connect(_pg_admin_url(), autocommit=True) as conn:
        for name in dbs.cleanup:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class SandboxServer(ThreadedServer):
    """The payments sandbox under uvicorn in a thread: it outlives any worker process a test kills."""

    def __init__(self, database_url: str, **kwargs: Any) -> None:
        kwargs.setdefault("charges", [Charge(**c) for c in demo_charges()])  # what the seeded orders were paid with
        kwargs.setdefault("risk_seed", RiskSeed.model_validate(demo_risk()))  # their fraud warnings and disputes
        super().__init__(create_app(database_url=database_url, api_key=API_KEY, **kwargs))
        self.start()
        auth = {"Authorization": f"Bearer {API_KEY}"}
        self.http = web.client(base_url=self.base_url, headers=auth)

    def _get(self, path: str, **params: Any) -> Any:
        response = self.http.get(path, params=params)
        response.raise_for_status()
        return response.json()

    def refunds(self, charge: str | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": 100}
        if charge:
            params["charge"] = charge
        return list(self._get("/v1/refunds", **params)["data"])

    def stats(self) -> dict[str, int]:
        return dict(self._get("/_sandbox/stats"))

    def add_charges(self, *charges: dict[str, Any]) -> None:
        self.http.post("/_sandbox/charges", json=list(charges)).raise_for_status()

    def set_faults(self, **faults: Any) -> None:
        self.http.put("/_sandbox/faults", json=faults).raise_for_status()

    def close(self) -> None:
        self.http.close()
        self.stop()


@dataclass
class Env:
    """Everything one test's service needs: databases, data dir, sandbox, and settings to share."""

    backend: str
    dbs: Databases
    data_dir: Path
    sandbox: SandboxServer
    evidence: EvidenceServer | None = None
    """The evidence services (tracking, returns, tickets); None: settings leave them at their defaults."""

    def settings(self, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "refund_agent_data_dir": self.data_dir,
            "dbos_system_database_url": self.dbs.system_url,
            "database_url": self.dbs.app_url,
            "payments_api_base": self.sandbox.base_url,
            "payments_api_key": API_KEY,
            "refund_agent_executor_id": "test-executor",
            "queue_polling_interval_seconds": QUEUE_POLL_SECONDS,
            "notification_polling_interval_seconds": 0.1,
        }
        if self.evidence is not None:
            values.update(self.evidence.settings())
        values.update(overrides)
        return Settings(**values)

    def env_vars(self, **overrides: str) -> dict[str, str]:
        """The same configuration as environment variables, for worker subprocesses."""
        env = {
            "REFUND_AGENT_DATA_DIR": str(self.data_dir),
            "DBOS_SYSTEM_DATABASE_URL": self.dbs.system_url,
            "DATABASE_URL": self.dbs.app_url,
            "PAYMENTS_API_BASE": self.sandbox.base_url,
            "PAYMENTS_API_KEY": API_KEY,
            "REFUND_AGENT_EXECUTOR_ID": "test-worker",
            "QUEUE_POLLING_INTERVAL_SECONDS": str(QUEUE_POLL_SECONDS),
            "NOTIFICATION_POLLING_INTERVAL_SECONDS": "0.1",
            # A stopped test process has nothing to drain (a test of draining sets its own); DBOS waits at least
            # a second for in-flight work whenever this is above 0.
            "SHUTDOWN_TIMEOUT_SECONDS": "0",
        }
        if self.evidence is not None:
            env.update(self.evidence.env_vars())
        env.update(overrides)
        return env

    def app_engine(self) -> sa.Engine:
        return create_engine(self.dbs.app_url)

    def cut_app_database_sessions(self) -> int:
        """End every server session on the application database (Postgres), as a restart or failover does."""
        name = self.dbs.app_url.rsplit("/", 1)[1]
        with psycopg.connect(PG_SERVER.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
            cut = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            ).fetchall()
        return len(cut)


@pytest.fixture(scope="session")
def evidence_sandbox() -> Iterator[EvidenceServer]:
    """One evidence sandbox per test session with the demo's evidence: it is read-only, so tests share it (a test
    that sets faults or loads other data starts its own ``EvidenceServer``)."""
    server = EvidenceServer()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def _fresh_env(backend: str, root: Path, evidence: EvidenceServer) -> Iterator[Env]:
    """Databases, a payments sandbox and a data directory under ``root``; this process appends and verifies the
    audit chain with the key its workers generate into that shared data directory."""
    dbs = make_databases(backend, root)
    sandbox = SandboxServer(f"sqlite:///{root}/sandbox.sqlite")
    env = Env(backend, dbs, root / "data", sandbox, evidence)
    audit.use_key(env.settings().audit_key())
    try:
        yield env
    finally:
        audit.use_anchor(None)
        audit.use_key(None)
        sandbox.close()
        drop_databases(dbs)


@pytest.fixture(params=BACKENDS)
def env(request: pytest.FixtureRequest, tmp_path: Path, evidence_sandbox: EvidenceServer) -> Iterator[Env]:
    with _fresh_env(request.param, tmp_path, evidence_sandbox) as fresh:
        yield fresh


@pytest.fixture(scope="module", params=BACKENDS)
def module_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, evidence_sandbox: EvidenceServer
) -> Iterator[Env]:
    """One ``Env`` per backend for a whole module, for tests that share one live service and keep out of each
    other's way (their own idempotency keys, nothing counted across the module). Its audit key serves the set-up
    (seeding, adding clients); a function-scoped ``env`` in the same module replaces it."""
    root = tmp_path_factory.mktemp(f"shared-{request.param}")
    with _fresh_env(request.param, root, evidence_sandbox) as fresh:
        yield fresh


@pytest.fixture
def service(env: Env) -> Iterator[runtime.Runtime]:
    """DBOS launched in this process against the test's databases, with the demo orders seeded."""
    rt = runtime.start(env.settings(), freeze_heap=False)
    seed(app_db().engine)
    try:
        yield rt
    finally:
        runtime.stop()


@pytest.fixture
def client(env: Env, service: runtime.Runtime) -> Iterator[Any]:
    c = runtime.client(service.settings)
    yield c
    c.destroy()
