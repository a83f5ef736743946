"""The outbox's delivery loop: a daemon thread in each worker that sends due outbox rows by email.

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

from steps import mail

log = logging.getLogger(__name__)


class DeliveryLoop:
    """Claims, sends and records due outbox rows until stopped; each process that runs one has its own token."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        executor_id: str,
        smtp: mail.SmtpConfig,
        approver_emails: Mapping[str, str],
        policy: mail.RetryPolicy,
        poll_seconds: float,
    ) -> None:
        self.engine, self.executor_id, self.smtp = engine, executor_id, smtp
        self.approver_emails, self.policy, self.poll_seconds = dict(approver_emails), policy, poll_seconds
        self.token = secrets.token_hex(16)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outbox-delivery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the message in hand (a send is bounded by the SMTP timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.smtp.timeout_seconds * 4)

    def run_once(self) -> int:
        """Deliver every row due now (or until stopped); how many were attempted."""
        attempted = 0
        while not self._stop.is_set():
            claim = mail.claim_next(
                self.engine, executor_id=self.executor_id, token=self.token, claim_seconds=self.policy.claim_seconds
            )
            if claim is None:
                break
            attempted += 1
            try:
                mail.deliver(self.engine, self.smtp, claim, self.approver_emails)
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

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as error:  # a database blip: try again on the next poll
                log.warning("outbox delivery failed: %s: %s", type(error).__name__, error)
            self._stop.wait(self.poll_seconds)
