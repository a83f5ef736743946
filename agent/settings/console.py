"""The operator console and its sign-in: the session key, the company's OpenID provider, local passwords, and the
DBOS console it links to."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import quote

from pydantic import Field, SecretStr, field_validator, model_validator

from agent.settings.part import Part, own_secret


class ConsoleSettings(Part):
    """Console sessions, sign-in, and links out to a DBOS console."""

    session_secret: SecretStr | None = Field(default=None, alias="refund_agent_session_secret")
    """Signs the console's sign-in form cookie and keys its sign-in throttle (sessions themselves are rows in
    the application database); at least 32 bytes. Unset: generated on first start and kept in the data
    directory; processes behind one address share it."""
    oidc_issuer_url: str | None = None
    """The company's OpenID provider, e.g. ``https://acme.okta.com`` (exactly the ``issuer`` of its discovery
    document). Set with ``OIDC_CLIENT_ID`` and ``OIDC_CLIENT_SECRET``, the console offers sign-in through it
    (docs: operations/sign-in). Unset: passwords only."""
    oidc_client_id: str | None = None
    """The console's client id at the provider (its redirect URI: ``<public url>/console/auth/callback``)."""
    oidc_client_secret: SecretStr | None = None
    """The console's client secret at the provider. Issued by the provider: blank is refused."""
    oidc_scopes: str = "openid email profile"
    """Scopes asked for at sign-in (``openid`` is needed; add the one that carries the groups claim if the
    provider wants it, e.g. ``groups`` for Okta)."""
    oidc_groups_claim: str = "groups"
    """The ID token claim holding the operator's groups (a list or a string)."""
    oidc_role_groups: dict[str, Literal["viewer", "approver", "admin"]] = Field(default_factory=dict)
    """Provider groups to console roles, as JSON, e.g. ``{"refund-approvers": "approver", "support":
    "viewer"}``; the most powerful role among an operator's groups counts, taken at each sign-in. A user in
    none of them is refused. A change of this mapping ends the sessions started through the provider."""
    password_sign_in: bool = Field(default=True, alias="console_password_sign_in")
    """``false``: the console's local passwords (``REFUND_AGENT_OPERATORS``, or the generated admin) sign no one
    in; only allowed with the OpenID provider configured."""
    dbos_console_url: str | None = Field(default=None, alias="refund_agent_dbos_console_url")
    """Where a DBOS console shows one workflow, with ``{workflow_id}`` where its id goes, e.g.
    ``http://127.0.0.1:8090/#/workflows/{workflow_id}`` (dbos-argus on loopback) or DBOS Console's workflow page.
    The operator console links each of a refund's workflows there. Unset: no link."""

    _own = field_validator("session_secret")(own_secret)

    @model_validator(mode="after")
    def _oidc(self) -> ConsoleSettings:
        oidc = (self.oidc_issuer_url, self.oidc_client_id, self.oidc_client_secret)
        if any(v is not None for v in oidc) and not all(v is not None for v in oidc):
            raise ValueError("set OIDC_ISSUER_URL, OIDC_CLIENT_ID and OIDC_CLIENT_SECRET together, or none of them")
        if self.oidc_client_secret is not None and not self.oidc_client_secret.get_secret_value().strip():
            raise ValueError("OIDC_CLIENT_SECRET is blank: set the secret the provider issued")
        if self.oidc_issuer_url is not None and not re.match(r"^https?://[^\s/]+", self.oidc_issuer_url):
            raise ValueError("OIDC_ISSUER_URL must be the provider's http(s) issuer URL")
        if not self.password_sign_in and self.oidc_issuer_url is None:
            raise ValueError("CONSOLE_PASSWORD_SIGN_IN=false needs OIDC_ISSUER_URL: no one could sign in")
        return self

    @field_validator("dbos_console_url")
    @classmethod
    def _workflow_link(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith(("http://", "https://")) or "{workflow_id}" not in value):
            raise ValueError(
                "must be an http(s) URL with {workflow_id} in it, e.g. http://127.0.0.1:8090/#/workflows/{workflow_id}"
            )
        return value

    def dbos_console_link(self, workflow_id: str) -> str | None:
        """The DBOS console's page of one workflow, or None when unset. The id is escaped as one path segment
        (``a/settle`` -> ``a%2Fsettle``); after a ``#`` it is escaped twice, because a hash-routed page such as
        dbos-argus decodes its fragment once before it reads the id from it."""
        url = self.dbos_console_url
        if url is None:
            return None
        segment = quote(workflow_id, safe="")
        in_fragment = "#" in url.split("{workflow_id}", 1)[0]
        return url.replace("{workflow_id}", quote(segment, safe="") if in_fragment else segment)
