"""Where the HTTP API listens and is reached, the token that opens it, and the proxies in front of it."""

from __future__ import annotations

import ipaddress

from pydantic import Field, SecretStr, field_validator

from agent.settings.part import Part, own_secret


class ServerSettings(Part):
    """The HTTP surface: address, public URL, API token, trusted proxies."""

    api_token: SecretStr | None = Field(default=None, alias="refund_agent_api_token")
    """Bearer token for the HTTP API, at least 32 bytes. Unset: generated on first start and kept in the data
    directory."""
    public_url: str | None = Field(default=None, alias="refund_agent_public_url")
    """Where approvers reach this service (used in approval links). Unset: http://HOST:PORT."""
    host: str = Field(default="127.0.0.1", alias="refund_agent_host")
    """Where ``refund-agent serve`` listens."""
    port: int = Field(default=8000, alias="refund_agent_port")
    """Where ``refund-agent serve`` listens."""
    trusted_proxies: list[str] = Field(default_factory=list, alias="refund_agent_trusted_proxies")
    """Reverse proxies in front of the service, as a JSON list of addresses or CIDR networks, e.g.
    ``["10.0.0.0/8", "192.0.2.7"]``. Only when a request comes from one of them does the console read
    ``X-Forwarded-For``, taking the right-most address that is not a listed proxy as the client's (for its
    per-address sign-in limit and the audit log). Unset: the TCP peer is the client, whatever the headers say."""

    _own = field_validator("api_token")(own_secret)

    @field_validator("trusted_proxies")
    @classmethod
    def _trusted_proxies(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f"trusted proxy {entry!r} is not an IP address or CIDR network") from None
        return value

    @property
    def base_url(self) -> str:
        """Where approvers reach this service: the public URL, or http://HOST:PORT."""
        return self.public_url or f"http://{self.host}:{self.port}"
