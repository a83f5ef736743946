"""Secrets: ours are refused blank or shorter than 32 bytes, keys others issue are refused blank, by every
command before it does anything, with a message naming the variable and never the value; generated secrets
are 32 random bytes, one per data directory even when processes start at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from agent.settings import (
    ISSUED_KEYS,
    MIN_SECRET_BYTES,
    OWN_SECRETS,
    MissingSecret,
    Settings,
    settings_problems,
)
from tests import zygote

SHORT = "short-secret-16b"  # 16 bytes: what an attacker guesses or a copy-paste truncates
assert len(SHORT.encode()) == 16
LONG_ENOUGH = "x" * MIN_SECRET_BYTES


def clean_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    """This environment without any setting (so nothing from the caller's shell decides), plus ``variables``."""
    names = {name.upper() for name in Settings.variables()}
    env = {k: v for k, v in os.environ.items() if k.upper() not in names and not k.startswith(("DBOS_", "REFUND_"))}
    return {**env, "REFUND_AGENT_DATA_DIR": str(tmp_path / "data"), **variables}


def refund_agent(tmp_path: Path, *args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    return zygote.run(args, env=clean_env(tmp_path, **variables), cwd=tmp_path)


def settings(**values: Any) -> Settings:
    """Settings as a process gets them (its environment read too), with these values given."""
    return Settings(**values)


def _refusal(field: str, value: str) -> list[str]:
    with pytest.raises(ValidationError) as refused:
        settings(**{field: value})
    return settings_problems(refused.value)


@pytest.mark.parametrize("value", ["", "   ", SHORT, "y" * (MIN_SECRET_BYTES - 1)], ids=["blank", "spaces", "16", "31"])
@pytest.mark.parametrize("field", OWN_SECRETS)
def test_our_secrets_are_refused_blank_or_shorter_than_32_bytes(field: str, value: str) -> None:
    [problem] = _refusal(field, value)
    assert problem.startswith(f"{field.upper()}: ")
    assert ("blank" if not value.strip() else "shorter than 32 bytes") in problem
    assert not value.strip() or value not in problem


@pytest.mark.parametrize("field", OWN_SECRETS)
def test_our_secrets_of_32_bytes_are_accepted(field: str) -> None:
    value = settings(**{field: LONG_ENOUGH}).value_of(field)
    assert isinstance(value, SecretStr) and value.get_secret_value() == LONG_ENOUGH


@pytest.mark.parametrize("field", ISSUED_KEYS)
def test_keys_issued_by_others_are_refused_blank_only(field: str) -> None:
    [problem] = _refusal(field, " ")
    assert problem.startswith(f"{field.upper()}: ") and "blank" in problem
    assert settings(**{field: "sk_1"}) is not None  # their issuer chose the length


def test_every_invalid_setting_is_named_at_once_without_its_value() -> None:
    with pytest.raises(ValidationError) as refused:
        settings(refund_agent_api_token="", approval_signing_secret=SHORT, refund_agent_audit_key=SHORT)
    problems = settings_problems(refused.value)
    assert [p.split(":")[0] for p in problems] == [
        "REFUND_AGENT_API_TOKEN",
        "APPROVAL_SIGNING_SECRET",
        "REFUND_AGENT_AUDIT_KEY",
    ]
    assert SHORT not in "\n".join(problems)


#: (command, variable, value): each command the operator starts, stopped by a blank and by a 16-byte secret.
STOPPED = [
    ("serve", "REFUND_AGENT_API_TOKEN", ""),
    ("serve", "REFUND_AGENT_AUDIT_KEY", SHORT),
    ("worker", "APPROVAL_SIGNING_SECRET", ""),
    ("worker", "STRIPE_WEBHOOK_SECRET", SHORT),
    ("demo", "REFUND_AGENT_SESSION_SECRET", ""),
    ("demo", "SLACK_SIGNING_SECRET", SHORT),
    ("worker", "PAYMENTS_API_KEY", ""),
]


@pytest.mark.parametrize(("command", "variable", "value"), STOPPED)
def test_a_blank_or_short_secret_stops_the_process_before_it_does_anything(
    tmp_path: Path, command: str, variable: str, value: str
) -> None:
    done = refund_agent(tmp_path, command, **{variable: value})
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"refused to start: invalid settings\n  {variable}: " in done.stderr
    assert not value or value not in done.stdout + done.stderr
    assert not (tmp_path / "data").exists()  # no database, no generated secret, no child process


def test_every_command_refuses_invalid_settings(tmp_path: Path) -> None:
    """One process runs the command line's ``main`` for each command, with a blank API token."""
    commands = [
        ["migrate"],
        ["seed"],
        ["worker"],
        ["serve"],
        ["sandbox-payments"],
        ["submit", "ord_1001", "--message", "hi", "--key", "k-000001"],
        ["status", "r"],
        ["steps", "r"],
        ["approve", "r", "--approver", "dana"],
        ["reject", "r", "--approver", "dana"],
        ["hash-password"],
        ["audit", "verify"],
        ["demo"],
        ["chaos"],
        ["eval"],
    ]
    script = f"import json, sys\nfrom agent.cli import main\nprint(json.dumps([main(argv) for argv in {commands!r}]))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=clean_env(tmp_path, REFUND_AGENT_API_TOKEN=""),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [2] * len(commands)
    assert done.stderr.count("REFUND_AGENT_API_TOKEN: is blank") == len(commands)
    assert not (tmp_path / "data").exists()


def test_generated_secrets_are_32_random_bytes_kept_0600(tmp_path: Path) -> None:
    settings = Settings(refund_agent_data_dir=tmp_path / "data")
    key = settings.audit_key()
    assert len(key) >= MIN_SECRET_BYTES and key != settings.signing_secret()
    assert (tmp_path / "data" / "audit.key").stat().st_mode & 0o777 == 0o600
    assert Settings(refund_agent_data_dir=tmp_path / "data").audit_key() == key  # kept, not made again


def test_processes_starting_at_once_generate_one_secret(tmp_path: Path) -> None:
    found: list[bytes] = []
    start = threading.Barrier(8)

    def generate() -> None:
        start.wait()
        found.append(Settings(refund_agent_data_dir=tmp_path / "data").signing_secret())

    threads = [threading.Thread(target=generate) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == 8 and len(set(found)) == 1 and len(found[0]) >= MIN_SECRET_BYTES
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["approval_signing.key"]  # nothing staged left


def test_a_generated_secret_file_left_blank_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "api_token").write_text("\n")
    with pytest.raises(ValueError, match="shorter than 32 bytes"):
        Settings(refund_agent_data_dir=tmp_path / "data").api_token()


@pytest.mark.parametrize("length", [1, 16, 31])
@pytest.mark.parametrize("name", ["api_token", "approval_signing.key", "audit.key", "console_session.key"])
def test_a_generated_secret_file_of_1_to_31_bytes_is_refused(tmp_path: Path, name: str, length: int) -> None:
    """A secret file cut short (a truncated copy, a hand-made file) is never used: it is as guessable as its length."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / name).write_text("k" * length + "\n")
    settings = Settings(refund_agent_data_dir=tmp_path / "data")
    read = {
        "api_token": settings.api_token,
        "approval_signing.key": settings.signing_secret,
        "audit.key": settings.audit_key,
        "console_session.key": settings.session_secret,
    }[name]
    with pytest.raises(ValueError, match=f"{name} holds a secret shorter than 32 bytes: remove the file"):
        read()
    (tmp_path / "data" / name).write_text("k" * MIN_SECRET_BYTES)
    assert len(read()) == MIN_SECRET_BYTES  # 32 bytes are enough


def test_checking_the_audit_chain_never_generates_a_key(tmp_path: Path) -> None:
    with pytest.raises(MissingSecret):
        Settings(refund_agent_data_dir=tmp_path / "data").audit_key(generate=False)
    assert not (tmp_path / "data" / "audit.key").exists()


def test_a_dot_env_others_may_read_is_read_with_a_warning(tmp_path: Path) -> None:
    """A `.env` holds secrets: one other users may read is named on stderr (never its contents), and read."""
    dot_env = tmp_path / ".env"
    dot_env.write_text(f"REFUND_AGENT_API_TOKEN={LONG_ENOUGH}\n")
    dot_env.chmod(0o644)
    warned = refund_agent(tmp_path, "steps", "no-such-refund")
    assert warned.returncode == 1  # read all the same: the command ran
    assert f"{dot_env.resolve()} (mode 0644) may be read by other users" in warned.stderr, warned.stderr
    assert "chmod 600 .env" in warned.stderr and LONG_ENOUGH not in warned.stderr
    dot_env.chmod(0o600)
    quiet = refund_agent(tmp_path, "steps", "no-such-refund")
    assert quiet.stderr == "no refund no-such-refund\n"
