"""The migration policy made mechanical: every revision after the previous release is
expand-only (migrations/README.md, docs/operations.md "Upgrading").

It reads the SQL the revisions emit in offline mode (``alembic upgrade A:B --sql``,
what ``outbox db sql`` prints), statement by statement, and names each statement
that would break the previous release's code or stall it behind a lock: a drop, a
rename, a type change, a new NOT NULL without a default, a rewrite, an index or a
validating constraint built under a lock on a table that existed before, a backfill
in the migration's transaction. A table created earlier in the scanned range is new:
nothing of the previous release reads it, and it is empty.

A contract step (a drop the previous release no longer needs) is allowed where its
revision declares it: ``CONTRACT = {"effects.old_column": "why nothing reads it"}``;
a statement naming a declared object passes.
"""

from __future__ import annotations

import dataclasses
import io
import re

from alembic import command
from alembic.script import ScriptDirectory

from spark_outbox.core import db

_CONTRACT_FIX = (
    "a drop is a contract step: ship the code that stops using it first, drop it a "
    "release later and declare it in the revision (CONTRACT = {...})"
)
_VOLATILE = re.compile(
    r"\b(NEXTVAL|RANDOM|CLOCK_TIMESTAMP|TIMEOFDAY|GEN_RANDOM_UUID|UUID_GENERATE_V\w*)\s*\("
    r"|\bGENERATED\b|\bSERIAL\b|\bBIGSERIAL\b|\bSMALLSERIAL\b"
)


@dataclasses.dataclass(frozen=True)
class Violation:
    revision: str
    statement: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"revision {self.revision}: `{self.statement[:160]}`: {self.problem}; {self.fix}"


def offline_sql(start: str, end: str) -> str:
    """The SQL of the revisions after ``start`` up to ``end``, as ``--sql`` prints it."""
    cfg = db.alembic_config("postgresql://offline@localhost/outbox")
    cfg.output_buffer = io.StringIO()
    command.upgrade(cfg, f"{start}:{end}", sql=True)
    return cfg.output_buffer.getvalue()


def by_revision(sql: str) -> list[tuple[str, list[str], list[str]]]:
    """(revision, its statements, those committed before its last autocommit block
    ends) in order, from offline SQL."""
    sql = re.sub(r"COMMIT;\s*$", "", sql)  # the run's own last commit
    parts = re.split(r"^-- Running upgrade \S+ -> (\S+)\s*$", sql, flags=re.MULTILINE)
    found = []
    for rev, body in zip(parts[1::2], parts[2::2], strict=True):
        block = re.search(r"^COMMIT;\s*$.*^BEGIN;\s*$", body, flags=re.MULTILINE | re.DOTALL)
        found.append((rev, statements(body), statements(body[: block.end()]) if block else []))
    return found


def rerun_problems(revision: str, committed: list[str]) -> list[Violation]:
    """A revision that commits midway (an autocommit block) runs again from its start
    when a later step fails (a lock timeout, a deadlock, a lost connection): what it
    committed must then run again without an error."""
    fix = (
        "a revision with an autocommit block runs again from its start after a failure: "
        "use IF NOT EXISTS, CREATE OR REPLACE, or drop the object IF EXISTS just before"
    )
    found = []
    for at, statement in enumerate(committed):
        s, earlier = statement.upper(), " ; ".join(x.upper() for x in committed[:at])
        if _fails_again(s, earlier):
            found.append(Violation(revision, statement, "it fails when run again", fix))
    return found


def _fails_again(s: str, earlier: str) -> bool:
    fresh = r"(?!IF NOT EXISTS\b)"
    if re.match(rf"CREATE (UNIQUE )?(TABLE|INDEX( CONCURRENTLY)?+|VIEW|FUNCTION) {fresh}", s):
        return True
    if re.search(rf"\bADD COLUMN {fresh}", s):
        return True
    again = re.match(r"CREATE (TRIGGER) (\w+)", s) or re.search(r"\bADD (CONSTRAINT) (\w+)", s)
    dropped = again and re.search(rf"\bDROP {again[1]} IF EXISTS {again[2]}\b", earlier)
    return bool(again and not dropped)


