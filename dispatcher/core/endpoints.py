"""The endpoint registry: named destinations with their secrets and policies.

Producers (Spark jobs, ``enqueue``) name an endpoint; only the dispatcher reads
its URL, signing secret and SMTP credentials. ``Endpoint.__repr__`` and
``public()`` leave the secrets out, so they cannot reach a log or a response by
accident.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import secrets
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy.engine import Connection, RowMapping

from spark_outbox.core import bounds, outside, wakeup
from spark_outbox.core.errors import Conflict, InvalidRequest, NotFound
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "endpoints.sql")

SECRET_PREFIX = "whsec_"  # noqa: S105  (a prefix, not a secret)
_SECRET_FIELDS = ("signing_secret", "previous_signing_secret", "smtp_password")


def generate_signing_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def secret_bytes(secret: str) -> bytes:
    """The HMAC secret a ``whsec_`` string stands for."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


@dataclasses.dataclass(frozen=True)
class Endpoint:
    id: int
    name: str
    kind: str
    url: str | None
    signing_secret: str | None = dataclasses.field(repr=False)
    previous_signing_secret: str | None = dataclasses.field(repr=False)
    previous_secret_expires_at: dt.datetime | None
    smtp_host: str | None
    smtp_port: int | None
    smtp_tls: str
    smtp_username: str | None
    smtp_password: str | None = dataclasses.field(repr=False)
    mail_from: str | None
    smtp_allow_plaintext_auth: bool
    timeout_s: float
    retry_schedule_s: tuple[float, ...] | None
    rate_limit_per_s: float | None
    max_in_flight: int | None
    ordered: bool
    # The receiver honours the idempotency key (webhook-id / Message-ID); if not,
    # a send with an unknown outcome ends 'uncertain' instead of being resent.
    deduplicates: bool
    enabled: bool
    paused_reason: str | None
    paused_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime
    # Shared state (endpoint_budgets), not configuration: the circuit breaker rests
    # the endpoint for every dispatcher until then.
    resting_until: dt.datetime | None = None
    # Archived: accepts no new effects (and is paused); its history stays.
    archived_at: dt.datetime | None = None
    archived_reason: str | None = None
    # Secrets of earlier rotations still overlapping (endpoint_secrets), with their
    # not_after: each signs beside the current and the previous one until then.
    older_secrets: tuple[tuple[str, dt.datetime], ...] = dataclasses.field(default=(), repr=False)

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | RowMapping) -> Endpoint:
        values = {f.name: row[f.name] for f in dataclasses.fields(cls) if f.name in row}
        if values["retry_schedule_s"] is not None:
            values["retry_schedule_s"] = tuple(values["retry_schedule_s"])
        # Two parallel arrays in the row (endpoints.sql), pairs here.
        secrets_, until = row.get("older_secrets") or [], row.get("older_not_after") or []
        values["older_secrets"] = tuple(zip(secrets_, until, strict=True))
        return cls(**values)

    def active_secrets(self, now: dt.datetime | None = None) -> list[str]:
        """The secrets a delivery is signed with: the current one, and every earlier
        one whose rotation's overlap still runs (docs/api.md, secret rotation)."""
        found = [self.signing_secret] if self.signing_secret else []
        return found + [secret for secret, _ in self._overlapping(now)]

    def overlapping_until(self, now: dt.datetime | None = None) -> list[dt.datetime]:
        """When each earlier secret that still signs stops signing, soonest first."""
        return sorted(until for _, until in self._overlapping(now))

    def _overlapping(self, now: dt.datetime | None) -> list[tuple[str, dt.datetime]]:
        """Every earlier secret still signing, newest first."""
        now = now or dt.datetime.now(dt.UTC)
        earlier = list(reversed(self.older_secrets))  # endpoints.sql: oldest first
        if self.previous_signing_secret and self.previous_secret_expires_at:
            earlier.insert(0, (self.previous_signing_secret, self.previous_secret_expires_at))
        return [(secret, until) for secret, until in earlier if until > now]

    def public(self) -> dict[str, Any]:
        """Everything but the secrets (safe for logs, CLI listings and the API)."""
        data = dataclasses.asdict(self)
        for name in (*_SECRET_FIELDS, "older_secrets"):
            data.pop(name)
        data["has_signing_secret"] = self.signing_secret is not None
        data["has_smtp_password"] = self.smtp_password is not None
        data["overlapping_secrets_until"] = self.overlapping_until()
        return data


