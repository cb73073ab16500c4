"""Pydantic models of the administration routes (endpoints, secrets, tokens, recover).

A model that carries a secret (``*SecretPublic``) is returned once, to the
operator who created or rotated it, with ``Cache-Control: no-store``.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field

from spark_outbox.api.schemas import ActionCreate, Public
from spark_outbox.core import bounds
from spark_outbox.core.errors import InvalidRequest

NO_NUL = r"^[^\x00]*$"


def _within(bound: bounds.Bound) -> Any:
    """A numeric setting checked at the edge by the domain's own bound (one place of
    truth, ``spark_outbox.core.bounds``): refused with its message (before pydantic's own
    parsing, whose words for 1e308 as an integer name no fix), the bound in the schema."""

    def check(value: Any) -> float:
        try:
            return bound.check(value)
        except InvalidRequest as exc:
            raise ValueError(f"{exc.problem}; {exc.fix}") from None

    low = "exclusiveMinimum" if bound.above_low else "minimum"
    limits = {low: bound.low, "maximum": bound.high}
    return BeforeValidator(check), Field(json_schema_extra=limits)  # type: ignore[arg-type]


TimeoutS = Annotated[float, *_within(bounds.TIMEOUT_S)]
RatePerS = Annotated[float, *_within(bounds.RATE_LIMIT_PER_S)]
InFlight = Annotated[int, *_within(bounds.MAX_IN_FLIGHT)]
RetryDelayS = Annotated[float, *_within(bounds.RETRY_DELAY_S)]
RetrySchedule = Annotated[list[RetryDelayS], Field(min_length=1, max_length=bounds.MAX_RETRIES)]
SmtpPort = Annotated[int, *_within(bounds.SMTP_PORT)]


class EndpointPublic(Public):
    name: str
    kind: str
    url: str | None
    smtp_host: str | None
    smtp_port: int | None
    smtp_tls: str
    smtp_username: str | None
    has_smtp_password: bool = Field(False, description="the password itself is never shown")
    smtp_allow_plaintext_auth: bool
    mail_from: str | None
    timeout_s: float
    retry_schedule_s: list[float] | None
    rate_limit_per_s: float | None = Field(description="sends per second, all dispatchers together")
    max_in_flight: int | None = Field(description="sends in flight, all dispatchers together")
    ordered: bool = Field(description="per-key ordering: an effect waits for earlier ones")
    deduplicates: bool = Field(
        description="the receiver honours the idempotency key; if false, a send whose outcome "
        "is unknown becomes 'uncertain' instead of being sent again"
    )
    enabled: bool
    paused_reason: str | None
    resting_until: dt.datetime | None = Field(
        None, description="circuit breaker: no dispatcher sends to it before this"
    )
    previous_secret_expires_at: dt.datetime | None = Field(
        description="while in the future, deliveries are also signed with the previous secret"
    )
    overlapping_secrets_until: list[dt.datetime] = Field(
        [],
        description="when each earlier signing secret still signing (beside the current one) "
        "stops, soonest first",
    )
    archived_at: dt.datetime | None = Field(
        None, description="archived: accepts no new effects and sends nothing; history kept"
    )
    archived_reason: str | None = None
    created_at: dt.datetime
    updated_at: dt.datetime

    @classmethod
    def of(cls, endpoint: Any) -> EndpointPublic:
        """From a domain ``Endpoint``, through its ``public()`` view (no secrets)."""
        return cls.model_validate(endpoint.public())


class WebhookCreate(ActionCreate):
    name: str = Field(min_length=1, max_length=200, pattern=NO_NUL)
    url: str = Field(min_length=1, max_length=2000, pattern=NO_NUL)
    timeout_s: TimeoutS = 10.0
    retry_schedule_s: RetrySchedule | None = None
    rate_limit_per_s: RatePerS | None = None
    max_in_flight: InFlight | None = None
    ordered: bool = False
    deduplicates: bool = Field(
        True, description="false if the receiver does not honour the webhook-id header"
    )


class EndpointSecretPublic(BaseModel):
    endpoint: EndpointPublic
    signing_secret: str = Field(description="shown once: give it to the receiver now")


class EndpointUpdate(ActionCreate):
    """Only the fields sent change; ``null`` clears retry_schedule_s, rate_limit_per_s
    and max_in_flight."""

    url: str | None = Field(None, min_length=1, max_length=2000, pattern=NO_NUL)
    timeout_s: TimeoutS | None = None
    retry_schedule_s: RetrySchedule | None = None
    rate_limit_per_s: RatePerS | None = None
    max_in_flight: InFlight | None = None
    ordered: bool | None = None
    deduplicates: bool | None = None
    smtp_host: str | None = Field(None, min_length=1, max_length=255, pattern=NO_NUL)
    smtp_port: SmtpPort | None = None
    smtp_tls: str | None = Field(None, pattern=r"^(none|starttls|tls)$")
    smtp_username: str | None = Field(None, min_length=1, max_length=500, pattern=NO_NUL)
    smtp_password: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        pattern=NO_NUL,
        description="never shown again; the audit says '(changed)'",
    )
    mail_from: str | None = Field(None, min_length=3, max_length=500, pattern=NO_NUL)
    smtp_allow_plaintext_auth: bool | None = None


class ArchiveCreate(ActionCreate):
    cancel_pending: bool = Field(
        False,
        description="cancel the endpoint's pending effects with the archive; false: refuse "
        "while any are pending",
    )


class ArchivedPublic(BaseModel):
    endpoint: str
    cancelled: int = Field(description="pending effects cancelled with the archive")


class RotateSecretCreate(ActionCreate):
    overlap_s: float = Field(
        86400.0, ge=0, le=30 * 86400, description="the old secret keeps signing this long"
    )


class RotationPublic(BaseModel):
    endpoint: str
    signing_secret: str = Field(description="shown once: give it to the receiver now")
    previous_valid_until: dt.datetime | None


class RecoverCreate(ActionCreate):
    since: dt.datetime = Field(description="requeue effects that died at or after this time")
    cap: int = Field(1000, ge=1, le=10_000, description="refuse if more dead effects match")
    dry_run: bool = Field(True, description="only count; send false to requeue")


class TokenCreate(ActionCreate):
    name: str = Field(min_length=1, max_length=200, pattern=NO_NUL)
    role: str = Field(pattern=r"^(support|operator)$")


class TokenSecretPublic(BaseModel):
    name: str
    role: str
    token: str = Field(description="shown once; only its sha256 is stored")