def statements(sql: str) -> list[str]:
    """Split on semicolons outside quotes, dollar quotes and comments; comments dropped,
    whitespace collapsed; the transaction's own BEGIN/COMMIT and version rows left out."""
    found, current, i = [], [], 0
    while i < len(sql):
        if sql.startswith("--", i):
            i = _end_of(sql, "\n", i)
            continue
        if sql.startswith("/*", i):
            i = _end_of(sql, "*/", i + 2)
            continue
        tag = re.match(r"\$\w*\$", sql[i:])
        if tag:
            end = _end_of(sql, tag.group(), i + len(tag.group()))
            current.append(sql[i:end])
            i = end
            continue
        if sql[i] in "'\"":
            end = _end_of(sql, sql[i], i + 1)
            current.append(sql[i:end])
            i = end
            continue
        if sql[i] == ";":
            found.append(" ".join("".join(current).split()))
            current = []
        else:
            current.append(sql[i])
        i += 1
    found.append(" ".join("".join(current).split()))
    skip = re.compile(r"^(BEGIN|COMMIT|UPDATE alembic_version |INSERT INTO alembic_version )", re.I)
    return [s for s in found if s and not skip.match(s)]


def _end_of(sql: str, closing: str, start: int) -> int:
    at = sql.find(closing, start)
    return len(sql) if at < 0 else at + len(closing)


def check(
    revision: str, sql: list[str], new_tables: set[str], declared: set[str]
) -> list[Violation]:
    """The violations among one revision's statements. ``new_tables``: created earlier
    in the range (this revision's CREATE TABLEs are added to it)."""
    found = []
    for at, statement in enumerate(sql):
        upper = statement.upper()
        created = re.match(r"CREATE (UNLOGGED )?TABLE (IF NOT EXISTS )?(\w+)", upper)
        if created:
            new_tables.add(created.group(3).lower())
            continue
        later = [s.upper() for s in sql[at + 1 :]]
        for problem, fix in _problems(upper, later, new_tables):
            if not any(name in statement for name in declared):
                found.append(Violation(revision, statement, problem, fix))
    return found


def _problems(s: str, later: list[str], new: set[str]) -> list[tuple[str, str]]:
    table = _table(s)
    existing = table is not None and table not in new
    rules = [_drop(s, later), _rename(s), _alter_column(s, existing)]
    rules += [_add_column(s, existing), _index(s, existing), _constraint(s, existing)]
    rules += [_rewrite(s), _backfill(s, existing)]
    return [rule for rule in rules if rule is not None]


def _table(s: str) -> str | None:
    m = re.match(
        r"(?:ALTER TABLE (?:IF EXISTS )?(?:ONLY )?|UPDATE (?:ONLY )?|DELETE FROM (?:ONLY )?|"
        r"CREATE (?:UNIQUE )?INDEX (?:CONCURRENTLY )?(?:IF NOT EXISTS )?\w* ?ON (?:ONLY )?)"
        r"(\w+)",
        s,
    )
    return m.group(1).lower() if m else None


def _drop(s: str, later: list[str]) -> tuple[str, str] | None:
    """DROP of a function, trigger or constraint that the same revision creates again is
    a replacement; any other drop (TRUNCATE too) is a contract step."""
    if s.startswith("TRUNCATE"):
        return "TRUNCATE removes rows the previous release reads", _CONTRACT_FIX
    m = re.match(r"DROP (FUNCTION|TRIGGER) (?:IF EXISTS )?(\w+)", s) or re.search(
        r"\bDROP (CONSTRAINT) (?:IF EXISTS )?(\w+)", s
    )
    if m:
        kind, name = m.groups()
        again = rf"\b{kind} (?:IF NOT EXISTS )?{name}\b"
        if any(re.search(again, x) and ("CREATE" in x or "ADD" in x) for x in later):
            return None
        return f"DROP {kind} {name.lower()} without creating it again", _CONTRACT_FIX
    if re.match(r"DROP \w+", s) or re.search(r"\bDROP (COLUMN|DEFAULT)\b", s):
        return "a drop breaks the previous release, which still uses what it drops", _CONTRACT_FIX
    return None


def _rename(s: str) -> tuple[str, str] | None:
    if re.match(r"ALTER \w+ .*\bRENAME\b", s):
        return "a rename breaks the previous release, which uses the old name", (
            "add the new name beside the old one (a column both releases write, or a "
            "view), move readers over, drop the old one a release later"
        )
    return None


