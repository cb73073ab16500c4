"""The current text of every view, SQL function and trigger of the outbox schema.

Tables, indexes and constraints are the SQLAlchemy tables of ``spark_outbox.core.schema``;
the rest of the schema is SQL, one file per concern in this package (``due.sql``:
the views that define "due" and the trigger that unparks).
A file holds one block per object, introduced by ``-- name: <object>`` and a
comment saying why it exists (``spark_outbox.core.sqltext``'s format). Every block can
run again over a database that already has its object: views and functions are
``CREATE OR REPLACE``, a trigger is dropped and created.

The migrations up to now are history and spell their objects out. A new revision
that changes an object edits its file, then runs the new text::

    op.execute(objects.text("due_effects"))  # one object
    op.execute(objects.concern("due"))  # a whole file, in its order

The text is head's, not the revision's time's: an upgrade from an empty database
runs every revision that reads it with the newest text. So before an object
changes again, the older revisions that read it get the text they ran pasted in
(history stays history). tests/test_catalog.py proves the files build what the
migrations build, and that every object is in one of them.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from spark_outbox.core import sqltext

DIRECTORY = Path(__file__).parent


def concerns() -> tuple[str, ...]:
    """The concern files' names (``due`` for ``objects/due.sql``), sorted."""
    return tuple(sorted(path.stem for path in DIRECTORY.glob("*.sql")))


def _blocks(concern_name: str) -> dict[str, str]:
    path = DIRECTORY / f"{concern_name}.sql"
    if not path.is_file():
        raise LookupError(
            f"no concern file {path.name} in {DIRECTORY}: use one of {', '.join(concerns())}"
        )
    return sqltext.load(path)


def _owners() -> dict[str, str]:
    owners: dict[str, str] = {}
    for concern_name in concerns():
        for name in _blocks(concern_name):
            if name in owners:
                raise ValueError(
                    f"{name} is defined in both {owners[name]}.sql and {concern_name}.sql: keep one"
                )
            owners[name] = concern_name
    return owners


def names() -> dict[str, str]:
    """Every object's name, with the concern whose file defines it."""
    return dict(_owners())


def text(name: str) -> str:
    """The SQL that makes object ``name`` what it is at head."""
    owner = _owners().get(name)
    if owner is None:
        raise LookupError(
            f"no view, function or trigger named {name!r} in {DIRECTORY}:"
            f" use one of {', '.join(sorted(_owners()))}"
        )
    return _blocks(owner)[name]


def concern(concern_name: str) -> str:
    """The SQL of a whole concern file, its objects in the file's order."""
    return "\n\n".join(_blocks(concern_name).values())


def apply(connection: sa.Connection, *concern_names: str) -> None:
    """Run concern files (all of them, in ``concerns()`` order, when none is named)
    as a migration's ``op.execute`` would: through ``text()``."""
    for concern_name in concern_names or concerns():
        connection.execute(sa.text(concern(concern_name)))
