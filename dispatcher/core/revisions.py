"""Which release's schema the database holds, and refusing to run on an older one.

Migrations are expand-only (docs/operations.md, "Upgrading"): code of the previous
release keeps working on this release's schema, so this release's code accepts the
schema of a later release too (a revision it does not know is taken for one). The
other way round it cannot: this release's dispatcher, API and sink read and write
columns an older schema lacks. So they check once, at start, before touching
anything, and refuse in one line that names both revisions and the fix.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from spark_outbox.core import db
from spark_outbox.core.errors import ConfigurationError, DatabaseUnavailable

log = logging.getLogger(__name__)
_OUTBOX_BRANCH = "outbox"


class SchemaBehind(ConfigurationError):
    """The database's schema is older than this release's code (or absent)."""


@dataclasses.dataclass(frozen=True)
class SchemaRevision:
    """``current``: the outbox branch's revision in the database (None: never
    migrated); ``head``: this release's; ``known``: ``current`` is one of this
    release's revisions (an unknown one is a later release's)."""

    current: str | None
    head: str
    known: bool

    @property
    def usable(self) -> bool:
        """At this release's head, or at a later release's (expand-only keeps it usable)."""
        return self.current == self.head or (self.current is not None and not self.known)


@functools.cache
def _revisions() -> tuple[str, frozenset[str], frozenset[str]]:
    """(outbox head, the outbox branch's revisions, every revision): the installed
    code's, read once per process (loading the scripts imports every migration)."""
    script = ScriptDirectory.from_config(db.alembic_config("postgresql://x@localhost/x"))
    head = str(script.get_revision(db.OUTBOX_HEAD).revision)
    every = frozenset(rev.revision for rev in script.walk_revisions())
    outbox = frozenset(
        rev.revision
        for rev in script.walk_revisions()
        if _OUTBOX_BRANCH in _branches(script, rev.revision)
    )
    return head, outbox, every


def _branches(script: ScriptDirectory, revision: str) -> set[str]:
    return {
        label
        for rev in script.iterate_revisions(revision, "base")
        if rev is not None
        for label in rev.branch_labels
    }


def head() -> str:
    """The outbox schema's head in the installed code."""
    return _revisions()[0]


def read(engine: Engine) -> SchemaRevision:
    """The database's outbox revision beside this release's head."""
    head_rev, outbox, every = _revisions()
    with db.translated(), engine.connect() as conn:
        in_database = set(MigrationContext.configure(conn).get_current_heads())
    ours = sorted(in_database & outbox)
    if ours:
        return SchemaRevision(ours[0], head_rev, known=True)
    # Not ours: a later release's revision (of either branch: nothing tells them apart).
    later = sorted(in_database - every)
    return SchemaRevision(later[0] if later else None, head_rev, known=False)


def require_usable(engine: Engine, program: str, *, unreachable_ok: bool = False) -> None:
    """Refuse (``SchemaBehind``) unless the schema is at this release's head or later.

    ``program`` names what refuses ("the dispatcher") in the one-line message.
    ``unreachable_ok``: a service that rides out database outages (the dispatcher, the
    API) starts when the database cannot be reached, saying so; a one-shot job fails."""
    try:
        found = read(engine)
    except DatabaseUnavailable as exc:
        if not unreachable_ok:
            raise
        log.warning(
            "%s could not check the schema's revision (%s): starting anyway, "
            "/readyz and the first statements will tell",
            program,
            exc,
            extra={"event": "schema.unchecked", "program": program},
        )
        return
    if found.usable:
        return
    where = (
        "has no outbox schema (never migrated)"
        if found.current is None
        else f"has the outbox schema at revision {found.current}"
    )
    raise SchemaBehind(
        f"{program} refuses to start and changed nothing: the database {where}, and this "
        f"release needs revision {found.head}; run `outbox db upgrade` first "
        '(docs/operations.md, "Upgrading")'
    )
