"""Fixtures: real databases (SQLite files and fresh Postgres databases), a real sandbox, real DBOS."""

from __future__ import annotations

import os
import secrets
import sqlite3
import tempfile
import time
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
from dbos import SQLAlchemyDatasource
from psycopg import sql

from agent import runtime
from agent.settings import Settings
from sandbox.evidence import RiskSeed
from sandbox.ledger_records import Charge
from sandbox.payments import create_app
from steps import audit
from steps.seed import demo_charges, seed
from steps.seed_evidence import demo_risk
from steps.store import app_db, create_engine, normalize_url
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


#: Seconds each file took in a full run (the mean of two, on the 2-core machine with six workers; files under 8 s
#: are left out). With ``--no-loadscope-reorder`` (in pyproject.toml) xdist hands files out in collection order,
#: and a worker asks for its next file once two tests of its current one are left. Sorting the files longest first
#: makes that a longest-processing-time schedule: the long files start at once, and the run ends on short ones
#: spread over every worker instead of one long file on one worker. Refresh the numbers when a file's time changes
#: a lot (``pytest --durations=0`` prints every test's).
FILE_SECONDS = {
    "test_benchmarks_smoke.py": 213,
    "test_crash_matrix.py": 205,
    "test_crash_settling.py": 184,
    "test_http.py": 178,
    "test_scale.py": 159,
    "test_docs.py": 150,
    "test_upgrade.py": 138,
    "test_console.py": 119,
    "test_evals.py": 104,
    "test_workflow.py": 100,
    "test_dbos_cli.py": 99,
    "test_identities.py": 94,
    "test_openapi_fuzz.py": 85,
    "test_crash_questions.py": 80,
    "test_customer_questions.py": 76,
    "test_provider_events.py": 74,
    "test_tools.py": 70,
    "test_model_outages.py": 70,
    "test_console_sessions.py": 67,
    "test_outcome_messages.py": 64,
    "test_investigation.py": 61,
    "test_refund_lifecycle.py": 56,
    "test_console_oidc.py": 54,
    "test_console_browser.py": 52,
    "test_money_properties.py": 46,
    "test_console_lead.py": 46,
    "test_payment_step.py": 45,
    "test_launcher.py": 44,
    "test_obeying_model.py": 42,
    "test_decision_ends_waiting.py": 41,
    "test_approve_less.py": 40,
    "test_parked_holds_nothing.py": 40,
    "test_hostile_input.py": 39,
    "test_docker.py": 38,
    "test_claim_display.py": 37,
    "test_question_leads.py": 37,
    "test_whole_case.py": 36,
    "test_open_claims.py": 36,
    "test_real_model.py": 35,
    "test_chaos.py": 34,
    "test_security.py": 31,
    "test_audit_chain.py": 29,
    "test_sandbox_payments.py": 28,
    "test_email_delivery.py": 28,
    "test_file_modes.py": 27,
    "test_openapi_fields.py": 25,
    "test_rolling_upgrade.py": 25,
    "test_dbos_argus.py": 23,
    "test_startup_output.py": 21,
    "test_amounts_shown.py": 21,
    "test_approve_less_browser.py": 20,
    "test_checkpoint_format.py": 18,
    "test_dbos_console_link.py": 18,
    "test_helpdesk.py": 17,
    "test_api_answers.py": 16,
    "test_money.py": 16,
    "test_concurrent_orders.py": 12,
    "test_generated_client.py": 12,
    "test_telemetry.py": 9,
    "test_localstripe.py": 9,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0))  # stable: a file's own order is kept


def _pg_admin_url() -> str:
    return PG_SERVER.replace("postgresql+psycopg://", "postgresql://")


