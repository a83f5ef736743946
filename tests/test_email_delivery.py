"""Outbox messages leave by email exactly once: a real SMTP server on loopback counts what it accepted.

Real SQLite and real Postgres (the ``env`` fixture); the delivery loop in this process for the behaviours, and
``refund-agent worker`` in a subprocess, killed with SIGKILL between a send and its record, for the crash.
"""

from __future__ import annotations

import logging
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import ValidationError

from agent import runtime
from agent.http.metrics import ClusterCollector
from agent.http.startup import StartupFacts, ready_lines
from agent.ops.delivery import DeliveryLoop
from agent.ops.processes import child_env, spawn, stop, wait_for
from agent.settings import Settings
from steps import mail
from steps.migrate import upgrade
from steps.notify import customer_message, notify_approvers_step, notify_customer_step
from steps.seed import seed
from steps.store import close_app_database, create_engine, db_now_ms, open_app_database, outbox
from tests.conftest import Env, drop_databases, make_databases
from tests.mail_server import PASSWORD, USERNAME, MailServer, TlsMailServer, self_signed_loopback_cert

FROM = "Refunds <refunds@shop.example>"
APPROVERS = {"dana": "dana@shop.example", "erin": "refused@shop.example"}
LINK = "https://refunds.shop.example/approvals/tok_abc123"


@pytest.fixture(scope="module")
def smtp_server() -> Iterator[MailServer]:
    server = MailServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def smtp(smtp_server: MailServer) -> MailServer:
    smtp_server.reset()
    return smtp_server


@pytest.fixture
def app(env: Env) -> Iterator[sa.Engine]:
    """The application database (at head, demo orders seeded), with no DBOS: the steps run as plain transactions."""
    engine = open_app_database(env.dbs.app_url).engine
    seed(engine)
    try:
        yield engine
    finally:
        close_app_database()


def loop(engine: sa.Engine, smtp: MailServer, *, executor: str = "w1", **policy: Any) -> DeliveryLoop:
    return DeliveryLoop(
        engine,
        executor_id=executor,
        smtp=mail.SmtpConfig(host="127.0.0.1", port=smtp.port, security="none", from_address=FROM, timeout_seconds=5),
        approver_emails=APPROVERS,
        policy=mail.RetryPolicy(**{"interval_seconds": 0.05, "claim_seconds": 30.0, **policy}),
        poll_seconds=0.02,
    )


