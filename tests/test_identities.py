"""Who asks and who decides: identities come from the channel, the requester never decides, scopes hold.

Against a real `refund-agent serve` (tests/live.py) on SQLite and Postgres, as an attacker would try it:
the client that asked tries every channel to approve its own refund; a client reads another's refunds and
reuses its key; a revoked key is used; a typed name tries to pass for someone; an approver goes past its
authority; a Slack user who is not on the allow-list clicks Approve.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pwd
import subprocess
import time
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from pydantic import ValidationError

from agent import tokens
from agent.settings import Settings
from steps import clients
from steps.store import app_db
from tests import web, zygote
from tests.conftest import Env
from tests.console_server import csrf_of
from tests.identities import DANA_PASSWORD, SLACK_DANA, link_token, operators_json
from tests.live import LiveService, live_service
from tests.test_secrets import refund_agent

FORM = "application/x-www-form-urlencoded"


def _key(name: str, scopes: str, operator: str | None = None) -> str:
    _, key = clients.add_client(app_db().engine, name=name, scopes=scopes, operator=operator)
    return key


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _submit(svc: LiveService, key: str, refund_id: str, order_id: str = "ord_1002") -> httpx.Response:
    body = {"order_id": order_id, "message": "The desk arrived broken."}
    return svc.http.post("/refunds", json=body, headers={**_bearer(key), "Idempotency-Key": refund_id})


def _slack_click(svc: LiveService, token: str, slack_id: str) -> str:
    team, user = slack_id.split("/")
    payload: dict[str, Any] = {"type": "block_actions", "team": {"id": team}}
    payload["user"] = {"id": user, "team_id": team, "username": "dana"}
    payload["actions"] = [{"action_id": "approve", "value": token}]
    body = urlencode({"payload": json.dumps(payload)})
    stamp = str(int(time.time()))
    secret = svc.keys.slack_signing_secret.encode()
    signature = "v0=" + hmac.new(secret, f"v0:{stamp}:{body}".encode(), hashlib.sha256).hexdigest()
    headers = {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature, "Content-Type": FORM}
    answer = svc.http.post("/slack/interactions", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["text"])


def _slack_token(svc: LiveService, refund_id: str, expires_at: str) -> str:
    """A Slack button's token for the refund (as the service signs the one it posts)."""
    claims = tokens.ApprovalClaims(refund_id, Decimal("4200.00"), "USD", datetime.fromisoformat(expires_at), "slack")
    return tokens.sign(claims, svc.keys.signing_secret.encode())


def _console_decision(svc: LiveService, refund_id: str) -> httpx.Response:
    """dana signs in to the console and presses Approve on the refund's page."""
    with web.client(base_url=svc.base, timeout=30) as http:
        signed_in = http.post(
            "/console/login",
            data={"name": "dana", "password": DANA_PASSWORD, "csrf": csrf_of(http), "next": "/console"},
        )
        assert signed_in.status_code == 303, signed_in.text
        fields = {"decision": "approve", "amount": "4200.00", "currency": "USD", "confirmed": "yes"}
        return http.post(
            f"/console/refunds/{refund_id}/decision",
            data={**fields, "csrf": csrf_of(http, f"/console/refunds/{refund_id}")},
        )