def check_webhook_url(url: str | None) -> str:
    try:
        parts = urlsplit(url or "")
    except ValueError:  # "http://[::1": an unclosed IPv6 address
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(
            "url",
            f"{url!r} is not an http(s) URL with a host",
            "give a full URL, e.g. https://example.com/hooks/billing",
        )
    if parts.username or parts.password:
        raise InvalidRequest("url", "carries credentials", "remove user:password from the URL")
    if outside.has_space_or_control(url):  # type: ignore[arg-type]
        # A CR LF in it once was stored and only refused at the first send.
        raise InvalidRequest(
            "url", "holds spaces or control characters", "percent-encode them (%20, %0D%0A)"
        )
    try:
        port = parts.port  # raises for a port out of range
    except ValueError:
        port = 0
    if port == 0:
        raise InvalidRequest(
            "url", f"{url!r} has a port out of range", "use a port from 1 to 65535"
        )
    return url  # type: ignore[return-value]


def check_signing_secret(secret: str) -> str:
    problem = not secret.startswith(SECRET_PREFIX)
    try:
        problem = problem or len(secret_bytes(secret)) < 24
    except ValueError:  # binascii.Error: not base64
        problem = True
    if problem:
        raise InvalidRequest(
            "signing_secret",
            "must be 'whsec_' + base64 of at least 24 bytes",
            "omit it to have one generated",
        )
    return secret


def add_webhook(
    conn: Connection,
    *,
    name: str,
    url: str,
    signing_secret: str | None = None,
    timeout_s: float = 10.0,
    retry_schedule_s: Sequence[float] | None = None,
    rate_limit_per_s: float | None = None,
    max_in_flight: int | None = None,
    ordered: bool = False,
    deduplicates: bool = True,
) -> tuple[Endpoint, str]:
    """Register a webhook endpoint; returns it and its signing secret (shown once)."""
    secret = check_signing_secret(signing_secret or generate_signing_secret())
    return _insert(
        conn,
        name=name,
        kind="webhook",
        url=check_webhook_url(url),
        signing_secret=secret,
        timeout_s=timeout_s,
        retry_schedule_s=retry_schedule_s,
        rate_limit_per_s=rate_limit_per_s,
        max_in_flight=max_in_flight,
        ordered=ordered,
        deduplicates=deduplicates,
    ), secret


def add_email(
    conn: Connection,
    *,
    name: str,
    smtp_host: str,
    smtp_port: int,
    mail_from: str,
    smtp_tls: str = "none",
    smtp_username: str | None = None,
    smtp_password: str | None = None,
    smtp_allow_plaintext_auth: bool = False,
    timeout_s: float = 10.0,
    retry_schedule_s: Sequence[float] | None = None,
    rate_limit_per_s: float | None = None,
    max_in_flight: int | None = None,
    ordered: bool = False,
    deduplicates: bool = False,
) -> Endpoint:
    check_email_settings(
        smtp_host=smtp_host,
        smtp_tls=smtp_tls,
        smtp_username=smtp_username,
        smtp_allow_plaintext_auth=smtp_allow_plaintext_auth,
        mail_from=mail_from,
    )
    return _insert(
        conn,
        name=name,
        kind="email",
        smtp_host=smtp_host,
        smtp_port=smtp_port,
        smtp_tls=smtp_tls,
        smtp_username=smtp_username,
        smtp_password=smtp_password,
        smtp_allow_plaintext_auth=smtp_allow_plaintext_auth,
        mail_from=mail_from,
        timeout_s=timeout_s,
        retry_schedule_s=retry_schedule_s,
        rate_limit_per_s=rate_limit_per_s,
        max_in_flight=max_in_flight,
        ordered=ordered,
        deduplicates=deduplicates,
    )


