"""`refund-agent demo`: the worked example, live, with real processes and a real crash."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import httpx

from agent import approvals
from agent.cli import os_user
from agent.domain import RefundRequest
from agent.identity import Principal, cli_principal
from agent.ops.processes import child_env, free_port, http_ok, spawn, stop, wait_for
from agent.settings import Settings
from agent.status import parked, refund_status
from agent.status_text import timeline_lines
from agent.submit import Submission, submit_refund
from steps import audit, notify
from steps.orders import get_order
from steps.records import format_money
from steps.refunds import Requester
from steps.seed import seed
from steps.store import app_db, close_app_database, open_app_database

REFUND_ID = "demo-refund-ord_1002"
EXECUTOR = "demo-worker"
EMBEDDED_ONLY = (
    "DBOS_SYSTEM_DATABASE_URL",
    "DATABASE_URL",
    "PAYMENTS_API_BASE",
    "REFUND_AGENT_CRASH_AT",
    "CARRIER_API_BASE",
    "RETURNS_API_BASE",
    "TICKETS_API_BASE",
)


class Demo:
    def __init__(self, settings: Settings) -> None:
        self.t0 = time.monotonic()
        self.checks: list[tuple[str, bool]] = []
        self.dir = settings.database.data_dir.resolve() / "demo"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.port, self.evidence_port = free_port(), free_port()
        self.settings = Settings(
            refund_agent_data_dir=self.dir,
            payments_sandbox_port=self.port,
            evidence_sandbox_port=self.evidence_port,
            refund_agent_executor_id="demo-cli",
        )
        self.env = child_env(
            {
                "REFUND_AGENT_DATA_DIR": str(self.dir),
                "PAYMENTS_SANDBOX_PORT": str(self.port),
                "EVIDENCE_SANDBOX_PORT": str(self.evidence_port),
                "REFUND_AGENT_EXECUTOR_ID": EXECUTOR,
            },
            drop=EMBEDDED_ONLY,
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        self.base = f"http://127.0.0.1:{self.port}"

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.2f}s] {text}", flush=True)

    def check(self, name: str, ok: bool) -> None:
        self.checks.append((name, ok))
        print(f"           {'PASS' if ok else 'FAIL'}  {name}", flush=True)

    def start(self, args: list[str], log: str, **extra: str) -> subprocess.Popen[bytes]:
        proc = spawn(args, env={**self.env, **extra}, log=self.dir / log)
        self.procs.append(proc)
        return proc

    def provider_refunds(self, charge: str) -> list[dict[str, Any]]:
        auth = {"Authorization": f"Bearer {self.settings.payments.api_key.get_secret_value()}"}
        body = httpx.get(f"{self.base}/v1/refunds", params={"charge": charge, "limit": 100}, headers=auth).json()
        return list(body["data"])

    def sandbox_stats(self) -> dict[str, int]:
        auth = {"Authorization": f"Bearer {self.settings.payments.api_key.get_secret_value()}"}
        return dict(httpx.get(f"{self.base}/_sandbox/stats", headers=auth).json())

    def run(self) -> bool:
        from agent import runtime

        self.say(f"embedded default in {self.dir} (SQLite, WAL); offline model; payments sandbox on :{self.port}")
        self.start(["sandbox-payments", "--port", str(self.port)], "sandbox.log")  # both sandboxes start at once
        self.start(["sandbox-evidence", "--port", str(self.evidence_port)], "evidence.log")
        wait_for(lambda: http_ok(f"{self.base}/_sandbox/healthz"), timeout=30, what="the payments sandbox")
        evidence = f"http://127.0.0.1:{self.evidence_port}/_sandbox/healthz"
        wait_for(lambda: http_ok(evidence), timeout=30, what="the evidence sandbox")
        runtime.migrate_databases(self.settings)
        open_app_database(self.settings.database.app_database_url)
        # The workers get the same key: from REFUND_AGENT_AUDIT_KEY, or generated into the demo's data directory here.
        audit.use_key(self.settings.audit_key())
        seed(app_db().engine)
        client = runtime.client(self.settings)
        worker = self.start(["worker"], "worker-1.log", REFUND_AGENT_CRASH_AT="after_provider_call")
        self.say(f"worker {EXECUTOR} started (pid {worker.pid}), armed to die after the provider applies the refund")

        request = RefundRequest(
            order_id="ord_1002",
            message="The desk and both chairs arrived broken. I want my money back for the whole order.",
        )

        helpdesk = Requester(principal=str(Principal("client", "helpdesk")))  # the help desk's API client asks

        def submit() -> Submission:
            return submit_refund(client, idempotency_key=REFUND_ID, requester=helpdesk, request=request)

        first, again = submit(), submit()
        self.say(f"submitted refund {REFUND_ID} for order ord_1002 (4,200.00 USD captured)")
        self.check(
            "same idempotency key submitted twice -> one refund id",
            first.refund_id == again.refund_id and first.created and not again.created,
        )

        pending = wait_for(lambda: parked(client, REFUND_ID), timeout=60, what="the refund to park")
        self.say(
            f"agent proposed {pending['amount']} {pending['currency']}; policy: above the auto-approve limit "
            "-> parked for approval: its workflow ended; rows wait (the request, DELAYED deadline and reminder)"
        )
        decider = approvals.decider_via_queue(client)
        try:
            approvals.decide_pending(
                decider, refund_id=REFUND_ID, decision="approve", approver=Principal("client", "helpdesk"), via="api"
            )
            refused = False
        except approvals.ApprovalError as error:
            refused = error.code == "requester"
        self.say("the help desk's client tried to approve the refund it requested: refused")
        self.check("the requester cannot approve its own refund", refused)
        me = cli_principal(os_user(), self.settings.approvals.operators)
        result = approvals.decide_pending(decider, refund_id=REFUND_ID, decision="approve", approver=me, via="cli")
        eve = Principal("operator", "eve")
        repeat = approvals.decide_pending(decider, refund_id=REFUND_ID, decision="reject", approver=eve, via="console")
        self.say(f"approved by {result.record.approver}; a late reject by {eve} got the recorded decision back")
        self.check(
            "first decision wins; a second decision changes nothing",
            result.first and not repeat.first and repeat.record.decision == "approve",
        )

        code = wait_for(worker.poll, timeout=60, what="the worker to crash")
        self.say(
            f"worker pid {worker.pid} died with signal {-code} inside payments.issue_refund, after the provider "
            "applied the refund and before DBOS checkpointed the step"
        )
        self.check("worker was SIGKILLed mid-payment", code == -signal.SIGKILL)
        ledger = self.provider_refunds("ch_ord_1002")
        self.check("provider already holds the refund", len(ledger) == 1)

        replacement = self.start(["worker"], "worker-2.log")
        self.say(
            f"replacement worker {EXECUTOR} started (pid {replacement.pid}); DBOS recovers the refund's continuation"
        )

        def done() -> dict[str, Any] | None:
            status = refund_status(client, REFUND_ID)
            return status if status and status["status"] in ("completed", "failed", "rejected") else None

        status: dict[str, Any] = wait_for(done, timeout=60, what="the refund to complete")
        paid = status["amount_refunded"]  # what was paid, named apart from what was asked (amount_requested)
        shown = format_money(Decimal(paid), status["currency"]) if paid else "nothing"
        self.say(f"refund {status['status']}: {shown} paid, provider refund {status['payment']['provider_refund_id']}")
        if status.get("usage"):
            usage = status["usage"]
            self.say(
                f"deciding it took {usage['requests']} model request(s): "
                f"{usage['input_tokens']} tokens in, {usage['output_tokens']} out"
            )
        self.report(status, self.provider_refunds("ch_ord_1002"), self.sandbox_stats())
        return all(ok for _, ok in self.checks)

    def report(self, status: dict[str, Any], ledger: list[dict[str, Any]], stats: dict[str, int]) -> None:
        key = status["payment"]["idempotency_key"]
        steps = status["steps"]
        payment_steps = [s for s in steps if s["name"] == "payments.issue_refund"]
        self.check("workflow completed", status["status"] == "completed")
        self.check("provider holds exactly one refund for the order", len(ledger) == 1)
        self.check(
            f"retry sent the same idempotency key ({key}) and the provider replayed it",
            stats.get("create_requests") == 2 and stats.get("replays") == 1 and stats.get("refunds_applied") == 1,
        )
        self.check(
            "ledger refund matches the recorded payment",
            bool(ledger)
            and ledger[0]["id"] == status["payment"]["provider_refund_id"]
            and ledger[0]["metadata"].get("idempotency_key") == key,
        )
        self.check("payment step checkpointed once", len(payment_steps) == 1 and payment_steps[0]["error"] is None)
        with app_db().engine.connect() as conn:
            order = get_order(conn, "ord_1002")
            chain = audit.verify(conn)
            events = [e.event for e in audit.entries(conn, REFUND_ID)]
        self.check(
            "order shows 4200.00 refunded, once",
            order is not None and order.amount_refunded == Decimal("4200.00"),
        )
        self.check(f"audit chain verifies ({chain.entries} entries)", chain.ok)
        print("\nTimeline of DBOS steps (refund " + REFUND_ID + ", across its workflows, in the order they ran):")
        print("\n".join(timeline_lines(REFUND_ID, steps, status["approval"])))
        print("\nAudit trail: " + " -> ".join(events))
        with app_db().engine.connect() as conn:
            for message in notify.messages(conn, REFUND_ID):
                # The approval link points at `refund-agent serve`, which the demo does not run: show where it leads.
                body = re.sub(
                    r"\nDecide: \S+", "\nDecide: <signed approval link to refund-agent serve>", message["body"]
                )
                print(f"Sent to {message['recipient']} ({message['channel']}): {body}")

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        close_app_database()


def run_demo(settings: Settings, *, out: Callable[[str], None] = print) -> int:
    demo = Demo(settings)
    try:
        ok = demo.run()
    except TimeoutError as error:
        demo.say(f"FAILED: {error} (logs in {demo.dir})")
        ok = False
    finally:
        demo.close()
    passed = sum(1 for _, good in demo.checks if good)
    out(f"\n{passed}/{len(demo.checks)} checks passed in {time.monotonic() - demo.t0:.1f}s; logs in {demo.dir}")
    out(f"Inspect it with DBOS's CLI: dbos workflow list -s sqlite:///{demo.dir}/dbos_system.sqlite")
    out(f"or step by step: REFUND_AGENT_DATA_DIR={demo.dir} refund-agent steps {REFUND_ID}")
    return 0 if ok else 1