def rows(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {r.message_key: r for r in conn.execute(sa.select(outbox).order_by(outbox.c.id))}


def queue_customer(refund_id: str, customer: str = "cus_ada") -> str:
    notify_customer_step(refund_id, customer_id=customer, text=f"Your refund {refund_id} was paid.")
    return f"{refund_id}:customer"


def queue_approver(refund_id: str, approver: str = "dana") -> str:
    notify_approvers_step(refund_id, kind="request", messages={approver: f"Refund {refund_id} needs you: {LINK}"})
    return f"{refund_id}:approvers:request:{approver}"


def test_each_message_is_emailed_once_to_its_address_with_a_message_id_from_its_key(
    app: sa.Engine, smtp: MailServer
) -> None:
    customer, approver = queue_customer("r-once"), queue_approver("r-once")
    with app.connect() as conn:
        shown = customer_message(conn, "r-once")
    assert shown is not None and shown["delivery"] == "pending"
    worker = loop(app, smtp)
    assert worker.run_once() == 2
    assert worker.run_once() == 0  # nothing is due any more: nothing is sent again
    got = {m.message_id: m for m in smtp.messages()}
    assert len(smtp.messages()) == len(got) == 2
    to_customer = got[mail.message_id(customer, FROM)]
    assert to_customer.to == ("ada@example.com",) and "r-once was paid" in to_customer.body
    to_approver = got[mail.message_id(approver, FROM)]
    assert to_approver.to == ("dana@shop.example",) and LINK in to_approver.body
    assert mail.message_id(customer, FROM).endswith("@shop.example>")
    with app.connect() as conn:
        assert customer_message(conn, "r-once") == {**shown, "delivery": "sent"}  # GET /refunds/{id} shows it
    for key in (customer, approver):
        row = rows(app)[key]
        assert (row.delivery_state, row.attempts, row.last_error) == ("sent", 1, None)
        assert row.sent_at is not None and row.claim_token is None


def test_a_refused_send_is_retried_after_a_growing_wait_then_delivered(app: sa.Engine, smtp: MailServer) -> None:
    key = queue_customer("r-retry")
    smtp.refuse_next = 2  # 451 twice, then accepted
    worker = loop(app, smtp, interval_seconds=0.3, backoff_rate=2.0)
    waits = []
    assert worker.run_once() == 1  # the first attempt: refused
    for attempt in (1, 2):
        row = rows(app)[key]
        assert (row.delivery_state, row.attempts) == ("pending", attempt)
        assert row.last_error.startswith("SMTPDataError: 451")
        with app.connect() as conn:
            waits.append(row.next_attempt_ms - db_now_ms(conn))
        assert worker.run_once() == 0  # not due before its wait is over
        wait_for(lambda: worker.run_once() or None, timeout=5, what="the next attempt", interval=0.02)
    assert 150 < waits[0] <= 300 and 450 < waits[1] <= 600, waits  # 0.3 s, then 0.6 s
    row = rows(app)[key]
    assert (row.delivery_state, row.attempts, smtp.refused) == ("sent", 3, 2)
    assert [m.message_id for m in smtp.messages()] == [mail.message_id(key, FROM)]


def test_a_message_refused_on_every_attempt_is_recorded_failed_after_the_last_attempt(
    app: sa.Engine, smtp: MailServer
) -> None:
    key = queue_customer("r-fails")
    smtp.refuse_next = 100
    worker = loop(app, smtp, max_attempts=3, interval_seconds=0.01)

    def attempt_then_state() -> bool:
        worker.run_once()
        return bool(rows(app)[key].delivery_state == "failed")

    wait_for(attempt_then_state, timeout=10, what="the message recorded failed", interval=0.01)
    assert not worker.run_once()  # a failed row is never tried again
    row = rows(app)[key]
    assert (row.attempts, smtp.refused, smtp.messages()) == (3, 3, [])
    assert row.last_error.startswith("SMTPDataError: 451") and row.sent_at is None


def test_a_refused_recipient_or_a_missing_address_fails_at_the_first_attempt(app: sa.Engine, smtp: MailServer) -> None:
    refused, unknown = queue_approver("r-refused", "erin"), queue_approver("r-unknown", "frank")
    loop(app, smtp, max_attempts=5).run_once()
    assert (rows(app)[refused].delivery_state, rows(app)[refused].attempts) == ("failed", 1)
    assert "550" in rows(app)[refused].last_error
    assert (rows(app)[unknown].delivery_state, rows(app)[unknown].attempts) == ("failed", 1)
    assert "no email address for approvers recipient frank" in rows(app)[unknown].last_error
    assert smtp.messages() == []


def test_two_workers_on_one_database_send_each_message_once(app: sa.Engine, smtp: MailServer) -> None:
    keys = [queue_customer(f"r-pair-{i}") for i in range(30)]
    workers = [loop(app, smtp, executor="worker-a"), loop(app, smtp, executor="worker-b")]
    for worker in workers:
        worker.start()
    try:
        wait_for(lambda: len(smtp.messages()) >= len(keys), timeout=30, what="every message")
        wait_for(lambda: all(r.delivery_state == "sent" for r in rows(app).values()), timeout=10, what="recorded")
    finally:
        for worker in workers:
            worker.stop()
    sent = Counter(m.message_id for m in smtp.messages())
    assert sent == Counter({mail.message_id(key, FROM): 1 for key in keys})
    assert {r.claimed_by for r in rows(app).values()} <= {"worker-a", "worker-b"}


def test_the_smtp_password_is_never_logged_nor_recorded(
    app: sa.Engine, smtp: MailServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong, right = "wrong-password-0a1b2c3d4e5f", PASSWORD
    caplog.set_level(logging.DEBUG)
    for password, refund_id in ((wrong, "r-auth-1"), (right, "r-auth-2")):
        queue_customer(refund_id)
        config = mail.SmtpConfig("127.0.0.1", smtp.port, "none", FROM, USERNAME, password, timeout_seconds=5)
        worker = loop(app, smtp, max_attempts=1)
        worker.smtp = config
        worker.run_once()
        assert password not in repr(config)
    failed, sent = rows(app)["r-auth-1:customer"], rows(app)["r-auth-2:customer"]
    assert failed.delivery_state == "failed" and failed.last_error.startswith("SMTPAuthenticationError: 535")
    assert sent.delivery_state == "sent"
    for text in (caplog.text, failed.last_error):
        assert wrong not in text and right not in text


def test_outbox_messages_are_counted_by_channel_and_state_on_metrics(app: sa.Engine, smtp: MailServer) -> None:
    queue_customer("r-m-1"), queue_approver("r-m-1"), queue_approver("r-m-2", "erin")
    queue_customer("r-m-3")
    worker = loop(app, smtp)
    claim = mail.claim_next(app, executor_id="w1", token=worker.token, claim_seconds=30)  # r-m-1's customer message
    assert claim is not None and worker.smtp is not None
    mail.deliver(app, worker.smtp, claim, APPROVERS)
    mail.record_sent(app, claim)
    worker.run_once()
    queue_customer("r-m-4")  # still pending
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(app, None, ()))
    text = generate_latest(registry).decode()
    assert 'refund_agent_outbox_messages{channel="email",state="sent"} 2.0' in text
    assert 'refund_agent_outbox_messages{channel="email",state="pending"} 1.0' in text
    assert 'refund_agent_outbox_messages{channel="approvers",state="sent"} 1.0' in text
    assert 'refund_agent_outbox_messages{channel="approvers",state="failed"} 1.0' in text
    assert 'refund_agent_outbox_messages{channel="operators",state="pending"} 0.0' in text


def test_without_an_smtp_host_no_worker_sends_and_start_up_says_messages_stay_in_the_outbox(env: Env) -> None:
    settings = env.settings()
    assert runtime.outbox_delivery(settings) is None
    facts = StartupFacts(worker=True, model_label="m", seeded_orders=0, token_generated=True, admin_password_file=None)
    lines = [line for line in ready_lines(settings, facts) if "email" in line]
    assert lines == ["  email        not sent: SMTP_HOST is unset, messages stay in the outbox"]
    configured = env.settings(smtp_host="smtp.shop.example", email_from=FROM, smtp_password=PASSWORD)
    assert runtime.outbox_delivery(configured) is not None
    assert configured.email.summary() == f"via smtp.shop.example:587 (starttls) from {FROM}"
    assert PASSWORD not in repr(configured)


def test_email_settings_refuse_an_incomplete_or_clear_text_server() -> None:
    with pytest.raises(ValidationError, match="EMAIL_FROM"):
        Settings(smtp_host="smtp.shop.example")
    with pytest.raises(ValidationError, match="clear text"):
        Settings(smtp_host="smtp.shop.example", email_from=FROM, smtp_security="none", smtp_password=PASSWORD)
    with pytest.raises(ValidationError, match="not an email address"):
        Settings(approver_emails={"dana": "dana"})


def test_a_worker_killed_between_send_and_record_resends_once_with_the_same_message_id(
    env: Env, app: sa.Engine, smtp: MailServer, tmp_path: Path
) -> None:
    keys = [queue_customer("r-kill"), queue_approver("r-kill"), queue_customer("r-kill-2", "cus_grace")]
    variables = child_env(
        env.env_vars(
            SMTP_HOST="127.0.0.1",
            SMTP_PORT=str(smtp.port),
            SMTP_SECURITY="none",
            SMTP_USERNAME=USERNAME,
            SMTP_PASSWORD=PASSWORD,
            EMAIL_FROM=FROM,
            APPROVER_EMAILS='{"dana": "dana@shop.example"}',
            EMAIL_POLL_INTERVAL_SECONDS="0.05",
        ),
        drop=("REFUND_AGENT_CRASH_AT",),
    )
    logs = tmp_path / "logs"
    first = spawn(["worker"], env={**variables, "REFUND_AGENT_CRASH_AT": "after_email_sent"}, log=logs / "w1.log")
    try:
        first.wait(timeout=90)
    finally:
        stop(first)
    assert first.returncode == -signal.SIGKILL, (logs / "w1.log").read_text()[-3000:]
    assert [m.message_id for m in smtp.messages()] == [mail.message_id(keys[0], FROM)]  # sent, then killed
    assert rows(app)[keys[0]].delivery_state == "sending"  # ... before its record
    second = spawn(["worker"], env=variables, log=logs / "w2.log")
    try:
        wait_for(
            lambda: all(rows(app)[k].delivery_state == "sent" for k in keys), timeout=90, what="every message sent"
        )
    finally:
        stop(second)
    sent = Counter(m.message_id for m in smtp.messages())
    assert sent == Counter({mail.message_id(keys[0], FROM): 2, mail.message_id(keys[1], FROM): 1,
                            mail.message_id(keys[2], FROM): 1})  # fmt: skip
    assert rows(app)[keys[0]].attempts == 2
    output = "".join(p.read_text() for p in logs.glob("*.log"))
    assert f"email: via 127.0.0.1:{smtp.port} (none) from {FROM}" in output
    assert PASSWORD not in output


@pytest.mark.parametrize("security", ["starttls", "ssl"])
def test_a_tls_server_is_verified_and_logged_in_to_before_the_message_is_sent(
    app: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, security: mail.Security
) -> None:
    cert_file, key_file = self_signed_loopback_cert(tmp_path)
    server = TlsMailServer(security, cert_file, key_file)
    try:
        key = queue_customer(f"r-tls-{security}")
        worker = loop(app, smtp=server, max_attempts=1)
        worker.smtp = mail.SmtpConfig("127.0.0.1", server.port, security, FROM, USERNAME, PASSWORD, timeout_seconds=5)
        worker.run_once()  # the server's certificate is not trusted yet: refused
        untrusted = rows(app)[key]
        assert untrusted.delivery_state == "failed" and "CERTIFICATE_VERIFY_FAILED" in untrusted.last_error
        monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))  # now it is, as a CA the system trusts would be
        key = queue_customer(f"r-tls-{security}-2")
        worker.run_once()
        assert rows(app)[key].delivery_state == "sent"
        assert [m.message_id for m in server.messages()] == [mail.message_id(key, FROM)]
    finally:
        server.stop()


