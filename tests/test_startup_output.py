"""`refund-agent serve` starts quietly and ends its start-up saying where everything is; read commands print
their answer only."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from agent.ops.processes import free_port, http_ok, spawn, stop, wait_for
from steps.seed import demo_charges
from tests import web, zygote
from tests.test_secrets import clean_env, refund_agent

MAX_STARTUP_LINES = 15


@pytest.fixture(autouse=True)
def _cold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start as an operator's: a fresh interpreter that imports everything, not a fork of the warm launcher."""
    monkeypatch.setenv(zygote.COLD_ENV, "1")


def test_serve_says_where_everything_is_in_under_15_lines_and_no_secret(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(
        tmp_path,
        REFUND_AGENT_PORT=str(port),
        PAYMENTS_SANDBOX_PORT=str(free_port()),
        EVIDENCE_SANDBOX_PORT=str(free_port()),
    )
    log = tmp_path / "logs" / "serve.log"
    proc = spawn(["serve"], env=env, log=log)
    base = f"http://127.0.0.1:{port}"
    data = tmp_path / "data"
    try:
        wait_for(lambda: "API token" in log.read_text() or proc.poll() is not None, timeout=90, what="the ready block")
        assert proc.poll() is None, log.read_text()[-3000:]
        assert http_ok(f"{base}/readyz")
        startup = log.read_text().splitlines()
        assert len(startup) < MAX_STARTUP_LINES, "\n".join(startup)
        text = "\n".join(startup)
        assert f"API          {base}" in text
        assert f"{base}/console" in text
        assert f"{base}/docs" in text
        assert f"API token    in {data.resolve() / 'api_token'}" in text
        assert f"password in {data.resolve() / 'console_admin_password'}" in text
        assert f"demo orders  {len(demo_charges())} seeded" in text
        assert "model: offline model" in text
        assert "application database at revision" in text  # the migrations' one line
        assert text.count("email        not sent: SMTP_HOST is unset, messages stay in the outbox") == 1
        for secret in ("api_token", "console_admin_password", "audit.key", "approval_signing.key"):
            value = (data / secret).read_text().strip()
            assert value and value not in text, f"the value of {secret} was printed"

        token = (data / "api_token").read_text().strip()
        with web.client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            body = {"order_id": "ord_1001", "message": "It arrived broken."}
            accepted = http.post("/refunds", json=body, headers={"Idempotency-Key": "quiet-steps-01"})
            assert accepted.status_code == 202, accepted.text
            wait_for(
                lambda: http.get("/refunds/quiet-steps-01").json()["status"] == "completed",
                timeout=60,
                what="the refund to complete",
            )
        steps = refund_agent(tmp_path, "steps", "quiet-steps-01", **_ports(env))
        assert steps.returncode == 0, steps.stderr
        assert steps.stderr == "", steps.stderr  # no INFO lines before the answer
        assert steps.stdout.startswith("Steps of refund quiet-steps-01"), steps.stdout
    finally:
        stop(proc)
    # Stopped (SIGTERM), it says so, what it waits for, and when it is done.
    ending = log.read_text().splitlines()[-4:]
    assert "refund-agent stopping: no new requests; refunds in flight get 20s to finish" in ending, ending
    assert ending[-1] == "refund-agent stopped" and proc.returncode == 0, ending


def _ports(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.endswith("_PORT")}


def test_a_read_command_prints_only_its_answer(tmp_path: Path) -> None:
    found = refund_agent(tmp_path, "steps", "no-such-refund")
    assert found.returncode == 1
    assert found.stdout == ""
    assert found.stderr == "no refund no-such-refund\n"  # the answer, without migration or DBOS lines


def test_a_command_run_in_this_process_leaves_the_garbage_collector_as_it_found_it() -> None:
    """The command line turns the cyclic collector off while a command imports what it needs; a caller that runs
    ``main`` in its own process (a test, a script) gets it back on, however the command ends."""
    from agent.cli import main

    assert gc.isenabled()
    with pytest.raises(SystemExit):
        main(["--help"])
    assert gc.isenabled()
