"""Every revision after the previous release is expand-only (tests/upgrade/policy.py
says what that means statement by statement; migrations/README.md says it for authors)."""

from __future__ import annotations

import pytest

from tests.upgrade import policy, previous


def test_every_revision_since_the_previous_release_is_expand_only() -> None:
    release = previous.recorded()
    found = policy.scan(release.revision, "outbox@head")
    found += policy.scan(release.billing_revision, "billing@head")
    assert not found, "migrations that break the previous release:\n" + "\n".join(map(str, found))


def test_the_scan_finds_what_made_earlier_upgrades_offline() -> None:
    """The releases before the policy: 0003 renames, 1201 drops tables, 0001's indexes
    and the later ones were built without CONCURRENTLY."""
    found = policy.scan("0001", previous.recorded().revision)
    by = {(v.revision, v.problem.split(" ")[1]) for v in found}
    assert ("0003", "rename") in by
    assert any(r == "1201" and "drop" in v.problem for v in found for r in [v.revision])
    assert any("CONCURRENTLY" in v.fix and v.revision == "1403" for v in found)


def _problems(*sql: str, new: tuple[str, ...] = (), declared: tuple[str, ...] = ()) -> list[str]:
    return [v.problem for v in policy.check("r", list(sql), set(new), set(declared))]


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE effects ADD COLUMN resend_action_id BIGINT",
        "ALTER TABLE batches ADD COLUMN effects_purged BIGINT DEFAULT '0' NOT NULL",
        "ALTER TABLE effects ADD COLUMN seen_at TIMESTAMP WITH TIME ZONE DEFAULT now()",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_effects_x ON effects (x)",
        "CREATE OR REPLACE VIEW due_effects AS SELECT * FROM claimable_effects",
        "ALTER TABLE effects ADD CONSTRAINT ck_effects_state CHECK (state IN ('a')) NOT VALID",
        "ALTER TABLE effects VALIDATE CONSTRAINT ck_effects_state",
        "ALTER TABLE effects ALTER COLUMN reference DROP NOT NULL",
        "CREATE TRIGGER t AFTER INSERT ON effects FOR EACH ROW EXECUTE FUNCTION f()",
        "INSERT INTO effect_counts (endpoint, n) SELECT endpoint, count(*) FROM effects GROUP BY 1",
        "SET LOCAL lock_timeout = '10s'",
    ],
)
def test_expanding_statements_pass(sql: str) -> None:
    assert _problems(sql) == []


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        ("ALTER TABLE effects RENAME COLUMN reference TO ref", "rename"),
        ("ALTER INDEX ix_effects_due RENAME TO ix_due", "rename"),
        ("DROP TABLE staged_effects", "drop"),
        ("ALTER TABLE effects DROP COLUMN reference", "drop"),
        ("ALTER TABLE effects ALTER COLUMN payload DROP DEFAULT", "drop"),
        ("DROP VIEW due_effects", "drop"),
        ("DROP TRIGGER t ON effects", "without creating it again"),
        ("TRUNCATE rejects", "TRUNCATE"),
        ("ALTER TABLE effects ALTER COLUMN attempt_count TYPE BIGINT", "type change"),
        ("ALTER TABLE effects ALTER COLUMN reference SET NOT NULL", "SET NOT NULL"),
        ("ALTER TABLE effects ADD COLUMN x TEXT NOT NULL", "without a default"),
        ("ALTER TABLE effects ADD COLUMN u UUID DEFAULT gen_random_uuid()", "volatile"),
        ("ALTER TABLE effects ADD COLUMN n BIGINT GENERATED ALWAYS AS IDENTITY", "identity"),
        ("ALTER TABLE effects ADD COLUMN b BIGINT REFERENCES batches (id)", "inline"),
        ("CREATE INDEX ix_effects_x ON effects (x)", "CONCURRENTLY"),
        ("CREATE UNIQUE INDEX ix_effects_x ON effects (x)", "CONCURRENTLY"),
        ("ALTER TABLE effects ADD CONSTRAINT c CHECK (attempt_count >= 0)", "validates"),
        ("ALTER TABLE effects ADD CONSTRAINT f FOREIGN KEY (b) REFERENCES batches (id)", "valid"),
        ("ALTER TABLE effects ADD CONSTRAINT u UNIQUE (reference)", "builds its index"),
        ("ALTER TABLE staged_results SET LOGGED", "rewrites"),
        ("UPDATE effects SET reference = job", "backfill"),
        ("DELETE FROM delivery_attempts WHERE outcome = 'stale'", "backfill"),
    ],
)
def test_statements_that_break_the_previous_release_are_named(sql: str, problem: str) -> None:
    (found,) = _problems(sql)
    assert problem in found


