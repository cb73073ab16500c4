"""API tokens: random bearer secrets with a role, stored as sha256 only.

A token is 32 random bytes, so a fast hash is enough (no password stretching
needed: there is nothing to brute-force). ``create`` returns the plaintext
exactly once; nothing can show it again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import secrets
import unicodedata

from sqlalchemy.engine import Connection, RowMapping

from spark_outbox.core import outside
from spark_outbox.core.auditlog import SYSTEM_ACTOR
from spark_outbox.core.errors import Conflict, InvalidRequest, NotFound, OutboxError
from spark_outbox.core.schema import ROLES
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "tokens.sql")

# last_used_at is kept to the minute: one write a minute per token, not one per request.
TOUCH_EVERY = dt.timedelta(minutes=1)
TOKEN_PREFIX = "obx_"  # noqa: S105  (a prefix that makes leaked tokens easy to grep for)


class AuthenticationFailed(OutboxError):
    """No token, an unknown one, or a revoked one."""


class PermissionDenied(OutboxError):
    """The token is valid but its role may not do this."""


@dataclasses.dataclass(frozen=True)
class Token:
    id: int
    name: str
    role: str
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    revoked_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: RowMapping) -> Token:
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"


def token_sha256(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


# The actors the system itself writes in operator_actions: every change it makes by
# itself (SYSTEM_ACTOR: pauses, rests, holds, purges), the CLI ('cli:<login>'), a
# sign-out that revokes its token ('ui:<token>'); purges of earlier releases
# ('dispatcher:<worker>'). A token's name is its actor too, so a token may not take
# one of these names, or the audit trail could be forged.
RESERVED_NAMES = (SYSTEM_ACTOR,)
RESERVED_PREFIXES = ("cli:", "dispatcher:", "ui:")


def _check_name(name: str) -> str:
    """The name, stripped, if a token may have it."""
    stripped = name.strip()
    if not stripped:
        raise InvalidRequest("name", "is empty", "name the token after its holder, e.g. alice")
    outside.check_name("name", stripped, "alice")
    # Compatibility forms folded too: a fullwidth "ｕｉ:x" reads as "ui:x" in the trail.
    folded = unicodedata.normalize("NFKC", stripped).casefold()
    if folded in RESERVED_NAMES or folded.startswith(RESERVED_PREFIXES):
        raise InvalidRequest(
            "name",
            f"{stripped!r} is reserved for the system's own entries in the audit trail "
            f"({', '.join(RESERVED_NAMES)}, {', '.join(p + '...' for p in RESERVED_PREFIXES)})",
            "name the token after its holder, e.g. alice",
        )
    return stripped


def create(conn: Connection, *, name: str, role: str) -> tuple[Token, str]:
    """Store a new token's hash; return the token and its plaintext (shown once)."""
    name = _check_name(name)
    if role not in ROLES:
        raise InvalidRequest("role", f"{role!r} is not a role", f"use one of {', '.join(ROLES)}")
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = (
        conn.execute(
            _Q["insert_token"],
            {"name": name, "role": role, "token_sha256": token_sha256(plaintext)},
        )
        .mappings()
        .first()
    )
    if row is None:
        raise Conflict(f"a token named {name!r} already exists; revoke it or pick another name")
    return Token.from_row(row), plaintext


def authenticate(conn: Connection, plaintext: str | None) -> Token:
    """The live token this plaintext stands for, or ``AuthenticationFailed``."""
    if not plaintext or not plaintext.startswith(TOKEN_PREFIX):
        raise AuthenticationFailed("a valid bearer token is required")
    row = conn.execute(_Q["token_by_hash"], {"token_sha256": token_sha256(plaintext)})
    found = row.mappings().first()
    if found is None:
        raise AuthenticationFailed("the token is unknown or revoked")
    token = Token.from_row(found)
    # Checked here first, so most requests skip the UPDATE's round trip.
    if token.last_used_at is None or token.last_used_at < dt.datetime.now(dt.UTC) - TOUCH_EVERY:
        conn.execute(_Q["touch_token"], {"id": token.id})
    return token


def require_operator(token: Token) -> Token:
    if not token.is_operator:
        raise PermissionDenied(f"token {token.name!r} has role {token.role!r}; this needs operator")
    return token


def list_all(conn: Connection) -> list[Token]:
    return [Token.from_row(r) for r in conn.execute(_Q["select_tokens"]).mappings()]


def revoke(conn: Connection, name: str) -> None:
    if conn.execute(_Q["revoke_token"], {"name": name}).first() is None:
        raise NotFound(f"no live token named {name!r}")


def csrf_token(plaintext: str) -> str:
    """A form token bound to the session's bearer token (the support page's CSRF guard).

    Derived, not stored: only someone holding the session token can compute it,
    and a cross-site page can read neither.
    """
    return hmac.new(plaintext.encode(), b"outbox-csrf", hashlib.sha256).hexdigest()