@dataclass
class Databases:
    system_url: str
    app_url: str
    cleanup: list[str]
    """Postgres: the databases' names, dropped (or emptied for another test) when the test ends."""
    reusable: bool = False
    """Postgres: made from the migrated template, so emptied it can serve another test."""


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
    names = _fresh_names()
    sources = template.cleanup if template is not None else [None, None]
    with psycopg.connect(_pg_admin_url(), autocommit=True) as conn:
        for name, source in zip(names, sources, strict=True):
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{source}"' if source else ""))
    return _named(names, reusable=template is not None)


def _fresh_names() -> list[str]:
    base = f"ra_test_{secrets.token_hex(4)}"
    return [f"{base}_sys", f"{base}_app"]


def _named(names: list[str], *, reusable: bool) -> Databases:
    server = _pg_admin_url().rsplit("/", 1)[0]
    return Databases(f"{server}/{names[0]}", f"{server}/{names[1]}", names, reusable)


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
        if dbs.cleanup:
            # The schema DBOS's datasource keeps in the application database, which a worker's first start creates:
            # in the template, so that an emptied database, whose tests started workers, matches it.
            SQLAlchemyDatasource.migrate(normalize_url(dbs.app_url))
            _postgres.learn(dbs)
            # CREATE DATABASE ... TEMPLATE needs the template to have no sessions
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


#: A table as (schema, name).
Table = tuple[str, str]


@dataclass(frozen=True)
class _Layout:
    """What a migrated database holds before any test: the tables a test may fill (emptied for the next one),
    the tables migrations fill (kept), and a digest of its schema and of the kept rows."""

    emptied: list[Table]
    kept: list[Table]
    digest: str


#: A digest of everything a test could change in a database other than the rows of the tables it fills: schemas,
#: tables and their columns, indexes, sequences, functions, triggers, per-database settings, and the rows the
#: migrations wrote (``kept`` below).
_SCHEMA_DIGEST = """
SELECT md5(string_agg(item, ',' ORDER BY item)) FROM (
  SELECT 'rel:' || n.nspname || '.' || c.relname || ':' || c.relkind::text || ':' || coalesce(a.attname, '') || ':'
         || coalesce(format_type(a.atttypid, a.atttypmod), '') || ':' || coalesce(a.attnotnull::text, '')
         || ':' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') AS item
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
   WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
  UNION ALL SELECT 'ns:' || nspname FROM pg_namespace
  UNION ALL SELECT 'fn:' || p.oid::regprocedure::text || md5(p.prosrc) FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
  UNION ALL SELECT 'trg:' || tgrelid::regclass::text || '.' || tgname || ':' || tgenabled::text FROM pg_trigger
   WHERE NOT tgisinternal
  UNION ALL SELECT 'con:' || conrelid::regclass::text || '.' || conname || ':' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
  UNION ALL SELECT 'set:' || array_to_string(setconfig, ';') FROM pg_db_role_setting
   WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL SELECT 'ext:' || extname || ':' || extversion FROM pg_extension
) items
"""


def _user_tables(conn: psycopg.Connection[Any]) -> list[Table]:
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        " ORDER BY 1, 2"
    ).fetchall()
    return [(schema, name) for schema, name in rows]


def _digest(conn: psycopg.Connection[Any], kept: list[Table]) -> str:
    parts = [str(conn.execute(_SCHEMA_DIGEST).fetchone())]
    for table in kept:
        rows = sql.SQL("SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {} t")
        parts.append(f"{table}={conn.execute(rows.format(sql.Identifier(*table))).fetchone()}")
    return ";".join(parts)


def _filled(conn: psycopg.Connection[Any], tables: list[Table]) -> list[Table]:
    """Those of ``tables`` that hold a row."""
    if not tables:
        return []
    exists = sql.SQL("SELECT {} WHERE EXISTS (SELECT FROM {})")
    query = sql.SQL(" UNION ALL ").join(exists.format(i, sql.Identifier(*t)) for i, t in enumerate(tables))
    return [tables[row[0]] for row in conn.execute(query).fetchall()]


def _layout(url: str) -> _Layout:
    with psycopg.connect(url, autocommit=True) as conn:
        tables = _user_tables(conn)
        kept = _filled(conn, tables)
        return _Layout([t for t in tables if t not in kept], kept, _digest(conn, kept))