def check_email_settings(
    *,
    smtp_host: object,
    smtp_tls: object,
    smtp_username: object,
    smtp_allow_plaintext_auth: object,
    mail_from: object,
) -> None:
    """An e-mail endpoint's SMTP settings, together (on add and on every update)."""
    if not isinstance(smtp_host, str) or not smtp_host.strip():
        raise InvalidRequest("smtp_host", "is empty", "give the SMTP server's host name")
    if len(smtp_host) > 253 or outside.has_space_or_control(smtp_host):
        # A CR LF in it was once stored, and only failed at every send.
        raise InvalidRequest(
            "smtp_host",
            "holds spaces or control characters, or is longer than a host name",
            "give the SMTP server's host name or address alone, e.g. smtp.example.com",
        )
    if smtp_tls not in ("none", "starttls", "tls"):
        raise InvalidRequest(
            "smtp_tls", f"{smtp_tls!r} is not a TLS mode", "use none, starttls or tls"
        )
    if smtp_username and smtp_tls == "none" and not smtp_allow_plaintext_auth:
        raise InvalidRequest(
            "smtp_tls",
            "is 'none', so the SMTP password would cross the network unencrypted",
            "use starttls or tls, or opt in explicitly with smtp_allow_plaintext_auth=true "
            "(the CLI's --smtp-allow-plaintext-auth; a trusted local relay only)",
        )
    if (
        not isinstance(mail_from, str)
        or "@" not in mail_from
        or not mail_from.isprintable()
        or len(mail_from) > 998  # RFC 5322's longest line
    ):
        raise InvalidRequest(
            "mail_from",
            f"{mail_from!r}"[:200]
            + " is not an address (or holds a line break or control character)",
            "give an address like billing@example.com or Billing <billing@example.com>",
        )


def checked_numbers(values: Mapping[str, Any]) -> dict[str, Any]:
    """The numeric settings among ``values``, each within its bound (``bounds``)."""
    checked: dict[str, Any] = {}
    for field, value in values.items():
        if field == "retry_schedule_s":
            checked[field] = bounds.check_retry_schedule(value)
        elif field in bounds.BOUNDS:
            bound = bounds.BOUNDS[field]
            checked[field] = (
                bounds.check_optional(bound, value) if bound.unset else bound.check(value)
            )
    return checked


def _insert(conn: Connection, **values: Any) -> Endpoint:
    if not values["name"] or not values["name"].strip():
        raise InvalidRequest("name", "is empty", "name the endpoint, e.g. billing-webhook")
    outside.check_name("name", values["name"], "billing-webhook")
    values |= checked_numbers(values)
    row = {
        "url": None,
        "signing_secret": None,
        "smtp_host": None,
        "smtp_port": None,
        "smtp_tls": "none",
        "smtp_username": None,
        "smtp_password": None,
        "smtp_allow_plaintext_auth": False,
        "mail_from": None,
    } | values
    if conn.execute(_Q["insert_endpoint"], row).first() is None:
        raise Conflict(f"an endpoint named {values['name']!r} already exists")
    return get(conn, values["name"])


def get(conn: Connection, name: str) -> Endpoint:
    row = conn.execute(_Q["select_endpoint"], {"name": name}).mappings().first()
    if row is None:
        raise NotFound(f"no endpoint named {name!r}")
    return Endpoint.from_row(row)


def list_all(conn: Connection) -> list[Endpoint]:
    return [Endpoint.from_row(r) for r in conn.execute(_Q["select_endpoints"]).mappings()]


def pause(conn: Connection, name: str, reason: str) -> None:
    if conn.execute(_Q["pause_endpoint"], {"name": name, "reason": reason}).first() is None:
        raise NotFound(f"no endpoint named {name!r}")


def resume(conn: Connection, name: str) -> None:
    if conn.execute(_Q["resume_endpoint"], {"name": name}).first() is None:
        if get(conn, name).archived_at is not None:  # NotFound for an unknown name
            raise Conflict(f"endpoint {name!r} is archived; {unarchive_hint(name)}")
        raise NotFound(f"no endpoint named {name!r}")
    reset_budget(conn, name)
    wakeup.notify(conn, "resumed")


def unarchive_hint(name: str) -> str:
    """How to bring an archived endpoint back (the CLI's words; the API's route is
    POST /v1/endpoints/{name}/unarchive)."""
    return f"unarchive it first: outbox endpoints unarchive {name} --reason '...'"


def reset_budget(conn: Connection, name: str) -> None:
    """Resumed or reconfigured: the failing streak and the rest end, and the leased
    count is taken afresh (it is kept only while ``max_in_flight`` is set)."""
    conn.execute(_Q["reset_budget"], {"name": name})