def _alter_column(s: str, existing: bool) -> tuple[str, str] | None:
    if re.search(r"\bALTER (COLUMN )?\w+ (SET DATA )?TYPE\b", s):
        return "a type change rewrites the table under an exclusive lock", (
            "add a column of the new type, backfill it in batches after the upgrade, "
            "move readers over, drop the old one a release later"
        )
    if existing and re.search(r"\bSET NOT NULL\b", s):
        return "SET NOT NULL scans the table under an exclusive lock and fails old writers", (
            "add CHECK (column IS NOT NULL) NOT VALID, VALIDATE it after a backfill, "
            "once no release writes NULL"
        )
    return None


def _add_column(s: str, existing: bool) -> tuple[str, str] | None:
    m = re.search(r"\bADD (?:COLUMN )?(?:IF NOT EXISTS )?\w+ (.*)", s)
    if not existing or not m or re.search(r"\bADD (CONSTRAINT|PRIMARY|UNIQUE|CHECK)\b", s):
        return None
    spec = m.group(1)
    if _VOLATILE.search(spec):
        return "a volatile default or an identity rewrites the table under an exclusive lock", (
            "add the column NULL (or with a constant default) and fill it after the upgrade"
        )
    if "NOT NULL" in spec and "DEFAULT" not in spec:
        return "a NOT NULL column without a default fails the previous release's inserts", (
            "give it a constant DEFAULT, or add it NULL"
        )
    if re.search(r"\b(REFERENCES|UNIQUE|PRIMARY KEY)\b", spec):
        return "an inline constraint validates or indexes the table under the lock", (
            "add the column bare, then the constraint NOT VALID (or its index CONCURRENTLY)"
        )
    return None


def _index(s: str, existing: bool) -> tuple[str, str] | None:
    if existing and re.match(r"CREATE (UNIQUE )?INDEX (?!CONCURRENTLY)", s):
        return "an index built without CONCURRENTLY blocks the table's writes while it builds", (
            "build it CONCURRENTLY inside `with op.get_context().autocommit_block():` "
            "(migrations/README.md)"
        )
    return None


def _constraint(s: str, existing: bool) -> tuple[str, str] | None:
    m = re.search(r"\bADD (?:CONSTRAINT \w+ )?(CHECK|FOREIGN KEY|UNIQUE|PRIMARY KEY|EXCLUDE)\b", s)
    if not existing or not m:
        return None
    if m.group(1) in ("CHECK", "FOREIGN KEY"):
        if "NOT VALID" in s:
            return None
        return f"{m.group(1)} validates every row under the lock", (
            "add it NOT VALID, then VALIDATE CONSTRAINT in an autocommit block"
        )
    if "USING INDEX" in s:
        return None
    return f"{m.group(1)} builds its index under the lock", (
        "build a unique index CONCURRENTLY, then ADD CONSTRAINT ... USING INDEX"
    )


def _rewrite(s: str) -> tuple[str, str] | None:
    if re.search(r"\bSET (LOGGED|UNLOGGED|TABLESPACE|WITHOUT OIDS)\b|^CLUSTER\b|^VACUUM FULL\b", s):
        return "this rewrites the table under an exclusive lock", (
            "do it out of band, in a maintenance window, not in a revision"
        )
    if s.startswith("LOCK "):
        return "an explicit table lock stalls the previous release", "leave the locking to DDL"
    return None


def _backfill(s: str, existing: bool) -> tuple[str, str] | None:
    if existing and re.match(r"(UPDATE|DELETE FROM) ", s):
        return "a backfill in the revision's transaction locks every row it touches", (
            "backfill after the upgrade, in batches (the migrate step), or from the "
            "code that reads the new column"
        )
    return None


def scan(start: str, end: str) -> list[Violation]:
    """Every violation in the revisions after ``start`` up to ``end``."""
    script = ScriptDirectory.from_config(db.alembic_config("postgresql://x@localhost/x"))
    new: set[str] = set()
    found = []
    for revision, sql, committed in by_revision(offline_sql(start, end)):
        module = script.get_revision(revision).module
        declared = set(getattr(module, "CONTRACT", {}))
        found += check(revision, sql, new, {n.split(".")[-1] for n in declared})
        found += rerun_problems(revision, committed)
    return found
