"""The bounds of every numeric endpoint setting: the one place that says them.

Checked on input by the domain (``endpoints``, ``admin``: the CLI and the API go
through them) and at the API's edge (``spark_outbox.api.admin_schemas`` builds its fields
from ``BOUNDS``), and held by the database's CHECK constraints (migration 1525,
``schema.endpoints``), so a row written by SQL directly cannot hold a value
that breaks the claim shared by every endpoint (a rate of 1e308 overflowed it:
every claim failed, for every endpoint). A test holds the constraints to these
numbers.

Why these numbers: a rate below one send in 1,000 s is an endpoint to pause,
not to limit; above 100,000 sends in flight or a million a second (the bench's
"limited but never waiting" endpoint) no dispatcher fleet gets near, and the
budget's refill (rate x seconds since the last claim) stays far from any
overflow; a send taking 10 minutes is a hung receiver; a retry a month away
outlives any outage worth retrying.
"""

from __future__ import annotations

import dataclasses
import math

from spark_outbox.core.errors import InvalidRequest


def _num(x: float) -> str:
    """600, 0.001, 2592000: as a person (and SQL) writes them, never 2.592e+06."""
    return format(x, "f").rstrip("0").rstrip(".") if x != int(x) else str(int(x))


@dataclasses.dataclass(frozen=True)
class Bound:
    """``low`` to ``high`` (``low`` excluded when ``above_low``), in ``unit``."""

    field: str
    low: float
    high: float
    unit: str
    example: str
    integer: bool = False
    above_low: bool = False
    # What null (the CLI's "none") means, for a setting that may be unset.
    unset: str = ""

    @property
    def range(self) -> str:
        low = f"more than {_num(self.low)}" if self.above_low else _num(self.low)
        return f"{low} to {_num(self.high)} {self.unit}".rstrip()

    def fix(self) -> str:
        unset = f", or null ({self.unset})" if self.unset else ""
        return f"give {self.range}, e.g. {self.example}{unset}"

    def check(self, value: object, field: str | None = None) -> float:
        """``value`` as a float (an int for an integer bound), or ``InvalidRequest``
        naming ``field`` (default: the setting's name) and the fix."""
        field = field or self.field
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequest(field, f"{value!r} is not a number", self.fix())
        try:
            number = float(value)
        except OverflowError:  # an int beyond any float
            raise InvalidRequest(field, "is out of range", self.fix()) from None
        if not math.isfinite(number):
            raise InvalidRequest(field, f"{value} is not a finite number", self.fix())
        if self.integer and not number.is_integer():
            raise InvalidRequest(field, f"{value:g} is not a whole number", self.fix())
        too_low = number <= self.low if self.above_low else number < self.low
        if too_low or number > self.high:
            raise InvalidRequest(field, f"{value:g} is out of range", self.fix())
        return int(value) if self.integer else number


TIMEOUT_S = Bound("timeout_s", 0, 600, "seconds", "10", above_low=True)
RATE_LIMIT_PER_S = Bound(
    "rate_limit_per_s", 0.001, 1_000_000, "sends per second", "50", unset="unlimited"
)
MAX_IN_FLIGHT = Bound(
    "max_in_flight", 1, 100_000, "sends in flight", "10", integer=True, unset="unlimited"
)
RETRY_DELAY_S = Bound("retry_schedule_s", 0, 30 * 86400, "seconds", "[0, 5, 300]")
SMTP_PORT = Bound("smtp_port", 1, 65535, "", "587", integer=True)
# A retry schedule: 1 to this many delays (each within RETRY_DELAY_S).
MAX_RETRIES = 50

BOUNDS = {b.field: b for b in (TIMEOUT_S, RATE_LIMIT_PER_S, MAX_IN_FLIGHT, SMTP_PORT)}


def sql_check(bound: Bound) -> str:
    """The CHECK constraint that holds ``bound`` in the database (NULL: unset)."""
    low = ">" if bound.above_low else ">="
    column = bound.field
    held = f"{column} {low} {_num(bound.low)} AND {column} <= {_num(bound.high)}"
    return f"{column} IS NULL OR ({held})"


# NaN is above every number in PostgreSQL, so "<= high" refuses it too; a NULL
# delay or a nested array would pass "ALL" unnoticed, so both are refused first.
RETRY_SCHEDULE_CHECK = (
    "retry_schedule_s IS NULL OR (array_ndims(retry_schedule_s) = 1"
    f" AND cardinality(retry_schedule_s) BETWEEN 1 AND {MAX_RETRIES}"
    " AND array_position(retry_schedule_s, NULL) IS NULL"
    f" AND {_num(RETRY_DELAY_S.low)} <= ALL (retry_schedule_s)"
    f" AND {_num(RETRY_DELAY_S.high)} >= ALL (retry_schedule_s))"
)


def check_optional(bound: Bound, value: object) -> float | None:
    """None (unset: no limit) or a value within ``bound``."""
    return None if value is None else bound.check(value)


def check_retry_schedule(value: object) -> list[float] | None:
    """None (the dispatcher's schedule) or 1 to MAX_RETRIES delays within RETRY_DELAY_S."""
    if value is None:
        return None
    fix = f"give 1 to {MAX_RETRIES} delays of {RETRY_DELAY_S.range}, e.g. [0, 5, 300], or null"
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise InvalidRequest("retry_schedule_s", f"{value!r} is not a list of delays", fix)
    delays = list(value)
    if not 1 <= len(delays) <= MAX_RETRIES:
        raise InvalidRequest("retry_schedule_s", f"has {len(delays)} delays", fix)
    for i, delay in enumerate(delays):
        try:
            RETRY_DELAY_S.check(delay, f"retry_schedule_s[{i}]")
        except InvalidRequest as exc:
            raise InvalidRequest(exc.field, exc.problem, fix) from None
    return [float(d) for d in delays]
