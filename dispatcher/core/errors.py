"""The project's one error root. Domain errors know nothing of HTTP."""

from __future__ import annotations


class OutboxError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigurationError(OutboxError):
    """A setting is missing or wrong; the message says which and how to fix it."""


class InvalidInput(OutboxError):
    """Input that breaks a rule; nothing was written.

    ``field`` names the offending field and ``fix`` says what to do about it, so
    a caller can show both to the person who typed or produced it.
    """

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}; {fix}")


class InvalidEffect(InvalidInput):
    """An effect breaks the column contract (a producer's mistake)."""


class InvalidRequest(InvalidInput):
    """An operator's or an API client's input is wrong: a reason, a cap, a name, a role,
    an endpoint's settings, a search filter."""


class UnknownEndpoint(InvalidEffect):
    # How its message starts, also as a reject's reason: the one reject a fix
    # outside the data (registering the endpoint) can cure, found by this prefix.
    PREFIX = "endpoint: no endpoint named "

    def __init__(self, name: str) -> None:
        super().__init__(
            "endpoint",
            f"no endpoint named {name!r} is registered",
            "register it first with `outbox endpoints add` or fix the name",
        )
        self.name = name


class ArchivedEndpoint(InvalidEffect):
    """The effect names an archived endpoint, which accepts no new effects."""

    def __init__(self, name: str) -> None:
        super().__init__(
            "endpoint",
            f"endpoint {name!r} is archived and accepts no new effects",
            f"unarchive it (`outbox endpoints unarchive {name} --reason ...`, or POST "
            f"/v1/endpoints/{name}/unarchive) or name another endpoint",
        )
        self.name = name


class NotFound(OutboxError):
    """The thing asked for does not exist."""


class Conflict(OutboxError):
    """The request contradicts the current state (e.g. requeue a delivered effect)."""


class DatabaseUnavailable(OutboxError):
    """PostgreSQL could not be reached or started."""


class UpgradeBlocked(OutboxError):
    """``outbox db upgrade`` gave up waiting for the locks its revisions need (each
    wait bounded, so the traffic queued behind it never waits longer)."""
