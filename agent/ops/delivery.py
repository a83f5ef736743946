"""The outbox's delivery loop: a daemon thread in each worker that sends due outbox rows by email, or posts them to
the help-desk ticket their refund came from.

A plain thread, not a DBOS scheduled workflow: a delivery is made safe by its claim in the application database
(steps/mail.py), which a checkpoint would not make safer (a step that sent and was not checkpointed is run again
just the same), while a schedule ticking every few seconds would write a workflow and its steps to the system
database on every tick, and run on one worker per tick instead of every worker sharing the backlog.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Mapping

import sqlalchemy as sa

from steps import helpdesk, mail

log = logging.getLogger(__name__)


class DeliveryLoop:
    """Claims, sends and records due outbox rows until stopped; each process that runs one has its own token.

    ``smtp`` emails rows; ``tickets`` posts the rows of refunds that came from a help-desk ticket to that ticket
    (with both, a ticket's refund is answered on its ticket and every other by email). One claim, lease and retry
    machinery serves both channels."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        executor_id: str,
        smtp: mail.SmtpConfig | None,
        approver_emails: Mapping[str, str],
        policy: mail.RetryPolicy,
        poll_seconds: float,
        tickets: helpdesk.TicketsConfig | None = None,
    ) -> None:
        self.engine, self.executor_id, self.smtp, self.tickets = engine, executor_id, smtp, tickets
        self.approver_emails, self.policy, self.poll_seconds = dict(approver_emails), policy, poll_seconds
        self.token = secrets.token_hex(16)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outbox-delivery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the message in hand (a send is bounded by its channel's timeout)."""
        self._stop.set()
        timeouts = [c.timeout_seconds for c in (self.smtp, self.tickets) if c is not None]
        if self._thread.is_alive():
            self._thread.join(timeout=max(timeouts, default=1.0) * 4)

    def run_once(self) -> int:
        """Deliver every row due now (or until stopped); how many were attempted."""
        attempted = 0
        while not self._stop.is_set():
            claim = mail.claim_next(
                self.engine,
                executor_id=self.executor_id,
                token=self.token,
                claim_seconds=self.policy.claim_seconds,
                email=self.smtp is not None,
                tickets=self.tickets is not None,
            )
            if claim is None:
                break
            attempted += 1
            try:
                self._deliver(claim)
            except Exception as error:
                state = mail.record_failure(self.engine, claim, error, self.policy)
                log.warning(
                    "message %s of refund %s: attempt %d failed (%s), now %s",
                    claim.message_key,
                    claim.refund_id,
                    claim.attempt,
                    mail.describe(error),
                    state,
                )
                continue
            if not mail.record_sent(self.engine, claim):
                log.warning("message %s was sent after its claim ran out; another worker held it", claim.message_key)
        return attempted

    def _deliver(self, claim: mail.Claim) -> None:
        if claim.ticket_id is not None and self.tickets is not None:
            helpdesk.deliver(self.tickets, claim)
        elif self.smtp is not None:
            mail.deliver(self.engine, self.smtp, claim, self.approver_emails)
        else:  # claim_next hands out no such row; say so rather than record it sent
            raise mail.PermanentFailure(f"no channel delivers message {claim.message_key}")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as error:  # a database blip: try again on the next poll
                log.warning("outbox delivery failed: %s: %s", type(error).__name__, error)
            self._stop.wait(self.poll_seconds)
