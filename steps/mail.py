"""Email delivery of outbox rows over SMTP: claim a due row, send it with a stable Message-ID, record the outcome.

Exactly once, as far as SMTP allows. A row is claimed in the database before it is sent (state ``sending``, this
worker's executor id, a token, a lease end on the database clock, one more attempt), so no two workers send it at
once; it is recorded ``sent`` after the server accepted it. SMTP has no idempotency of its own: a worker that dies
after the server accepted a message and before ``sent`` is recorded leaves the row claimed, and whoever claims it
next sends it again. That re-send carries the same ``Message-ID`` (derived from the row's message key), which mail
systems use to drop duplicates, and one crash in that window causes at most one re-send.
"""

from __future__ import annotations

import hashlib
import logging
import smtplib
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import formatdate
from typing import Literal

import sqlalchemy as sa

from steps.faults import crash_point
from steps.helpdesk_inbox import ticket_refunds
from steps.store import customers, db_now_ms, helpdesk_tickets, outbox, refunds

log = logging.getLogger(__name__)

PENDING, SENDING, SENT, FAILED = "pending", "sending", "sent", "failed"
DELIVERY_STATES = (PENDING, SENDING, SENT, FAILED)
#: The outbox channels email delivers: customers (``email``), approvers and operators.
EMAIL_CHANNELS = ("email", "approvers", "operators")
Security = Literal["starttls", "ssl", "none"]


@dataclass(frozen=True)
class SmtpConfig:
    host: str
    port: int
    security: Security
    from_address: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout_seconds: float = 30.0


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 8
    interval_seconds: float = 5.0
    backoff_rate: float = 2.0
    max_interval_seconds: float = 3600.0
    claim_seconds: float = 120.0

    def delay_after(self, attempt: int) -> float:
        """How long to wait after the ``attempt``-th failed attempt (1, 2, ...): exponential, capped."""
        return float(min(self.interval_seconds * self.backoff_rate ** (attempt - 1), self.max_interval_seconds))


@dataclass(frozen=True)
class Claim:
    """An outbox row this worker holds for one attempt."""

    row_id: int
    message_key: str
    refund_id: str
    channel: str
    recipient: str
    body: str
    attempt: int
    token: str
    ticket_id: str | None = None
    """The help-desk ticket the row is posted to (steps/helpdesk.py) instead of being emailed; None: by email."""


class PermanentFailure(Exception):
    """A message that no retry can deliver (the server refused every recipient, or there is no address)."""


def _due(now: int, executor_id: str, token: str) -> sa.ColumnElement[bool]:
    """Rows a worker may claim: pending and due, or claimed by a worker whose lease ran out, or claimed by an
    earlier process with this executor id (one live process per executor id: that one is dead)."""
    c = outbox.c
    return sa.or_(
        sa.and_(c.delivery_state == PENDING, c.next_attempt_ms <= now),
        sa.and_(
            c.delivery_state == SENDING,
            sa.or_(c.claim_until_ms < now, sa.and_(c.claimed_by == executor_id, c.claim_token != token)),
        ),
    )


def claim_next(
    engine: sa.Engine, *, executor_id: str, token: str, claim_seconds: float, email: bool = True, tickets: bool = False
) -> Claim | None:
    """Claim the oldest due row this worker delivers (a compare-and-set: one worker wins it); None when none is due.

    With ``tickets``, a row of a refund that came from a help-desk ticket is claimed with that ticket (it is posted
    there); without ``email``, only such rows are claimed (the rest wait in the outbox for a worker that emails)."""
    if not email and not tickets:
        return None
    c = outbox.c
    ticket = sa.select(helpdesk_tickets.c.ticket_id, helpdesk_tickets.c.refund_id).join(refunds, ticket_refunds())
    linked = ticket.subquery("linked")
    rows = outbox.outerjoin(linked, linked.c.refund_id == c.refund_id) if tickets else outbox
    for _ in range(5):  # another worker may win the row read here; the next due one is then tried
        with engine.begin() as conn:
            now = db_now_ms(conn)
            due = _due(now, executor_id, token)
            query = sa.select(c.id, linked.c.ticket_id if tickets else sa.null()).select_from(rows)
            query = query.where(c.channel.in_(EMAIL_CHANNELS), due)
            if not email:
                query = query.where(linked.c.ticket_id.is_not(None))
            found = conn.execute(query.order_by(c.id).limit(1)).first()
            if found is None:
                return None
            row_id, ticket_id = found
            won = conn.execute(
                outbox.update()
                .where(c.id == row_id, due)
                .values(
                    delivery_state=SENDING,
                    claimed_by=executor_id,
                    claim_token=token,
                    claim_until_ms=now + int(claim_seconds * 1000),
                    attempts=c.attempts + 1,
                )
                .returning(c.message_key, c.refund_id, c.channel, c.recipient, c.body, c.attempts)
            ).first()
        if won is not None:
            key, refund_id, channel, recipient, body, attempt = won
            return Claim(row_id, key, refund_id, channel, recipient, body, attempt, token, ticket_id)
    return None


def addresses(engine: sa.Engine, claim: Claim, approver_emails: Mapping[str, str]) -> list[str]:
    """Where a row goes: the customer's email, the approver's address, or every approver's for operator alerts."""
    if claim.channel == "approvers":
        found = [approver_emails[claim.recipient]] if claim.recipient in approver_emails else []
    elif claim.channel == "operators":
        found = sorted(set(approver_emails.values()))
    else:
        with engine.connect() as conn:
            email = conn.execute(
                sa.select(customers.c.email).where(customers.c.customer_id == claim.recipient)
            ).scalar_one_or_none()
        found = [email] if email else []
    if not found:
        raise PermanentFailure(f"no email address for {claim.channel} recipient {claim.recipient}")
    return found


