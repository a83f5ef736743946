"""Sign-in with the company's OpenID provider: authorization code flow with PKCE, discovery, and ID token
validation (issuer, audience, expiry, nonce, signature), through Authlib (the OAuth client) and joserfc (the
JOSE library Authlib's authors maintain, which Authlib itself now points to).

The provider's ``sub`` is who signed in; the role comes from the groups claim, mapped by the configuration,
at sign-in. Every failure is a :class:`SignInError` carrying the page the operator sees: never a stack trace.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

import httpx
from authlib.integrations.base_client.errors import OAuthError
from authlib.integrations.httpx_client import OAuth2Client
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from agent.identity import OIDC_PREFIX, ROLES, Role
from steps.tls import client_context

OPERATOR_PREFIX = OIDC_PREFIX
"""The names of operators who sign in through the provider start with this (local operators' may not)."""
_SAFE_SUBJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,89}$")
ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA"]
LEEWAY_SECONDS = 60
"""Clock difference tolerated between this host and the provider when checking exp/iat."""


class SignInError(Exception):
    """A sign-in that cannot go on, with what the page says and its status code."""

    def __init__(self, status: int, title: str, text: str) -> None:
        super().__init__(text)
        self.status, self.title, self.text = status, title, text


@dataclass(frozen=True)
class OidcConfig:
    issuer: str
    client_id: str
    client_secret: str
    redirect_uri: str
    """``<public url>/console/auth/callback``: registered with the provider."""
    post_logout_uri: str
    scopes: str
    groups_claim: str
    role_groups: dict[str, Role]

    @property
    def credentials(self) -> str:
        """A session's fingerprint (64 chars, the column's width): a change of provider, client or role
        mapping ends the sessions started under the previous one, as a changed password does."""
        mapping = json.dumps(self.role_groups, sort_keys=True)
        return "oidc:" + hashlib.sha256(f"{self.issuer}\n{self.client_id}\n{mapping}".encode()).hexdigest()[:59]


@dataclass(frozen=True)
class Flow:
    """What the browser's flow cookie carries between the redirect to the provider and the callback."""

    state: str
    nonce: str
    verifier: str
    next: str


@dataclass(frozen=True)
class Identity:
    subject: str
    email: str | None
    groups: tuple[str, ...]
    role: Role
    id_token: str

    @property
    def operator(self) -> str:
        return operator_name(self.subject)


def operator_name(subject: str) -> str:
    """``oidc.<sub>`` when the subject is a valid name's characters, else ``oidc.`` and its SHA-256 (a ``sub``
    may hold ``:``, ``_`` or anything): never ambiguous, never a local operator's name."""
    if _SAFE_SUBJECT.match(subject):
        return OPERATOR_PREFIX + subject
    return OPERATOR_PREFIX + "h-" + hashlib.sha256(subject.encode()).hexdigest()[:40]


def role_for(groups: tuple[str, ...], role_groups: dict[str, Role]) -> Role | None:
    """The most powerful role any of the groups maps to; None when none does."""
    roles = [role_groups[g] for g in groups if g in role_groups]
    return max(roles, key=ROLES.index) if roles else None


def _groups(claims: dict[str, Any], claim: str) -> tuple[str, ...]:
    value = claims.get(claim)
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return ()


UNREACHABLE = "The sign-in provider cannot be reached just now; try again in a minute, or tell whoever runs it."


