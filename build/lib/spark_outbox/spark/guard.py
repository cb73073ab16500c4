"""The volume guard: hold a batch whose new effects are far above the job's usual.

Per (job, endpoint) the *baseline* is the median of the new effects that
endpoint got in the job's last ``window`` committed batches that gave it any
(a stream's empty micro-batches do not drag the median to 0; held and cancelled
batches do not count, released ones do). There is no baseline until
``min_batches`` such batches exist. A batch is
*held* when, for any endpoint, its new effects exceed ``max_effects`` (an
absolute cap, off by default), or exceed ``factor`` x the baseline while being
at least ``min_effects`` (small batches are never held by the factor rule).

A held batch commits as usual (its results, rejects and marker), but its effects
are not claimable until an operator releases it (``outbox batches release``) or
cancels it (docs/operations.md). The decision is made inside the commit
transaction, so the effects are never claimable before it.

Configured per sink (a job) and per endpoint (``endpoints`` overrides); on by
default; ``VolumeGuard.off()`` switches it off (docs/spark.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from sqlalchemy.engine import Connection

from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "guard.sql")


@dataclasses.dataclass(frozen=True)
class Limits:
    enabled: bool = True
    factor: float = 10.0
    min_effects: int = 100
    max_effects: int | None = None
    window: int = 20
    min_batches: int = 5

    def __post_init__(self) -> None:
        if self.factor <= 1:
            raise ConfigurationError(f"volume guard factor={self.factor}: use a number above 1")
        if self.window < 1 or not 1 <= self.min_batches <= self.window:
            raise ConfigurationError(
                f"volume guard window={self.window}, min_batches={self.min_batches}: "
                "use 1 <= min_batches <= window"
            )
        if self.max_effects is not None and self.max_effects < 1:
            raise ConfigurationError(f"volume guard max_effects={self.max_effects}: use >= 1")


@dataclasses.dataclass(frozen=True)
class VolumeGuard:
    """The job's limits, and per-endpoint overrides (endpoint name -> Limits)."""

    limits: Limits = Limits()
    endpoints: Mapping[str, Limits] = dataclasses.field(default_factory=dict)

    @classmethod
    def off(cls) -> VolumeGuard:
        return cls(Limits(enabled=False))

    def for_endpoint(self, endpoint: str) -> Limits:
        return self.endpoints.get(endpoint, self.limits)


@dataclasses.dataclass(frozen=True)
class Baseline:
    batches: int  # committed batches the median was taken over (at most the window)
    median: float


def baselines(
    conn: Connection, job: str, guard: VolumeGuard, endpoints: list[str]
) -> dict[str, Baseline]:
    """Each endpoint's baseline from the job's recent markers (ix_batches_job_committed_at)."""
    found = {}
    for endpoint in endpoints:
        limits = guard.for_endpoint(endpoint)
        if not limits.enabled:
            continue
        params = {"job": job, "endpoint": endpoint, "window": limits.window}
        batches, median = conn.execute(_Q["baseline"], params).one()
        found[endpoint] = Baseline(int(batches), float(median or 0))
    return found


def hold_reason(
    guard: VolumeGuard, new_by_endpoint: Mapping[str, int], found: Mapping[str, Baseline]
) -> str | None:
    """Why the batch is held (every endpoint over its limit), or None to let it flow."""
    reasons = []
    for endpoint, new in sorted(new_by_endpoint.items()):
        limits = guard.for_endpoint(endpoint)
        if not limits.enabled:
            continue
        if limits.max_effects is not None and new > limits.max_effects:
            reasons.append(f"{endpoint}: {new} new effects, above the cap of {limits.max_effects}")
            continue
        base = found.get(endpoint)
        if base is None or base.batches < limits.min_batches or new < limits.min_effects:
            continue
        if new > limits.factor * base.median:
            reasons.append(
                f"{endpoint}: {new} new effects, above {limits.factor:g}x the median "
                f"{base.median:g} of the last {base.batches} batches"
            )
    return "; ".join(reasons) or None