def message_id(message_key: str, from_address: str) -> str:
    """The same Message-ID for every send of one outbox row, so a re-send is recognisably the same message."""
    domain = from_address.rpartition("@")[2].strip(" >") or "refund-agent.invalid"
    return f"<{hashlib.sha256(message_key.encode()).hexdigest()[:40]}.outbox@{domain}>"


def _subject(claim: Claim) -> str:
    if claim.channel == "approvers":
        return f"Refund {claim.refund_id} waits for your decision"
    if claim.channel == "operators":
        return f"Refund {claim.refund_id} needs an operator"
    return "About your refund request"


def build_message(config: SmtpConfig, claim: Claim, to: Sequence[str]) -> EmailMessage:
    message = EmailMessage()
    message["Message-ID"] = message_id(claim.message_key, config.from_address)
    message["From"] = config.from_address
    message["To"] = ", ".join(to)
    message["Subject"] = _subject(claim)
    message["Date"] = formatdate(localtime=False)
    message["Auto-Submitted"] = "auto-generated"  # RFC 3834: no auto-replies to it
    message.set_content(claim.body)
    return message


def send(config: SmtpConfig, message: EmailMessage) -> None:
    """Hand the message to the SMTP server (one connection per message); returns once the server accepted it."""
    smtp: smtplib.SMTP
    if config.security == "ssl":
        context = ssl.create_default_context()
        smtp = smtplib.SMTP_SSL(config.host, config.port, timeout=config.timeout_seconds, context=context)
    else:
        smtp = smtplib.SMTP(config.host, config.port, timeout=config.timeout_seconds)
    with smtp:
        if config.security == "starttls":
            smtp.starttls(context=ssl.create_default_context())
        if config.username is not None and config.password is not None:
            smtp.login(config.username, config.password)
        try:
            smtp.send_message(message)
        except smtplib.SMTPRecipientsRefused as error:
            if all(code >= 500 for code, _ in error.recipients.values()):
                raise PermanentFailure(f"every recipient refused: {_codes(error.recipients)}") from error
            raise
        except smtplib.SMTPDataError as error:
            if error.smtp_code >= 500:
                raise PermanentFailure(f"message refused: {error.smtp_code} {_text(error.smtp_error)}") from error
            raise


def _codes(recipients: Mapping[str, tuple[int, bytes]]) -> str:
    return ", ".join(f"{code} {_text(text)}" for code, text in recipients.values())


def _text(raw: bytes | str) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw


def describe(error: BaseException) -> str:
    """The error as recorded on the row: its type and the server's answer (never a credential; login does not
    echo the password), at most 500 characters."""
    if isinstance(error, smtplib.SMTPResponseException):
        text = f"{type(error).__name__}: {error.smtp_code} {_text(error.smtp_error)}"
    else:
        text = f"{type(error).__name__}: {error}"
    return " ".join(text.split())[:500]


def record_sent(engine: sa.Engine, claim: Claim) -> bool:
    """The row was delivered; False when the claim was taken over meanwhile (its lease ran out)."""
    c = outbox.c
    with engine.begin() as conn:
        done = conn.execute(
            outbox.update()
            .where(c.id == claim.row_id, c.claim_token == claim.token, c.delivery_state == SENDING)
            .values(delivery_state=SENT, sent_at=datetime.now(UTC), claim_token=None, claim_until_ms=None)
        )
    return done.rowcount == 1


def record_failure(engine: sa.Engine, claim: Claim, error: BaseException, policy: RetryPolicy) -> str:
    """Back to ``pending`` after a backoff, or ``failed`` once attempts run out or the failure is permanent."""
    c = outbox.c
    final = isinstance(error, PermanentFailure) or claim.attempt >= policy.max_attempts
    with engine.begin() as conn:
        retry_at = db_now_ms(conn) + int(policy.delay_after(claim.attempt) * 1000)
        conn.execute(
            outbox.update()
            .where(c.id == claim.row_id, c.claim_token == claim.token, c.delivery_state == SENDING)
            .values(
                delivery_state=FAILED if final else PENDING,
                next_attempt_ms=retry_at,
                claim_token=None,
                claim_until_ms=None,
                last_error=describe(error),
            )
        )
    return FAILED if final else PENDING


def deliver(engine: sa.Engine, config: SmtpConfig, claim: Claim, approver_emails: Mapping[str, str]) -> None:
    """Send one claimed row; raises what went wrong (``record_failure`` decides whether it is retried)."""
    message = build_message(config, claim, addresses(engine, claim, approver_emails))
    send(config, message)
    crash_point("after_email_sent")  # the server has it; ``sent`` is not recorded: the one window left
    log.info("message %s of refund %s sent by email (attempt %d)", claim.message_key, claim.refund_id, claim.attempt)


def delivery_counts(conn: sa.Connection) -> list[tuple[str, str, int]]:
    """(channel, delivery state, rows) over the whole outbox."""
    rows = conn.execute(
        sa.select(outbox.c.channel, outbox.c.delivery_state, sa.func.count()).group_by(
            outbox.c.channel, outbox.c.delivery_state
        )
    ).all()
    return [(channel, state, int(count)) for channel, state, count in rows]
