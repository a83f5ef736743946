"""The settings' parts read the environment variables operators set, by their full names only: a part's short field
name (``PORT``, ``ATTEMPTS``) in the environment sets nothing, and every variable belongs to exactly one part."""

from __future__ import annotations

import pytest

from agent.settings import Settings


def test_a_variable_is_read_into_its_part(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REFUND_AGENT_MODEL_ATTEMPTS", "7")
    monkeypatch.setenv("REFUND_AGENT_PORT", "8123")
    monkeypatch.setenv("PAYMENT_RECHECK_SECONDS", "60")
    settings = Settings(_env_file=None)
    assert (settings.model.attempts, settings.server.port, settings.payments.recheck_seconds) == (7, 8123, 60.0)
    assert settings.value_of("REFUND_AGENT_PORT") == 8123


def test_a_short_field_name_in_the_environment_sets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PORT", "HOST", "ATTEMPTS", "NAME", "KEY", "LIMITS", "OPERATORS", "API_BASE", "RECHECK_SECONDS"):
        monkeypatch.setenv(name, "1")
    for name in ("REFUND_AGENT_PORT", "REFUND_AGENT_HOST", "REFUND_AGENT_MODEL_ATTEMPTS", "REFUND_AGENT_MODEL"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(_env_file=None)
    assert (settings.server.port, settings.server.host, settings.model.attempts) == (8000, "127.0.0.1", 4)
    assert settings.model.name is None and settings.payments.api_base is None


def test_values_given_by_variable_name_win_and_every_variable_has_one_part() -> None:
    settings = Settings(refund_agent_model_attempts=2, auto_approve_limit="50.00")
    assert settings.model.attempts == 2 and str(settings.policy.auto_approve_limit) == "50.00"
    assert settings.with_values(refund_agent_host="127.0.0.2").server.host == "127.0.0.2"
    per_part = [variable for part in Settings.parts().values() for variable in part.variables()]
    assert len(per_part) == len(set(per_part)) == len(Settings.variables())
