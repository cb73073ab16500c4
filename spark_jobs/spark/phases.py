"""Named phases of a batch write, where a test can print, pause or act.

The phases, in order: ``writing`` (the driver starts the executors),
``effects_written`` (an executor's first chunk of effects committed, invisible),
``written`` (every task reported), ``before_commit`` (the commit transaction's
statements ran, COMMIT not sent), ``after_commit``.

``reached(name)`` runs the hooks registered for the phase: in production there
are none, and it returns at once. Tests register hooks two ways:

- ``OUTBOX_SPARK_PHASES``, read once per process (drivers, and executors, which
  inherit it in local mode): ``print`` prints ``outbox-phase: <name> (pid <n>, code <file>)``
  on stderr at every phase (a kill test waits for a line, then SIGKILLs);
  ``<phase>:<seconds>`` prints, and pauses that long at that phase so the kill
  lands exactly there (``<phase>`` alone: 60 s).
- ``on(name, fn)``: an in-process test registers a callback, e.g. one that cuts
  the commit connection.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable

from spark_outbox.core.errors import ConfigurationError

ENV = "OUTBOX_SPARK_PHASES"
NAMES = ("writing", "effects_written", "written", "before_commit", "after_commit")
PAUSE_S = 60.0

Hook = Callable[[], None]


def reached(name: str) -> None:
    for hook in _hooks().get(name, ()):
        hook()


def on(name: str, hook: Hook) -> Callable[[], None]:
    """Register ``hook`` for phase ``name``; returns a function that removes it."""
    hooks = _hooks().setdefault(_known(name, "on()"), [])
    hooks.append(hook)
    return lambda: hooks.remove(hook)


@functools.cache
def _hooks() -> dict[str, list[Hook]]:
    """The process's hooks by phase: first the ones ``OUTBOX_SPARK_PHASES`` asks for."""
    setting = os.environ.get(ENV, "")
    if not setting:
        return {}
    hooks: dict[str, list[Hook]] = {name: [functools.partial(_announce, name)] for name in NAMES}
    if setting != "print":
        name, _, seconds = setting.partition(":")
        where = f"{ENV}={setting!r} ('print' or '<phase>:<seconds>')"
        hooks[_known(name, where)].append(functools.partial(time.sleep, _seconds(seconds, setting)))
    return hooks


def _announce(name: str) -> None:
    # The code's file too: a shipped zip or an installed copy (the cluster test reads it).
    print(f"outbox-phase: {name} (pid {os.getpid()}, code {__file__})", file=sys.stderr, flush=True)


def _known(name: str, where: str) -> str:
    if name not in NAMES:
        raise ConfigurationError(f"{where}: no phase named {name!r}; name one of {NAMES}")
    return name


def _seconds(text: str, setting: str) -> float:
    try:
        return float(text) if text else PAUSE_S
    except ValueError:
        raise ConfigurationError(
            f"{ENV}={setting!r}: {text!r} is not a number of seconds; e.g. 'before_commit:20'"
        ) from None
