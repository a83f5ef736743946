"""Who is acting: principals as each channel establishes them, and the console's operators and roles.

A principal is ``<kind>:<name>``: ``client:helpdesk`` (an API client, by its key), ``operator:dana`` (a
console operator, signed in, or the approver a link was sent to, or a Slack user mapped to one),
``cli:root`` (the OS user running the command line), ``system`` (the deadline). The kind comes from the
channel, never from what a caller typed: names may not contain ``:``, so no typed name can pass for
another channel's principal.

A person is one identity whatever the door: a principal may act for an operator (``acts_for``: the operator
a client was added for, the operator whose name the command line's OS user has), and is then that operator
in every check of a decision: the requester's, approval limits, and whether the operator may decide at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from steps.records import NAME_PATTERN, SCOPES, Scope

__all__ = [
    "DEFAULT_ADMIN",
    "NAME_PATTERN",
    "OIDC_PREFIX",
    "ROLES",
    "SCOPES",
    "Operator",
    "Principal",
    "PrincipalKind",
    "Role",
    "Scope",
    "approver_names",
    "cli_principal",
    "known_operator",
    "parse_operators",
    "valid_name",
]

PrincipalKind = Literal["client", "operator", "cli", "system"]
KINDS: tuple[PrincipalKind, ...] = ("client", "operator", "cli", "system")
_NAME = re.compile(NAME_PATTERN)

#: Operators who sign in through the OpenID provider are named ``oidc.<subject>`` (agent/console/oidc.py).
OIDC_PREFIX = "oidc."
#: The one operator of a service with none configured; its password is generated into the data directory.
DEFAULT_ADMIN = "admin"

Role = Literal["viewer", "approver", "admin"]
ROLES: tuple[Role, ...] = ("viewer", "approver", "admin")
"""In increasing power: a viewer reads, an approver also decides refunds, an admin also runs admin actions."""


def valid_name(name: str) -> bool:
    return bool(_NAME.match(name))


@dataclass(frozen=True)
class Principal:
    kind: PrincipalKind
    name: str
    acts_for: str | None = field(default=None, compare=False)
    """The operator this principal acts for (an API client added ``--operator``, a mapped OS user), if any:
    established by the channel with the principal; not part of its name."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown principal kind {self.kind!r}")
        if self.kind != "system" and not valid_name(self.name):
            raise ValueError(f"{self.kind} name {self.name!r} is not 1-100 letters, digits or ._@- (no ':')")
        if self.acts_for is not None and not valid_name(self.acts_for):
            raise ValueError(f"operator name {self.acts_for!r} is not 1-100 letters, digits or ._@- (no ':')")

    @property
    def person(self) -> str | None:
        """The operator this principal is in every check: an operator is themself; a client or an OS user is the
        operator it acts for; None when it acts for nobody."""
        return self.name if self.kind == "operator" else self.acts_for

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Principal:
        kind, sep, name = text.partition(":")
        if not sep or kind not in KINDS:
            raise ValueError(f"not a principal: {text!r}")
        return cls(kind, name)


def role_at_least(role: Role | None, needed: Role) -> bool:
    return role is not None and ROLES.index(role) >= ROLES.index(needed)


@dataclass(frozen=True)
class Operator:
    name: str
    role: Role
    password_hash: str

    @property
    def principal(self) -> Principal:
        return Principal("operator", self.name)

    def may(self, needed: Role) -> bool:
        return role_at_least(self.role, needed)


def parse_operators(configured: dict[str, str]) -> dict[str, Operator]:
    """``{"dana": "approver:scrypt$..."}`` (the settings' format) to operators by name."""
    operators = {}
    for name, spec in configured.items():
        role, _, hashed = spec.partition(":")
        if role not in ROLES:
            raise ValueError(f"operator {name!r} has an unknown role {role!r}")
        if not valid_name(name):
            raise ValueError(f"operator name {name!r} is not 1-100 letters, digits or ._@- (no ':')")
        operators[name] = Operator(name, role, hashed)
    return operators


def cli_principal(user: str, configured: Mapping[str, str]) -> Principal:
    """The command line's principal for the OS user ``user``: ``cli:<user>``, acting for the operator of the same
    name when one is configured (the generated ``admin`` when none is), so that person's checks apply to it."""
    operators = set(configured) or {DEFAULT_ADMIN}
    return Principal("cli", user, acts_for=user if user in operators else None)


def known_operator(name: str, configured: Mapping[str, str], *, oidc: bool) -> bool:
    """Whether ``name`` is an operator this service has: one configured (the generated ``admin`` when none is),
    or, with single sign-on, a provider's user (``oidc.<subject>``)."""
    if oidc and name.startswith(OIDC_PREFIX) and valid_name(name):
        return True
    return name in (set(configured) or {DEFAULT_ADMIN})


def approver_names(configured: dict[str, str]) -> tuple[str, ...]:
    """The operators who may decide refunds (approver or admin) in settings' format; with none configured,
    the generated admin."""
    operators = parse_operators(configured)
    if not operators:
        return (DEFAULT_ADMIN,)
    return tuple(sorted(name for name, operator in operators.items() if operator.may("approver")))
