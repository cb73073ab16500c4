"""Finding at any age stays one index range however old the history (EXPLAIN on a
loaded, analysed table): a key's printed start, a recipient or a reference with no
window, a work state's list, its counts per endpoint, grouped reasons, many keys at
once, and the bulk resend's selection of a batch."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from spark_outbox.cli.tools.bulk import recipient_of, reference_of
from spark_outbox.console import lists, resend
from spark_outbox.console.filters import build_filter
from spark_outbox.core.sqlfile import queries_beside
from tests.api.test_audit_plans import (  # noqa: F401
    AUDIT,
    N,
    _indexes,
    _no_seq_scan_on_big_tables,
    _nodes,
    _plan,
    loaded,
)

LISTS = queries_beside(lists.__file__, "lists.sql")
RESEND = queries_beside(resend.__file__, "resend.sql")
DEAD = "ix_effects_dead_endpoint_updated_at"  # partial: the dead effects only


def _page(**filters: Any) -> dict[str, Any]:
    flt = build_filter(since=None, until=None, **filters)
    return flt.params() | {"limit": 101, "cursor_at": None, "cursor_id": None}


def test_a_key_prefix_is_a_range_of_the_unique_key_index_never_a_scan(
    loaded: Connection,  # noqa: F811
) -> None:
    key = loaded.execute(sa.text("SELECT idempotency_key FROM effects LIMIT 1")).scalar_one()
    plan = _plan(loaded, AUDIT["search_effects"], _page(key_prefix=key[:12] + "…"))
    assert _indexes(plan) == {"uq_effects_idempotency_key"}
    scan = next(n for n in _nodes(plan) if n.get("Index Name") == "uq_effects_idempotency_key")
    assert ">=" in scan["Index Cond"] and "<" in scan["Index Cond"]
    _no_seq_scan_on_big_tables(plan)
    many = {"prefixes": [key[:12], key], "ends": [key[:12] + "g", key + "g"]}
    lookup = _plan(loaded, LISTS["by_key_prefix"], many)
    assert "uq_effects_idempotency_key" in _indexes(lookup)
    _no_seq_scan_on_big_tables(lookup)


def test_narrow_searches_without_a_window_use_their_own_index(
    loaded: Connection,  # noqa: F811
) -> None:
    cases = {
        "ix_effects_recipient_created_at_id": {"recipient": recipient_of(7, N)},
        "ix_effects_reference_created_at_id": {"reference": reference_of(7)},
        "ix_effects_state_created_at_id": {"state": "dead"},
    }
    for index, filters in cases.items():
        params = _page(**filters)
        plan = _plan(loaded, AUDIT["search_effects"], params)
        assert _indexes(plan) == {index}, filters
        _no_seq_scan_on_big_tables(plan)
        count = _plan(loaded, LISTS["count_matching"], params | {"cap_plus_one": 10_001})
        assert _indexes(count) and _indexes(count) <= {index, DEAD}, filters
        _no_seq_scan_on_big_tables(count)


def test_a_states_counts_per_endpoint_and_its_grouped_reasons_read_bounded_ranges(
    loaded: Connection,  # noqa: F811
) -> None:
    for state in ("dead", "pending"):
        params = {"state": state, "since": None, "until": None, "cap_plus_one": 10_001}
        plan = _plan(loaded, LISTS["state_by_endpoint"], params)
        _no_seq_scan_on_big_tables(plan)
        limits = [n for n in _nodes(plan) if n["Node Type"] == "Limit"]
        assert limits, plan  # each endpoint's count stops at the cap
    reasons = {"state": "dead", "endpoint": None, "since": None, "until": None}
    plan = _plan(loaded, LISTS["errors_grouped"], reasons | {"scan_limit": 10_000, "groups": 20})
    # The state's own range: the state index, or the partial index of dead effects.
    assert _indexes(plan) <= {
        "ix_effects_state_created_at_id",
        "ix_effects_dead_endpoint_updated_at",
    }
    assert _indexes(plan)
    _no_seq_scan_on_big_tables(plan)


def test_a_bulk_resend_of_a_batch_counts_and_locks_through_the_batch_index(
    loaded: Connection,  # noqa: F811
) -> None:
    flt = build_filter(since=None, until=None, job="billing", batch_id="b-3")
    params = flt.params()
    params = {k: params[k] for k in resend._FILTER} | {
        "erased_note": "erased (",
        "scan_limit": 10_001,
        "cap_plus_one": 1001,
    }
    for name in ("count_resendable", "count_refused", "lock_resendable"):
        plan = _plan(loaded, RESEND[name], params)
        assert "ix_effects_job_batch_id_created_at_id" in _indexes(plan), name
        _no_seq_scan_on_big_tables(plan)