class Provider:
    """One configured provider; its discovery document and keys are fetched when first needed."""

    def __init__(self, config: OidcConfig, *, timeout: float = 10.0) -> None:
        self.config = config
        self.timeout = timeout
        self._metadata: dict[str, Any] | None = None
        self._keys: KeySet | None = None

    def _get(self, url: str) -> dict[str, Any]:
        try:
            response = httpx.get(url, timeout=self.timeout, follow_redirects=False, verify=client_context())
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError):
            raise SignInError(503, "Sign-in provider unavailable", UNREACHABLE) from None
        if not isinstance(body, dict):
            raise SignInError(503, "Sign-in provider unavailable", UNREACHABLE)
        return body

    def metadata(self) -> dict[str, Any]:
        """The discovery document; refused unless it names the configured issuer exactly."""
        if self._metadata is None:
            found = self._get(self.config.issuer.rstrip("/") + "/.well-known/openid-configuration")
            if found.get("issuer") != self.config.issuer:
                raise SignInError(
                    502,
                    "Unknown sign-in provider",
                    "The provider at the configured issuer URL calls itself something else; "
                    "check OIDC_ISSUER_URL against its discovery document.",
                )
            self._metadata = found
        return self._metadata

    def _key_set(self, *, refresh: bool = False) -> KeySet:
        if self._keys is None or refresh:
            self._keys = KeySet.import_key_set(self._get(str(self.metadata()["jwks_uri"])))  # type: ignore[arg-type]
        return self._keys

    def _client(self) -> OAuth2Client:
        return OAuth2Client(
            self.config.client_id,
            self.config.client_secret,
            scope=self.config.scopes,
            redirect_uri=self.config.redirect_uri,
            code_challenge_method="S256",
            timeout=self.timeout,
            verify=client_context(),
        )

    def begin(self, next_page: str) -> tuple[str, Flow]:
        """The provider's authorization URL to send the browser to, and the flow to remember meanwhile."""
        flow = Flow(secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(48), next_page)
        with self._client() as client:
            url, _ = client.create_authorization_url(
                str(self.metadata()["authorization_endpoint"]),
                state=flow.state,
                nonce=flow.nonce,
                code_verifier=flow.verifier,
            )
        return str(url), flow

    def finish(self, flow: Flow, params: dict[str, str]) -> Identity:
        """Check the callback against the flow, trade the code for tokens, validate the ID token, map the role."""
        if "error" in params:
            why = params.get("error_description") or params["error"]
            raise SignInError(400, "Sign-in refused", f"The sign-in provider refused the sign-in: {why[:200]}")
        if not secrets.compare_digest(params.get("state", ""), flow.state):
            raise SignInError(400, "Sign-in not recognised", _AGAIN)
        if "iss" in params and params["iss"] != self.config.issuer:  # RFC 9207: a mix-up with another provider
            raise SignInError(400, "Unknown sign-in provider", "The answer came from another provider. " + _AGAIN)
        metadata = self.metadata()
        try:
            with self._client() as client:
                token = client.fetch_token(
                    str(metadata["token_endpoint"]), code=params.get("code", ""), code_verifier=flow.verifier
                )
        except OAuthError as error:
            text = "The sign-in code has expired or was already used. " + _AGAIN
            if error.error != "invalid_grant":
                text = f"The sign-in provider refused the sign-in code ({error.error}). " + _AGAIN
            raise SignInError(400, "Sign-in expired", text) from None
        except (httpx.HTTPError, ValueError):
            raise SignInError(503, "Sign-in provider unavailable", UNREACHABLE) from None
        id_token = str(token.get("id_token") or "")
        claims = self._claims(id_token, flow.nonce)
        groups = _groups(claims, self.config.groups_claim)
        role = role_for(groups, self.config.role_groups)
        email = claims.get("email")
        if role is None:
            raise SignInError(
                403,
                "No console role",
                f"You signed in as {email or claims['sub']}, but none of your groups gives a role in this "
                "console (viewer, approver or admin). Ask whoever runs the service to add you to a group it maps.",
            )
        return Identity(str(claims["sub"]), str(email) if email else None, groups, role, id_token)

    def _claims(self, id_token: str, nonce: str) -> dict[str, Any]:
        refused = SignInError(400, "Sign-in not accepted", "The provider's ID token did not check out. " + _AGAIN)
        if not id_token:
            raise refused
        try:
            try:
                decoded = jwt.decode(id_token, self._key_set(), algorithms=ALGORITHMS)
            except JoseError:  # perhaps a key the provider rotated in since the keys were fetched
                decoded = jwt.decode(id_token, self._key_set(refresh=True), algorithms=ALGORITHMS)
            jwt.JWTClaimsRegistry(
                leeway=LEEWAY_SECONDS,
                iss={"essential": True, "value": self.config.issuer},
                aud={"essential": True, "value": self.config.client_id},
                exp={"essential": True},
                sub={"essential": True},
                nonce={"essential": True, "value": nonce},
            ).validate(decoded.claims)
        except (JoseError, ValueError):
            raise refused from None
        claims = dict(decoded.claims)
        several = isinstance(claims.get("aud"), list) and len(claims["aud"]) > 1
        if several and claims.get("azp") != self.config.client_id:  # OIDC Core 3.1.3.7: azp names us
            raise refused
        return claims

    def origins(self) -> list[str]:
        """Where sign-out may send the browser: the issuer's origin and, once known, the end-session endpoint's."""
        urls = [self.config.issuer]
        if self._metadata is not None and self._metadata.get("end_session_endpoint"):
            urls.append(str(self._metadata["end_session_endpoint"]))
        found = []
        for url in urls:
            parsed = httpx.URL(url)
            origin = f"{parsed.scheme}://{parsed.netloc.decode()}"
            if origin not in found:
                found.append(origin)
        return found

    def end_session_url(self, id_token: str | None) -> str | None:
        """Where to send the browser to end the provider's session too (RP-initiated logout), if it has one."""
        try:
            endpoint = self.metadata().get("end_session_endpoint")
        except SignInError:
            return None  # the console's own session has ended; the provider's cannot be reached
        if not endpoint:
            return None
        params = {"client_id": self.config.client_id, "post_logout_redirect_uri": self.config.post_logout_uri}
        if id_token:
            params["id_token_hint"] = id_token
        return str(httpx.URL(str(endpoint), params=params))


_AGAIN = "Open the sign-in page and sign in again."
