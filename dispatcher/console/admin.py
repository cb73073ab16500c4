"""Audited administration: endpoints created, updated, their secret rotated; tokens
created and revoked (archive and unarchive: ``lifecycle``). Each writes its
``operator_actions`` row in the caller's transaction (as ``operations`` does), with
old -> new values; a secret's value never: a changed SMTP password is "(changed)".

A rotated or generated secret is returned once, to the caller that asked for it
(the CLI prints it, the operator API returns it); it is never logged and has no
field in any audit row or read response.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.console import tokens
from spark_outbox.core import endpoints, masking
from spark_outbox.core.auditlog import check_reason, record_action
from spark_outbox.core.errors import Conflict, InvalidRequest, NotFound
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "admin.sql")

MASK = "***"
CHANGED = "(changed)"  # a secret's new value, in the audit
POLICY = (
    "timeout_s",
    "retry_schedule_s",
    "rate_limit_per_s",
    "max_in_flight",
    "ordered",
    "deduplicates",
)
SMTP = (
    "smtp_host",
    "smtp_port",
    "smtp_tls",
    "smtp_username",
    "smtp_password",
    "mail_from",
    "smtp_allow_plaintext_auth",
)
UPDATABLE = ("url", *POLICY, *SMTP)
_FLAGS = ("ordered", "deduplicates", "smtp_allow_plaintext_auth")
MAX_OVERLAP_S = 30 * 86400.0
DEFAULT_OVERLAP_S = 86400.0
# Secrets signing at once, at most (the current one and those still overlapping):
# each rotation inside an overlap adds one, and every delivery carries them all.
MAX_SIGNING_SECRETS = 10


@dataclasses.dataclass(frozen=True)
class Rotation:
    endpoint: str
    signing_secret: str = dataclasses.field(repr=False)
    previous_valid_until: dt.datetime | None  # None: the old secret stopped at once


def _audit_view(field: str, value: Any) -> Any:
    """A URL is recorded masked (``masking.masked_url``: receivers take tokens in the
    path and the query); the audit trail is no place for a secret."""
    return masking.masked_url(value) if field == "url" else value


def _audit_change(field: str, old: Any, new: Any) -> dict[str, Any]:
    """One field's old -> new for the audit; a secret's values never appear."""
    if field == "smtp_password":
        return {"old": MASK if old else None, "new": CHANGED if new else None}
    return {"old": _audit_view(field, old), "new": _audit_view(field, new)}


def create_webhook(
    conn: Connection, *, actor: str, reason: str, **values: Any
) -> tuple[endpoints.Endpoint, str]:
    reason = check_reason(reason)
    endpoint, secret = endpoints.add_webhook(conn, **values)
    _record_created(conn, endpoint, actor, reason)
    return endpoint, secret


def create_email(conn: Connection, *, actor: str, reason: str, **values: Any) -> endpoints.Endpoint:
    reason = check_reason(reason)
    endpoint = endpoints.add_email(conn, **values)
    _record_created(conn, endpoint, actor, reason)
    return endpoint


def _record_created(conn: Connection, ep: endpoints.Endpoint, actor: str, reason: str) -> None:
    shown = ("kind", "url", *POLICY, *(f for f in SMTP if f != "smtp_password"))
    details = {f: _audit_view(f, getattr(ep, f)) for f in shown}
    record_action(
        conn, actor=actor, action="create_endpoint", target=ep.name, reason=reason, details=details
    )


def _checked(ep: endpoints.Endpoint, field: str, value: Any) -> Any:
    if field == "url":
        if ep.kind != "webhook":
            raise InvalidRequest("url", f"{ep.name} is an {ep.kind} endpoint", "leave url out")
        return endpoints.check_webhook_url(value)
    if field in SMTP and ep.kind != "email":
        raise InvalidRequest(
            field, f"{ep.name} is a {ep.kind} endpoint, without SMTP settings", f"leave {field} out"
        )
    if field in _FLAGS and not isinstance(value, bool):
        raise InvalidRequest(field, f"{value!r} is not true or false", "give true or false")
    text = field in ("smtp_username", "smtp_password") and value is not None
    if text and (not isinstance(value, str) or not value or "\x00" in value):
        raise InvalidRequest(field, "is empty or not text", f"give the {field[5:]}, or null")
    return endpoints.checked_numbers({field: value}).get(field, value)


def update_endpoint(
    conn: Connection, name: str, changes: Mapping[str, Any], *, actor: str, reason: str
) -> endpoints.Endpoint:
    """Change any setting: the URL (webhook), the SMTP server, login, password, TLS
    mode and From address (e-mail), timeout, retry schedule, limits, ordering or
    deduplicates (None clears the retry schedule, the limits, the SMTP login and
    password). The signing secret changes by ``rotate_secret``.

    A URL passes the same checks as on ``add``, and the SMTP settings are checked
    together as on ``add`` (a login over plain text still needs the explicit opt-in).
    Recorded with every changed field's old and new value, a password as "(changed)".
    """
    reason = check_reason(reason)
    unknown = sorted(set(changes) - set(UPDATABLE))
    if unknown or not changes:
        raise InvalidRequest(
            unknown[0] if unknown else "url",
            f"{unknown[0]!r} cannot be updated" if unknown else "nothing to change",
            f"give one or more of {', '.join(UPDATABLE)}",
        )
    row = conn.execute(_Q["endpoint_for_update"], {"name": name}).mappings().first()
    if row is None:
        raise NotFound(f"no endpoint named {name!r}")
    ep = endpoints.Endpoint.from_row(row)
    old = {f: _plain(getattr(ep, f)) for f in UPDATABLE}
    new = old | {f: _checked(ep, f, v) for f, v in changes.items()}
    if ep.kind == "email":
        endpoints.check_email_settings(**{f: new[f] for f in SMTP if f not in _NOT_CHECKED})
    conn.execute(_Q["update_endpoint_settings"], new | {"name": name})
    if old["ordered"] and not new["ordered"]:
        conn.execute(_Q["unpark_unordered"], {"name": name})
    endpoints.reset_budget(conn, name)
    diff = {f: _audit_change(f, old[f], new[f]) for f in UPDATABLE if old[f] != new[f]}
    record_action(
        conn,
        actor=actor,
        action="update_endpoint",
        target=name,
        reason=reason,
        details={"changes": diff},
    )
    return endpoints.get(conn, name)


_NOT_CHECKED = ("smtp_port", "smtp_password")  # the port by its bound, the password as text


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def rotate_secret(
    conn: Connection,
    name: str,
    *,
    overlap_s: float = DEFAULT_OVERLAP_S,
    actor: str,
    reason: str,
    new_secret: str | None = None,
) -> Rotation:
    """A new signing secret (generated, or ``new_secret``); the current one keeps
    signing beside it for ``overlap_s``, and so does every earlier one until its own
    overlap ends: a second rotation inside an overlap drops no secret a receiver may
    still hold. ``overlap_s`` 0 (a leaked secret): only the new secret signs, at once."""
    reason = check_reason(reason)
    if not 0 <= overlap_s <= MAX_OVERLAP_S:
        raise InvalidRequest(
            "overlap_s", f"{overlap_s:g} is out of range", f"use 0 to {MAX_OVERLAP_S:g} seconds"
        )
    secret = endpoints.check_signing_secret(new_secret or endpoints.generate_signing_secret())
    if conn.execute(_Q["endpoint_for_update"], {"name": name}).first() is None:
        raise NotFound(f"no endpoint named {name!r}")
    ep = endpoints.get(conn, name)  # under the row lock just taken
    if ep.kind != "webhook":
        raise Conflict(f"{name} is an {ep.kind} endpoint; only webhooks have a signing secret")
    if overlap_s > 0 and len(ep.active_secrets()) >= MAX_SIGNING_SECRETS:
        first = ep.overlapping_until()[0].isoformat(timespec="seconds")
        raise Conflict(
            f"{name} already signs with {MAX_SIGNING_SECRETS} secrets; rotate with overlap 0 "
            f"(only the new secret signs), or after {first}, when the oldest stops signing"
        )
    params = {"endpoint_id": ep.id, "name": name, "overlap_s": overlap_s, "secret": secret}
    conn.execute(_Q["prune_secrets" if overlap_s > 0 else "drop_older_secrets"], params)
    if overlap_s > 0:
        conn.execute(_Q["keep_previous_secret"], params)
    found = conn.execute(_Q["rotate_secret"], params).one()
    details = {"signing_secret": {"old": MASK, "new": MASK}, "overlap_s": overlap_s}
    record_action(
        conn, actor=actor, action="rotate_secret", target=name, reason=reason, details=details
    )
    return Rotation(endpoint=name, signing_secret=secret, previous_valid_until=found[0])


def create_token(
    conn: Connection, *, name: str, role: str, actor: str, reason: str
) -> tuple[tokens.Token, str]:
    reason = check_reason(reason)
    token, plaintext = tokens.create(conn, name=name, role=role)
    record_action(
        conn,
        actor=actor,
        action="create_token",
        target=token.name,
        reason=reason,
        details={"role": token.role},
    )
    return token, plaintext


def revoke_token(conn: Connection, name: str, *, actor: str, reason: str) -> None:
    reason = check_reason(reason)
    tokens.revoke(conn, name)
    record_action(conn, actor=actor, action="revoke_token", target=name, reason=reason)