def _cli(svc: LiveService, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return zygote.run(args, env={**os.environ, **svc.vars, **(env or {})})


def _undecided(svc: LiveService, refund_id: str) -> dict[str, Any]:
    status = svc.status(refund_id, svc.approver)
    assert status["status"] == "awaiting_approval" and status["approval"]["decision"] is None, status
    return status


def test_the_requester_cannot_decide_its_own_refund_through_any_channel(env: Env, tmp_path: Path) -> None:
    """A client that may submit AND decide, acting for the operator dana (who approves in the console, by link
    and from Slack), asks for a refund; neither it nor dana can decide it, whatever the channel."""
    with live_service(env, tmp_path) as (svc, _):
        made = _cli(
            svc, "clients", "add", "dana-bot", "--scopes", "refunds:create,approvals:decide", "--operator", "dana"
        )
        assert made.returncode == 0 and "dana-bot" in made.stderr, made.stderr
        bot = made.stdout.strip()  # the key, alone on stdout
        assert _submit(svc, bot, "self-serve-0001").status_code == 202
        waiting = svc.until("self-serve-0001", "awaiting_approval", headers=svc.approver)
        assert waiting["requested_by"] == "client:dana-bot" and waiting["requester_operator"] == "dana"
        expires = waiting["approval"]["request"]["expires_at"]

        # The API: the requesting client may decide refunds in general, but never this one.
        mine = svc.http.get("/refunds/self-serve-0001", headers=_bearer(bot)).json()
        assert "token" not in mine["approval"] and "approve_url" not in mine["approval"]
        body = {"decision": "approve", "amount": "4200.00", "currency": "USD"}
        api = svc.http.post("/refunds/self-serve-0001/approval", json=body, headers=_bearer(bot))
        assert api.status_code == 403 and "requester" in api.json()["detail"]

        # A link: none was sent to dana; one bound to her (genuinely signed) is refused all the same.
        assert link_token(app_db().engine, "self-serve-0001", "dana") is None
        claims = tokens.ApprovalClaims(
            "self-serve-0001", Decimal("4200.00"), "USD", datetime.fromisoformat(expires), "operator:dana"
        )
        forged_link = tokens.sign(claims, svc.keys.signing_secret.encode())
        link = svc.http.post(f"/approve/{forged_link}", content="decision=approve", headers={"Content-Type": FORM})
        assert link.status_code == 403 and "requester" in link.text

        # Slack: dana's allow-listed Slack id decides as dana, who acts through the requesting client.
        assert "requester" in _slack_click(svc, _slack_token(svc, "self-serve-0001", expires), SLACK_DANA)

        # The console: dana signed in.
        console = _console_decision(svc, "self-serve-0001")
        assert console.status_code == 403 and "requester" in console.text

        # The command line: the OS user that submitted cannot approve.
        submitted = _cli(svc, "submit", "ord_1009", "--message", "Broken.", "--key", "self-serve-cli1")
        assert submitted.returncode == 0, submitted.stderr
        svc.until("self-serve-cli1", "awaiting_approval", headers=svc.approver)
        cli = _cli(svc, "approve", "self-serve-cli1")
        assert cli.returncode == 2 and "requester" in cli.stderr

        _undecided(svc, "self-serve-0001")
        _undecided(svc, "self-serve-cli1")
        assert env.sandbox.refunds() == []
        # Someone else decides: the approvals desk over the API.
        assert svc.decide("self-serve-0001", "approve", "4200.00").status_code == 200
        done = svc.until("self-serve-0001", "completed", "rejected", "failed", headers=_bearer(bot))
        assert done["status"] == "completed" and done["approval"]["approver"] == "client:approvals-desk"
        assert len(env.sandbox.refunds("ch_ord_1002")) == 1


def test_a_client_reads_and_touches_only_what_its_scopes_and_its_own_requests_allow(env: Env, tmp_path: Path) -> None:
    with live_service(env, tmp_path) as (svc, _):
        reader = _key("reader-b", "refunds:read")
        assert svc.submit("scoped-0000001", "ord_1002").status_code == 202  # the help desk's refund
        svc.until("scoped-0000001", "awaiting_approval")

        # Another client with refunds:read cannot see it, list it, reuse its key, submit or decide.
        assert svc.http.get("/refunds/scoped-0000001", headers=_bearer(reader)).status_code == 404
        assert svc.http.get("/refunds", headers=_bearer(reader)).json()["items"] == []
        assert _submit(svc, reader, "scoped-0000001").status_code == 403  # no refunds:create
        creator = _key("creator-c", "refunds:create")
        reused = _submit(svc, creator, "scoped-0000001")
        assert reused.status_code == 409 and "another client" in reused.json()["detail"]
        body = {"decision": "approve", "amount": "4200.00", "currency": "USD"}
        assert svc.http.post("/refunds/scoped-0000001/approval", json=body, headers=_bearer(reader)).status_code == 403
        # Its requester reads it without a link; the approvals desk reads it with a link bound to itself.
        own = svc.status("scoped-0000001")
        assert own["requested_by"] == "client:default" and "token" not in own["approval"]
        desk = svc.http.get("/refunds/scoped-0000001", headers=svc.approver).json()
        assert tokens.verify(desk["approval"]["token"], svc.keys.signing_secret.encode()).approver == (
            "client:approvals-desk"
        )

        # Revocation is immediate: the next request with the key is refused.
        assert svc.http.get("/refunds", headers=_bearer(reader)).status_code == 200
        revoked = _cli(svc, "clients", "revoke", "reader-b")
        assert revoked.returncode == 0, revoked.stderr
        assert svc.http.get("/refunds", headers=_bearer(reader)).status_code == 401
        listed = _cli(svc, "clients", "list").stdout
        assert "reader-b" in listed and "revoked" in listed and reader not in listed
        assert svc.status("scoped-0000001")["approval"]["decision"] is None
        assert env.sandbox.refunds() == []


def test_nobody_can_type_a_name_to_pass_for_an_approver(env: Env, tmp_path: Path) -> None:
    limits = json.dumps({"client:junior-desk": {"USD": "500.00"}})
    with live_service(env, tmp_path, APPROVAL_LIMITS=limits) as (svc, _):
        junior = _key("junior-desk", "approvals:decide")
        assert svc.submit("typed-name-0001", "ord_1002").status_code == 202
        waiting = svc.until("typed-name-0001", "awaiting_approval")
        expires = waiting["approval"]["request"]["expires_at"]
        typed = {"decision": "approve", "amount": "4200.00", "currency": "USD", "approver": "console:sam"}
        assert svc.http.post("/refunds/typed-name-0001/approval", json=typed, headers=svc.approver).status_code == 422
        text = _slack_click(svc, _slack_token(svc, "typed-name-0001", expires), "T0001/U0666")  # not allow-listed
        assert "not an approver" in text
        # A genuine link bound to someone who is not (or no longer) an approver decides nothing.
        for gone in ("operator:eve", "client:no-such-client", "client:default"):
            claims = tokens.ApprovalClaims(
                "typed-name-0001", Decimal("4200.00"), "USD", datetime.fromisoformat(expires), gone
            )
            stale = tokens.sign(claims, svc.keys.signing_secret.encode())
            answer = svc.http.post(f"/approve/{stale}", content="decision=approve", headers={"Content-Type": FORM})
            assert answer.status_code == 403 and "may no longer decide" in answer.text, gone
        # Approval authority: the junior desk may approve up to 500.00 USD; it may still reject.
        body = {"decision": "approve", "amount": "4200.00", "currency": "USD"}
        over = svc.http.post("/refunds/typed-name-0001/approval", json=body, headers=_bearer(junior))
        assert over.status_code == 403 and "500.00 USD" in over.json()["detail"]
        _undecided(svc, "typed-name-0001")
        added = _cli(svc, "clients", "add", "operator:dana", "--scopes", "approvals:decide")
        assert added.returncode == 2 and "no ':'" in added.stderr
        rejected = svc.http.post(
            "/refunds/typed-name-0001/approval", json={**body, "decision": "reject"}, headers=_bearer(junior)
        )
        assert rejected.status_code == 200 and rejected.json()["approver"] == "client:junior-desk"
        assert svc.until("typed-name-0001", "rejected")["approval"]["via"] == "api"
        assert env.sandbox.refunds() == []


@pytest.mark.parametrize(
    "variable",
    [
        {"refund_agent_operators": {"console:sam": "admin:scrypt$16384$8$1$c2FsdA$aGFzaA"}},
        {"slack_approvers": {"T0001/U0001": "console:sam"}},
        {"approval_limits": {"sam": {"USD": "1.00"}}},
    ],
    ids=["operator name with a channel prefix", "Slack approver mapped to a prefixed name", "limit without a kind"],
)
def test_settings_refuse_names_that_carry_a_channel_prefix(variable: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Settings(**variable)


def _operators(**roles: str) -> str:
    """``REFUND_AGENT_OPERATORS`` with dana (approver) and these operators (name -> role)."""
    from agent.console.auth import hash_password

    configured = json.loads(operators_json())
    configured |= {name: f"{role}:{hash_password(f'{name}-passphrase')}" for name, role in roles.items()}
    return json.dumps(configured)


def _waiting(svc: LiveService, key: str, order_id: str, by: str) -> dict[str, Any]:
    """A refund ``by`` (a client's key) submitted and the service parked for a person."""
    assert _submit(svc, by, key, order_id).status_code == 202
    return svc.until(key, "awaiting_approval", headers=svc.approver)


def test_a_person_is_one_requester_and_one_limit_whichever_client_or_command_line_acts_for_them(
    env: Env, tmp_path: Path
) -> None:
    """henry asks through one client and decides through another; the OS user running the command line is an
    operator too. Each is that person in every check: the requester's, and their approval limit."""
    me = pwd.getpwuid(os.getuid()).pw_name  # the command line's person: its real user, whatever USER says
    limits = {"operator:henry": {"USD": "100.00"}, f"operator:{me}": {"USD": "50.00"}}
    operators = _operators(henry="approver", **{me: "approver"})
    with live_service(env, tmp_path, APPROVAL_LIMITS=json.dumps(limits), REFUND_AGENT_OPERATORS=operators) as (svc, _):
        henry_desk = _key("helpdesk-henry", "refunds:create,refunds:read", operator="henry")
        henry_bot = _key("bot-henry", "approvals:decide", operator="henry")
        mine = _key("helpdesk-me", "refunds:create", operator=me)
        waiting = _waiting(svc, "person-henry-01", "ord_1002", henry_desk)
        assert (waiting["requested_by"], waiting["requester_operator"]) == ("client:helpdesk-henry", "henry")

        # henry's other client: no link in its view, refused over the API and through a link bound to it.
        assert "token" not in svc.http.get("/refunds/person-henry-01", headers=_bearer(henry_bot)).json()["approval"]
        body = {"decision": "approve", "amount": "4200.00", "currency": "USD"}
        api = svc.http.post("/refunds/person-henry-01/approval", json=body, headers=_bearer(henry_bot))
        assert api.status_code == 403 and "requester" in api.json()["detail"], api.text
        expires = datetime.fromisoformat(waiting["approval"]["request"]["expires_at"])
        claims = tokens.ApprovalClaims("person-henry-01", Decimal("4200.00"), "USD", expires, "client:bot-henry")
        bound = tokens.sign(claims, svc.keys.signing_secret.encode())
        link = svc.http.post(f"/approve/{bound}", content="decision=approve", headers={"Content-Type": FORM})
        assert link.status_code == 403 and "requester" in link.text

        # henry's limit holds through his client, on a refund someone else asked for.
        other = _waiting(svc, "person-henry-02", "ord_1009", svc.keys.api_token)["approval"]["request"]
        body = {"decision": "approve", "amount": other["amount"], "currency": "USD"}
        over = svc.http.post("/refunds/person-henry-02/approval", json=body, headers=_bearer(henry_bot))
        assert over.status_code == 403 and "operator:henry" in over.json()["detail"], over.text
        assert "100.00 USD" in over.json()["detail"]
        # A client acting for someone who is not (or no longer) an operator who decides, decides nothing.
        ghost = _key("bot-ghost", "approvals:decide", operator="ghost")
        gone = svc.http.post("/refunds/person-henry-02/approval", json=body, headers=_bearer(ghost))
        assert gone.status_code == 403 and "operator:ghost, who may not decide" in gone.json()["detail"], gone.text

        # The command line decides as its real user whatever USER says, and as the operator of that name.
        mallory = {"USER": "mallory", "LOGNAME": "mallory"}
        _waiting(svc, "person-cli-0001", "ord_1012", mine)
        own = _cli(svc, "approve", "person-cli-0001", env=mallory)
        assert own.returncode == 2 and "requester" in own.stderr, own.stderr
        limited = _cli(svc, "approve", "person-henry-02", env=mallory)
        assert limited.returncode == 2 and "50.00 USD" in limited.stderr and f"operator:{me}" in limited.stderr
        rejected = _cli(svc, "reject", "person-henry-02", env=mallory)
        assert rejected.returncode == 0, rejected.stderr
        decided = svc.until("person-henry-02", "rejected", headers=svc.approver)["approval"]
        assert (decided["approver"], decided["via"]) == (f"cli:{me}", "cli")
        _undecided(svc, "person-henry-01")
        _undecided(svc, "person-cli-0001")
        assert env.sandbox.refunds() == []


def test_slack_decides_only_with_its_own_buttons_and_only_for_an_operator_who_may_decide(
    env: Env, tmp_path: Path
) -> None:
    """A genuine token bound to an operator or a client is not a Slack button; a Slack id mapped to a viewer, or
    to an operator no longer configured, decides nothing. The allow-listed approver then decides."""
    slack = {SLACK_DANA: "dana", "T0001/U0002": "vic", "T0001/U0003": "gone"}
    operators = _operators(vic="viewer")
    with live_service(env, tmp_path, REFUND_AGENT_OPERATORS=operators, SLACK_APPROVERS=json.dumps(slack)) as (svc, _):
        assert svc.submit("slack-only-0001", "ord_1002").status_code == 202
        expires = svc.until("slack-only-0001", "awaiting_approval")["approval"]["request"]["expires_at"]
        for bound in ("operator:dana", "client:approvals-desk"):
            claims = tokens.ApprovalClaims(
                "slack-only-0001", Decimal("4200.00"), "USD", datetime.fromisoformat(expires), bound
            )
            text = _slack_click(svc, tokens.sign(claims, svc.keys.signing_secret.encode()), SLACK_DANA)
            assert "not one of Slack's buttons" in text, (bound, text)
        button = _slack_token(svc, "slack-only-0001", expires)
        viewer = _slack_click(svc, button, "T0001/U0002")
        assert "maps to vic, who may not decide" in viewer, viewer
        removed = _slack_click(svc, button, "T0001/U0003")
        assert "maps to gone, who may not decide" in removed, removed
        _undecided(svc, "slack-only-0001")
        assert env.sandbox.refunds() == []
        assert "approve by operator:dana" in _slack_click(svc, button, SLACK_DANA)
        assert svc.until("slack-only-0001", "completed")["approval"]["via"] == f"slack:{SLACK_DANA}"


def test_a_client_acts_only_for_an_operator_the_service_has(tmp_path: Path) -> None:
    """`clients add --operator` names a configured operator (the generated admin when none is, a provider's user
    with single sign-on) or is refused: a mistyped name would make a client whose refunds its person could still
    decide, and which itself decides nothing."""

    def add(name: str, operator: str, **variables: str) -> subprocess.CompletedProcess[str]:
        key_file = str(tmp_path / f"{name}.key")
        return refund_agent(
            tmp_path, "clients", "add", name, "--scopes", "approvals:decide", "--operator", operator,
            "--key-file", key_file, **variables,
        )  # fmt: skip

    ghost = add("bot-ghost", "ghost")
    assert ghost.returncode == 2 and "no operator 'ghost' is configured" in ghost.stderr, ghost.stderr
    assert not (tmp_path / "bot-ghost.key").exists()  # no key: no client
    assert add("bot-admin", "admin").returncode == 0  # none configured: the generated admin is the operator
    dana_configured = {"REFUND_AGENT_OPERATORS": operators_json()}
    assert add("bot-dana", "dana", **dana_configured).returncode == 0
    not_admin = add("bot-admin-2", "admin", **dana_configured)
    assert not_admin.returncode == 2 and "names dana" in not_admin.stderr, not_admin.stderr
    sso = {"OIDC_ISSUER_URL": "http://127.0.0.1:9/realm", "OIDC_CLIENT_ID": "console", "OIDC_CLIENT_SECRET": "s"}
    assert add("bot-sso", "oidc.ada", **dana_configured, **sso).returncode == 0
    assert add("bot-sso-2", "oidc.ada", **dana_configured).returncode == 2  # no provider: no provider's users
    listed = refund_agent(tmp_path, "clients", "list").stdout
    assert "bot-dana" in listed and "bot-ghost" not in listed and "bot-admin-2" not in listed
