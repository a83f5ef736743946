"""`refund-agent` commands."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agent.settings import MissingSecret, UnsafeDataDirectory, get_settings, settings_problems
from sandbox.webhooks import WEBHOOK_SECRET_ENV

if TYPE_CHECKING:
    from agent.identity import Principal

#: Entry points that add subcommands: each is ``register(subparsers)``. The tools that exercise the product
#: from outside (``proving``: demo, chaos, eval) join the command line this way, so the product never imports them.
COMMANDS_GROUP = "refund_agent.commands"
#: Settings a command cannot run with: one that does not validate (a blank or short secret), an unsafe data
#: directory, or the audit key missing where the chain is checked.
EXIT_BAD_SETTINGS = 2


def _setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("stripe").setLevel(logging.WARNING)
    # Libraries' progress lines (DBOS's schema migrations, Alembic's revisions and plugins) only with DEBUG;
    # their warnings stay. The application database's migration says where it is in one line.
    for library in ("dbos", "alembic"):
        logging.getLogger(library).setLevel(max(logging.getLevelName(level), logging.WARNING))


def cmd_migrate(_: argparse.Namespace) -> int:
    from agent.runtime import migrate_databases

    migrate_databases(get_settings())
    print("system and application databases are at the latest migration")
    return 0


def cmd_seed(args: argparse.Namespace) -> int:
    from steps.migrate import upgrade
    from steps.seed import seed
    from steps.store import create_engine

    settings = get_settings()
    upgrade(settings.database.app_database_url)
    engine = create_engine(settings.database.app_database_url)
    written = seed(engine, reset=args.reset)
    print(f"seeded {written} demo orders")
    return 0


EXIT_EXECUTOR_ID_IN_USE = 3


def cmd_worker(_: argparse.Namespace) -> int:
    from agent import runtime
    from agent.http import metrics
    from agent.ops import heartbeat

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    settings = get_settings()
    try:
        rt = runtime.start(settings)
    except heartbeat.ExecutorIdInUse as error:
        print(f"refused: {error}", file=sys.stderr)
        return EXIT_EXECUTOR_ID_IN_USE
    started()
    if settings.telemetry.metrics_port is not None:
        metrics.serve_worker_metrics(settings)
    print(f"worker {rt.settings.runtime.executor_id} running refunds ({rt.model_label}); Ctrl-C stops it")
    print(f"email: {settings.email.summary()}")
    if settings.helpdesk.enabled:
        print(f"help desk: replies posted to {settings.evidence.base_url(settings.evidence.tickets_api_base)}")
    while not stop.wait(1.0):  # wakes every second, so a signal is acted on even if its wake-up was missed
        pass
    logging.getLogger(__name__).info(
        "stopping: no new refunds; in-flight ones get %ss to finish", settings.runtime.shutdown_timeout_seconds
    )
    runtime.stop(workflow_completion_timeout_sec=settings.runtime.shutdown_timeout_seconds)
    logging.getLogger(__name__).info("worker %s stopped", settings.runtime.executor_id)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from agent.http.server import serve

    overrides = {k: v for k, v in {"refund_agent_host": args.host, "refund_agent_port": args.port}.items() if v}
    settings = get_settings().with_values(**overrides)
    started()
    serve(settings, worker=not args.no_worker)
    return 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    from sandbox.evidence import RiskSeed
    from sandbox.ledger_records import Charge
    from sandbox.payments import run_sandbox
    from steps.seed import demo_charges
    from steps.seed_evidence import demo_risk

    settings = get_settings()
    started()
    run_sandbox(
        risk_seed=RiskSeed.model_validate(demo_risk()),
        host=args.host,
        port=args.port or settings.payments.sandbox_port,
        database_url=args.database_url or settings.database.sandbox_database_url,
        api_key=None,
        key_ttl_seconds=settings.payments.key_ttl_seconds,
        charges=[Charge(**c) for c in demo_charges()],
        webhook_url=args.webhook_url,
        webhook_secret=args.webhook_secret or os.environ.get(WEBHOOK_SECRET_ENV) or None,
    )
    return 0


def cmd_sandbox_evidence(args: argparse.Namespace) -> int:
    from sandbox.evidence import EvidenceSeed, run_sandbox
    from steps.seed_evidence import demo_evidence

    port = args.port or get_settings().evidence.sandbox_port
    started()
    run_sandbox(host=args.host, port=port, seed=EvidenceSeed.model_validate(demo_evidence()))
    return 0


def _open() -> Any:
    from agent import runtime
    from steps.store import open_app_database

    settings = get_settings()
    runtime.migrate_databases(settings)
    open_app_database(settings.database.app_database_url)
    runtime.use_audit_chain(settings)  # a submission appends to the audit chain
    return runtime.client(settings)


def os_user() -> str:
    """The name of the process's real user (its uid's password entry), never an environment variable: ``USER``
    and ``LOGNAME`` are whatever the caller set. A uid without an entry (a container's) is ``uid<n>``."""
    import os
    import pwd

    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def os_principal() -> Principal:
    """The command line acts as the OS user running it (``cli:<user>``): who submits, who decides. An OS user
    named as a configured operator is that operator in every check (requester, approval limits, role)."""
    from agent.identity import cli_principal

    return cli_principal(os_user(), get_settings().approvals.operators)


def cmd_submit(args: argparse.Namespace) -> int:
    from agent.domain import RefundRequest
    from agent.submit import SubmissionError, submit_refund
    from steps import clients
    from steps.refunds import Requester
    from steps.store import app_db

    client = _open()
    try:
        me = os_principal()
        requester = Requester(principal=str(me), operator=me.acts_for)
        if args.api_key_file:  # as the API client whose key this is (the key is the proof, not a typed name)
            found = clients.authenticate(app_db().engine, args.api_key_file.read_text().strip())
            if found is None or not found.allows("refunds:create"):
                print("refused: that key is not a live client's with refunds:create", file=sys.stderr)
                return 2
            requester = Requester(principal=f"client:{found.name}", operator=found.operator)
        amount = Decimal(args.amount) if args.amount else None
        request = RefundRequest(order_id=args.order_id, message=args.message, amount=amount, currency=args.currency)
        sub = submit_refund(client, idempotency_key=args.key, request=request, requester=requester)
    except (SubmissionError, ValueError, InvalidOperation) as error:
        print(f"refused: {error}", file=sys.stderr)
        return 2
    print(json.dumps({"refund_id": sub.refund_id, "created": sub.created}))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from agent.status import refund_status
    from agent.status_text import summary_lines
    from steps import audit
    from steps.store import app_db

    client = _open()
    status = refund_status(client, args.refund_id, prices=get_settings().model.prices)
    if status is None:
        print(f"no refund {args.refund_id}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    with app_db().engine.connect() as conn:
        events = audit.entries(conn, args.refund_id)
    print("\n".join(summary_lines(status, events)))
    return 0


def cmd_steps(args: argparse.Namespace) -> int:
    from agent.status import refund_status
    from agent.status_text import timeline_lines, timer_note

    client = _open()
    status = refund_status(client, args.refund_id)
    if status is None or not status["workflows"]:
        print(f"no refund {args.refund_id}", file=sys.stderr)
        return 1
    workflows, approval = status["workflows"], status["approval"]
    print(f"Steps of refund {args.refund_id}, across its {len(workflows)} workflow(s), in the order they ran:")
    print("\n".join(timeline_lines(args.refund_id, status["steps"], approval)))
    for wf in workflows:
        run = wf["workflow_id"].removeprefix(args.refund_id) or "(refund)"
        step = next((s for s in status["steps"] if s["workflow"] == wf["workflow_id"]), None)
        found = timer_note(step, approval) if step else ""  # a timer's first step says what it found
        print(f"  {run:<10} {wf['name']}: {wf['status']}" + (f" ({found})" if found else ""))
    return 0


def cmd_decide(args: argparse.Namespace) -> int:
    from agent import approvals
    from agent.identity import approver_names

    client = _open()
    decision: approvals.Decision = "approve" if args.command == "approve" else "reject"
    try:
        run = approvals.decider_via_queue(client)
        result = approvals.decide_pending(
            run,
            refund_id=args.refund_id,
            decision=decision,
            approver=os_principal(),
            via="cli",
            authority=get_settings().approvals.limits,
            deciders=approver_names(get_settings().approvals.operators),
            amount=approvals.parse_amount(args.amount) if getattr(args, "amount", None) else None,
        )
    except approvals.ApprovalError as error:
        print(f"refused ({error.code}): {error}", file=sys.stderr)
        return 2
    record = result.record
    print(
        f"{record.decision} by {record.approver} at {record.decided_at:%Y-%m-%d %H:%M:%S} UTC "
        f"for {record.amount} {record.currency}" + ("" if result.first else " (recorded earlier; unchanged)")
    )
    return 0 if record.decision == decision else 3


def cmd_clients(args: argparse.Namespace) -> int:
    from agent.runtime import use_audit_chain
    from steps import clients
    from steps.migrate import upgrade
    from steps.store import create_engine

    settings = get_settings()
    upgrade(settings.database.app_database_url)
    use_audit_chain(settings)  # adding and revoking clients are audited
    engine = create_engine(settings.database.app_database_url)
    actor = str(os_principal())
    try:
        if args.clients_command == "add":
            return _add_client(engine, args, actor=actor)
        if args.clients_command == "revoke":
            revoked = clients.revoke_client(engine, args.name, actor=actor)
            print(f"client {revoked.name} revoked at {revoked.revoked_at:%Y-%m-%d %H:%M:%S} UTC; its key is refused")
        else:
            for c in clients.list_clients(engine):
                used = f"{c.last_used_at:%Y-%m-%d %H:%M} UTC" if c.last_used_at else "never"
                state = f"revoked {c.revoked_at:%Y-%m-%d %H:%M} UTC" if c.revoked_at else "live"
                acts = f" for operator {c.operator}" if c.operator else ""
                print(f"{c.name:<24} {' '.join(c.scopes):<48} {state:<26} last used {used}{acts}")
    except clients.ClientError as error:
        print(f"refused: {error}", file=sys.stderr)
        return 2
    finally:
        engine.dispose()
    return 0


def _add_client(engine: Any, args: argparse.Namespace, *, actor: str) -> int:
    """Add the client; its key into ``--key-file`` (made 0600, never overwritten) or alone on stdout."""
    from agent.identity import known_operator
    from steps import clients

    settings = get_settings()
    if args.operator is not None and not known_operator(
        args.operator, settings.approvals.operators, oidc=settings.console.oidc_issuer_url is not None
    ):
        configured = ", ".join(sorted(settings.approvals.operators)) or "none: only the generated admin"
        print(
            f"refused: no operator {args.operator!r} is configured (REFUND_AGENT_OPERATORS names {configured})",
            file=sys.stderr,
        )
        return 2
    key_file: Path | None = args.key_file
    if key_file is not None and (key_file.exists() or not key_file.parent.is_dir()):
        why = "exists already" if key_file.exists() else "is in no existing directory"
        print(f"refused: {key_file} {why}; the key is written to a new file only", file=sys.stderr)
        return 2
    made, key = clients.add_client(engine, name=args.name, scopes=args.scopes, operator=args.operator, actor=actor)
    scopes = ", ".join(made.scopes)
    if key_file is None:  # the key alone on stdout, the rest on stderr
        print(f"client {made.name} ({scopes}) added; its key, shown only now:", file=sys.stderr)
        print(key)
        return 0
    # Created this user's alone whatever the umask, and never through an existing file or link.
    descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(key + "\n")
    print(
        f"client {made.name} ({scopes}) added; its key is in {key_file} (mode 0600), and nowhere else", file=sys.stderr
    )
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from steps import audit
    from steps.store import create_engine

    settings = get_settings()
    try:
        key = settings.audit_key(generate=False)  # a key made up here would only fail every keyed entry
    except MissingSecret as missing:
        print(f"refused: no audit key ({missing}): set REFUND_AGENT_AUDIT_KEY to the service's key", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    anchors = [] if args.no_anchor else (args.anchor or [settings.audit_anchor_file()])
    allowed = settings.audit.unkeyed_entries if args.max_unkeyed is None else args.max_unkeyed
    with create_engine(settings.database.app_database_url).connect() as conn:
        report = audit.verify(conn, key=key, anchors=anchors, unkeyed_allowed=allowed)
    if not report.ok:
        if report.first_broken_seq is None:  # the anchor itself: missing, unreadable or not the key's
            hint = "; pass a host's copy with --anchor FILE, or check the chain alone with --no-anchor"
            print(f"audit chain BROKEN (anchor): {report.problem}{hint}")
        else:
            print(f"audit chain BROKEN at entry {report.first_broken_seq}: {report.problem}")
        return 1
    unkeyed = f"; {report.unkeyed} of them, first in the chain, from before the audit key" if report.unkeyed else ""
    anchored = (
        f"; its anchor records {report.anchored}"
        if report.anchored is not None
        else "; no anchor checked (entries deleted from its end would not show)"
    )
    print(f"audit chain intact: {report.entries} entries{unkeyed}{anchored}")
    return 0


def cmd_hash_password(_: argparse.Namespace) -> int:
    import getpass

    from agent.console.auth import hash_password

    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not password:
        print("refused: empty password", file=sys.stderr)
        return 2
    print(hash_password(password))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="refund-agent", description="A durable AI refund agent.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="migrate the application database").set_defaults(func=cmd_migrate)
    seed = sub.add_parser("seed", help="load demo customers and orders")
    seed.add_argument("--reset", action="store_true", help="restore seeded orders to their original amounts")
    seed.set_defaults(func=cmd_seed)
    sub.add_parser("worker", help="run refund workflows from the queue").set_defaults(func=cmd_worker)
    serve = sub.add_parser("serve", help="HTTP API + worker (+ the local sandboxes for services not set)")
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--no-worker", action="store_true", help="HTTP API only; `refund-agent worker` runs refunds")
    serve.set_defaults(func=cmd_serve)
    sb = sub.add_parser("sandbox-payments", help="run the local Stripe-compatible payments sandbox")
    sb.add_argument("--port", type=int, default=None)
    sb.add_argument("--host", default="127.0.0.1")
    sb.add_argument("--database-url", default=None)
    sb.add_argument("--webhook-url", default=None, help="POST refund events here (signed when a secret is given)")
    sb.add_argument(
        "--webhook-secret",
        default=None,
        help=f"the endpoint secret events are signed with (or ${WEBHOOK_SECRET_ENV}, kept out of the process list)",
    )
    sb.set_defaults(func=cmd_sandbox)
    ev = sub.add_parser(
        "sandbox-evidence", help="run the local carrier, returns and helpdesk APIs with the demo orders' evidence"
    )
    ev.add_argument("--port", type=int, default=None)
    ev.add_argument("--host", default="127.0.0.1")
    ev.set_defaults(func=cmd_sandbox_evidence)
    submit = sub.add_parser("submit", help="submit a refund request")
    submit.add_argument("order_id")
    submit.add_argument("--message", required=True)
    submit.add_argument("--amount")
    submit.add_argument("--currency")
    submit.add_argument("--key", required=True, help="idempotency key (becomes the refund id)")
    submit.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help="submit as the API client whose key is in this file (default: as the OS user, cli:<user>)",
    )
    submit.set_defaults(func=cmd_submit)
    status = sub.add_parser(
        "status", help="show a refund's phase, outcome, amounts and the timeline of its events (--json: everything)"
    )
    status.add_argument("refund_id")
    status.add_argument(
        "--json",
        action="store_true",
        help="print the whole record as JSON: approval, payment, claim, usage, workflows, steps",
    )
    status.set_defaults(func=cmd_status)
    steps = sub.add_parser("steps", help="a refund's DBOS steps across its workflows, one line each, in time order")
    steps.add_argument("refund_id")
    steps.set_defaults(func=cmd_steps)
    for name in ("approve", "reject"):
        d = sub.add_parser(name, help=f"{name} a refund waiting for approval, as the OS user running this (cli:<user>)")
        d.add_argument("refund_id")
        if name == "approve":
            d.add_argument("--amount", help="approve this much (at most the amount asked, its default)")
        d.set_defaults(func=cmd_decide)
    cl = sub.add_parser("clients", help="API clients: add (its key is shown once), list, revoke")
    cl_sub = cl.add_subparsers(dest="clients_command", required=True)
    add = cl_sub.add_parser("add", help="add a client and print its key")
    add.add_argument("name")
    add.add_argument(
        "--scopes",
        required=True,
        help="comma-separated: refunds:create, refunds:read, approvals:decide, admin",
    )
    add.add_argument(
        "--operator",
        default=None,
        help="the configured console operator this client acts for (may not decide its refunds)",
    )
    add.add_argument(
        "--key-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the key into this new file, readable by this user only (default: print it alone on stdout)",
    )
    add.set_defaults(func=cmd_clients)
    cl_sub.add_parser("list", help="list clients and their scopes").set_defaults(func=cmd_clients)
    rv = cl_sub.add_parser("revoke", help="revoke a client: its key is refused at once")
    rv.add_argument("name")
    rv.set_defaults(func=cmd_clients)
    sub.add_parser(
        "hash-password", help="hash a console operator's password (read from the terminal or stdin)"
    ).set_defaults(func=cmd_hash_password)
    audit = sub.add_parser("audit", help="audit log tools")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_sub.add_parser("verify", help="verify the audit chain's MACs with the audit key")
    verify.add_argument(
        "--max-unkeyed",
        type=int,
        default=None,
        metavar="N",
        help="allow the first N entries to predate the audit key (default: REFUND_AGENT_AUDIT_UNKEYED_ENTRIES, 0)",
    )
    verify.add_argument(
        "--anchor",
        type=Path,
        action="append",
        metavar="FILE",
        help="check against this anchor (a host's audit.anchor; repeat for several hosts; default: this host's)",
    )
    verify.add_argument(
        "--no-anchor", action="store_true", help="check the chain alone (entries cut from its end do not show)"
    )
    verify.set_defaults(func=cmd_audit)
    for command in entry_points(group=COMMANDS_GROUP):
        try:
            register: Callable[[Any], None] = command.load()
        except ModuleNotFoundError as missing:
            if missing.name != command.module.split(".")[0]:
                raise
            continue  # an install without that package (the Docker image ships the product only)
        register(sub)
    return p


def _refuse_settings() -> int | None:
    """Load the settings and close the data directory to others, once, before any command; a setting that does not
    validate (a blank or short secret) or a data directory that cannot be closed stops every command."""
    try:
        get_settings().database.secure_data_dir()
    except ValidationError as error:
        problems = "\n".join(f"  {problem}" for problem in settings_problems(error))
        print(f"refused to start: invalid settings\n{problems}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    except UnsafeDataDirectory as error:
        print(f"refused to start: {error}", file=sys.stderr)
        return EXIT_BAD_SETTINGS
    return None


def main(argv: list[str] | None = None) -> int:
    # First of all: every file this process or its children create (databases, secrets, logs) is this user's alone.
    os.umask(0o077)
    # A command's imports build some 200,000 objects that live as long as the process; the cyclic collector would
    # walk them again and again while they are built (about a fifth of a start's CPU). A command that runs on
    # turns it back on once it has started (``started``); a short one ends first.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _main(argv)
    finally:
        if collecting:
            gc.enable()


def started() -> None:
    """A long-running command is past its imports: the cyclic garbage collector runs again from here."""
    gc.enable()


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    args, rest = p.parse_known_args(argv)
    refused = _refuse_settings()
    if refused is not None:
        return refused
    passthrough: Callable[[list[str]], int] | None = getattr(args, "passthrough", None)
    if passthrough is not None:  # a command with its own parser: its flags and --help pass through untouched
        started()  # the demo, chaos and benchmark tools run for minutes
        return passthrough(argv[argv.index(args.command) + 1 :])
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    # Read and decide commands print their answer only (warnings still go to stderr).
    quiet = args.command in ("status", "steps", "approve", "reject", "submit", "clients", "audit") or getattr(
        args, "quiet", False
    )
    _setup_logging("WARNING" if quiet else "INFO")
    from agent.ops.logs import configure_logging

    configure_logging(get_settings().telemetry)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