class _PostgresPool:
    """Migrated Postgres databases for tests. A test's databases are emptied behind it, in a thread, and serve a
    later test: making a pair from the template and dropping it costs Postgres 0.3-0.8 s of CPU (every page of
    both copies goes through the WAL), emptying one 0.05-0.1 s.

    Emptied is as new: every session on the databases is ended, they are renamed (a process a test left behind
    cannot reach them under the new names, and a rename fails while any session remains), every table the
    migrations left empty and the test filled is truncated, every sequence restarted, and a digest of the schema,
    functions, triggers, constraints and settings and of the rows the migrations wrote must equal the template's.
    A database that fails any of this is dropped instead; one made without migrations (``migrated=False``) always
    is."""

    def __init__(self) -> None:
        self.emptying = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-empty")
        self.pending: list[Future[Databases | None]] = []
        self.ready: list[Databases] = []
        self.layouts: list[_Layout] = []

    def learn(self, template: Databases) -> None:
        """What the template's databases (system, application) hold: the state an emptied database must match."""
        self.layouts = [_layout(url) for url in (template.system_url, template.app_url)]

    def take(self) -> Databases:
        template = _template("postgres")
        while not self.ready and self.pending:
            emptied = self.pending.pop(0).result()
            if emptied is not None:
                self.ready.append(emptied)
        return self.ready.pop() if self.ready else _create_postgres(template)

    def drop(self, dbs: Databases) -> None:
        self.pending.append(self.emptying.submit(_empty_or_drop, dbs, self.layouts))

    def close(self) -> None:
        for future in self.pending:
            emptied = future.result()
            if emptied is not None:
                self.ready.append(emptied)
        self.pending.clear()
        self.emptying.shutdown(wait=True)
        for dbs in self.ready:
            _drop_now(dbs)
        self.ready.clear()


def _empty_or_drop(dbs: Databases, layouts: list[_Layout]) -> Databases | None:
    """The test's databases emptied under new names, or None once dropped (see ``_PostgresPool``)."""
    if dbs.reusable and layouts:
        try:
            emptied = _emptied(dbs, layouts)
        except psycopg.Error:
            emptied = None
        if emptied is not None:
            return emptied
    _drop_now(dbs)
    return None


def _emptied(dbs: Databases, layouts: list[_Layout]) -> Databases | None:
    names = _fresh_names()
    with psycopg.connect(_pg_admin_url(), autocommit=True) as conn:
        for old, new in zip(dbs.cleanup, names, strict=True):
            for _ in range(100):  # ended sessions take a moment to go; a rename fails while one remains
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (old,))
                try:
                    conn.execute(f'ALTER DATABASE "{old}" RENAME TO "{new}"')
                    break
                except psycopg.errors.ObjectInUse:
                    time.sleep(0.02)
            else:
                return None
            dbs.cleanup[dbs.cleanup.index(old)] = new  # dropped under this name if what follows fails
    fresh = _named(names, reusable=True)
    for url, layout in zip((fresh.system_url, fresh.app_url), layouts, strict=True):
        with psycopg.connect(url, autocommit=True) as conn:
            filled = _filled(conn, layout.emptied)
            if filled:  # a table's TRUNCATE makes new files (milliseconds of a backend), so only the ones a test filled
                conn.execute(
                    sql.SQL("TRUNCATE {} CASCADE").format(sql.SQL(", ").join(sql.Identifier(*t) for t in filled))
                )
            conn.execute(
                "SELECT setval(format('%I.%I', schemaname, sequencename)::regclass, start_value, false)"
                " FROM pg_sequences WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
                " AND last_value IS NOT NULL"
            )
            if _digest(conn, layout.kept) != layout.digest:
                return None
    return fresh


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
    """A test's Postgres databases are done: emptied for another test or dropped, behind the tests in a thread."""
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
