"""What every part of the settings shares: it reads its own variables from the environment (and ``.env``), and the
checks its secrets and money limits get."""

from __future__ import annotations

from decimal import Decimal

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from steps.records import SUPPORTED_CURRENCIES, quantize, supported

#: The file settings are read from besides the environment (the environment wins).
ENV_FILE = ".env"
#: The shortest secret of our own accepted, in bytes: as long as the ones generated (32 random bytes).
MIN_SECRET_BYTES = 32


class Part(BaseSettings):
    """One concern's settings. Each field reads the environment variable its alias names (its own name when it has
    no alias), in any case: the names operators set, whichever part a setting lives in."""

    model_config = SettingsConfigDict(env_file=ENV_FILE, extra="ignore")

    @classmethod
    def variables(cls) -> dict[str, str]:
        """Each of this part's environment variables (lower case) -> its field."""
        return {(info.alias or name): name for name, info in cls.model_fields.items()}


def own_secret(value: SecretStr | None) -> SecretStr | None:
    """A secret this service shares only with itself: refused blank or shorter than ``MIN_SECRET_BYTES``."""
    # The messages never carry the value: they end up in terminals and logs.
    if value is not None:
        secret = value.get_secret_value().strip()
        wanted = f"set at least {MIN_SECRET_BYTES} random bytes (e.g. openssl rand -hex 32)"
        if not secret:
            raise ValueError(f"is blank: {wanted} or leave it unset")
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(f"is shorter than {MIN_SECRET_BYTES} bytes: {wanted}")
    return value


def issued_key(value: SecretStr | None) -> SecretStr | None:
    """A key someone else issues, in whatever form they chose: refused blank only."""
    if value is not None and not value.get_secret_value().strip():
        raise ValueError("is blank: set the key its issuer gave you, or leave it unset")
    return value


def money_limit(currency: str, amount: Decimal) -> Decimal:
    """A limit set in a currency: a supported one, positive, in its minor units (no 0.5 JPY)."""
    if not supported(currency):
        raise ValueError(f"unsupported currency {currency!r}; supported: {', '.join(SUPPORTED_CURRENCIES)}")
    if amount <= 0:
        raise ValueError(f"the limit in {currency} must be positive")
    if amount != quantize(amount, currency):
        raise ValueError(f"the limit {amount} {currency} is finer than {currency}'s minor unit")
    return amount