def test_a_claim_left_by_a_dead_worker_is_taken_over_only_once_its_lease_ran_out(
    app: sa.Engine, smtp: MailServer
) -> None:
    key = queue_customer("r-lease")
    dead = mail.claim_next(app, executor_id="worker-dead", token="t" * 32, claim_seconds=0.5)  # then it died
    assert dead is not None and dead.message_key == key
    survivor = loop(app, smtp, executor="worker-alive")
    assert survivor.run_once() == 0  # held: the lease has not run out
    wait_for(lambda: survivor.run_once() or None, timeout=5, what="the lease to run out", interval=0.05)
    row = rows(app)[key]
    assert (row.delivery_state, row.attempts, row.claimed_by) == ("sent", 2, "worker-alive")
    assert not mail.record_sent(app, dead)  # the dead worker's record, had it lived, is refused
    assert [m.message_id for m in smtp.messages()] == [mail.message_id(key, FROM)]


def test_messages_queued_before_the_delivery_migration_are_pending_and_undelivered(tmp_path: Path, env: Env) -> None:
    (tmp_path / "old").mkdir()
    empty = make_databases(env.backend, tmp_path / "old", migrated=False)
    try:
        upgrade(empty.app_url, "0013")
        engine = create_engine(empty.app_url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "INSERT INTO outbox (message_key, refund_id, channel, recipient, body, created_at) "
                        "VALUES ('r-old:customer', 'r-old', 'email', 'cus_ada', 'paid', CURRENT_TIMESTAMP)"
                    )
                )
            upgrade(empty.app_url)
            row = rows(engine)["r-old:customer"]
            assert (row.delivery_state, row.attempts, row.next_attempt_ms, row.sent_at) == ("pending", 0, 0, None)
        finally:
            engine.dispose()
    finally:
        drop_databases(empty)
