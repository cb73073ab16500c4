"""The optional parts of the distribution, and the one-line refusal when one is missing.

A core install (``pip install spark-outbox``) runs the dispatcher, the database
commands and every operator command. A command that needs more says so before it
imports anything: ``set_defaults(extras=(...))`` on its parser, checked by
``main`` with :func:`require`. The names and modules mirror pyproject.toml's
``[project.optional-dependencies]``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from spark_outbox.core.errors import ConfigurationError

# extra -> the modules its commands import (checked without importing them).
MODULES: dict[str, tuple[str, ...]] = {
    "api": ("fastapi", "uvicorn", "jinja2", "multipart"),
    "spark": ("pyspark", "pyarrow", "pandas"),
    "connect": ("grpc", "google.rpc", "zstandard"),
    "demo": ("aiohttp", "aiosmtpd", "standardwebhooks"),
}


class MissingExtra(ConfigurationError):
    """A command needs an optional part that is not installed."""


def missing_modules(extra: str) -> list[str]:
    return [name for name in MODULES[extra] if importlib.util.find_spec(name) is None]


def require(extras: Sequence[str], command: str) -> None:
    """Refuse ``command`` in one line naming the extras to install, if any is missing."""
    lacking = [(extra, missing_modules(extra)) for extra in extras]
    lacking = [(extra, mods) for extra, mods in lacking if mods]
    if not lacking:
        return
    names = [extra for extra, _ in lacking]
    said = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    modules = ", ".join(m for _, mods in lacking for m in mods)
    raise MissingExtra(
        f"{command} needs the {said} extra{'s' if len(names) > 1 else ''} "
        f"(missing: {modules}); install with: pip install 'spark-outbox[{','.join(names)}]'"
    )