def test_a_replaced_trigger_function_or_constraint_is_no_drop() -> None:
    assert (
        _problems(
            "DROP TRIGGER IF EXISTS t ON operator_actions",
            "CREATE TRIGGER t BEFORE UPDATE ON operator_actions FOR EACH ROW EXECUTE FUNCTION f()",
            "ALTER TABLE effects DROP CONSTRAINT ck_effects_state",
            "ALTER TABLE effects ADD CONSTRAINT ck_effects_state CHECK (state IN ('a')) NOT VALID",
        )
        == []
    )


def test_a_table_created_in_the_range_is_new_and_may_be_indexed_and_filled() -> None:
    assert (
        _problems(
            "CREATE TABLE effect_counts (id BIGINT, n BIGINT)",
            "CREATE INDEX ix_effect_counts_n ON effect_counts (n)",
            "UPDATE effect_counts SET n = 0",
        )
        == []
    )
    assert (
        _problems("CREATE INDEX ix_effect_counts_n ON effect_counts (n)", new=("effect_counts",))
        == []
    )


def test_a_declared_contract_step_passes_and_nothing_else_does() -> None:
    drops = ("ALTER TABLE effects DROP COLUMN old_reference", "DROP TABLE staged_effects")
    assert _problems(*drops, declared=("old_reference", "staged_effects")) == []
    assert len(_problems(*drops, declared=("old_reference",))) == 1


def test_statements_split_outside_quotes_bodies_and_comments() -> None:
    sql = (
        "BEGIN;\n-- a comment; with a semicolon\nCREATE FUNCTION f() RETURNS trigger AS $$\n"
        "BEGIN RAISE 'a; b'; END $$;;\nUPDATE alembic_version SET version_num='2';\n"
        "COMMENT ON TABLE effects IS 'x;y';\nCOMMIT;"
    )
    assert policy.statements(sql) == [
        "CREATE FUNCTION f() RETURNS trigger AS $$ BEGIN RAISE 'a; b'; END $$",
        "COMMENT ON TABLE effects IS 'x;y'",
    ]


def test_a_revision_that_commits_midway_must_run_again_without_an_error() -> None:
    """What it committed before its autocommit block ends runs again after a later
    failure; what comes after the block rolls back with the failure."""
    sql = """BEGIN;

-- Running upgrade a -> b

CREATE TABLE effect_counts (n int);
CREATE TABLE IF NOT EXISTS effect_sums (n int);
DROP TRIGGER IF EXISTS counted ON effects;
CREATE TRIGGER counted AFTER INSERT ON effects FOR EACH ROW EXECUTE FUNCTION f();
CREATE TRIGGER summed AFTER INSERT ON effects FOR EACH ROW EXECUTE FUNCTION g();
ALTER TABLE effects ADD COLUMN IF NOT EXISTS expires_at TIMESTAMP WITH TIME ZONE;
COMMIT;
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_effects_x ON effects (x);
CREATE INDEX CONCURRENTLY ix_effects_y ON effects (y);
BEGIN;
ALTER TABLE effects ADD COLUMN z int;
UPDATE alembic_version SET version_num='b' WHERE alembic_version.version_num = 'a';

COMMIT;
"""
    ((revision, statements, committed),) = policy.by_revision(sql)
    assert revision == "b" and len(statements) == 9 and len(committed) == 8
    found = [v.statement.split(" (")[0] for v in policy.rerun_problems(revision, committed)]
    assert found == [
        "CREATE TABLE effect_counts",
        "CREATE TRIGGER summed AFTER INSERT ON effects FOR EACH ROW EXECUTE FUNCTION g()",
        "CREATE INDEX CONCURRENTLY ix_effects_y ON effects",
    ]


def test_a_revision_without_an_autocommit_block_rolls_back_whole() -> None:
    sql = "BEGIN;\n-- Running upgrade a -> b\nCREATE TABLE t (n int);\nCOMMIT;\n"
    assert policy.by_revision(sql) == [("b", ["CREATE TABLE t (n int)"], [])]
