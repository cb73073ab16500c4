"""The effects contract, checked on the executors, one Arrow record batch at a time.

Runs on Spark executors: nothing heavier than pyarrow and the dispatcher's
validation helpers (an import-linter contract keeps it so). Vectorised checks
clear the plain rows; only payloads are handled one by one (canonical JSON and
its hash, exactly as ``enqueue`` computes them). Rows the vectorised test does
not clear get the exact per-row check (``check_row``), so every reason is the
one ``enqueue`` would give. The driver hands over the registered endpoints and
their kinds (read once per batch): an unknown or archived endpoint is a reject,
and an effect on an e-mail endpoint must pass ``check_email_effect``.
"""

from __future__ import annotations

import binascii
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import orjson

from spark_outbox.core.errors import ArchivedEndpoint, InvalidEffect, UnknownEndpoint
from spark_outbox.core.validation import (
    MAX_ORDERING_KEY_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_RECIPIENT_CHARS,
    MAX_REFERENCE_CHARS,
    check_email_effect,
    check_endpoint_name,
    check_expires_at,
    check_key,
    check_optional_text,
    check_supersedes,
    payload_bytes,
)

# Columns of a checked batch's valid rows, in the order the write path COPYs them.
VALID_COLUMNS = (
    "idempotency_key",
    "endpoint",
    "recipient",
    "payload",
    "payload_sha256",
    "ordering_key",
    "reference",
    "supersedes",
    "not_before",
    "expires_at",
)
_TEXT_LIMITS = (
    ("recipient", MAX_RECIPIENT_CHARS),
    ("ordering_key", MAX_ORDERING_KEY_CHARS),
    ("reference", MAX_REFERENCE_CHARS),
)
_KEY_REGEX = r"^[0-9a-f]{64}$"
# ``FAST_PATH_SCREEN`` narrowed for the column: its third alternative, a fixed-point
# float below 1e-4, is a number token, and in orjson's compact output a number starts
# right after ':', ',' or '[' (with its sign). Money written as text ("10.0000"), which
# the wide screen sends to the exact path, keeps orjson's bytes; they are the canonical
# ones (a property test in tests/test_checks.py proves the screen still catches every
# payload whose orjson bytes differ). The other alternatives are the wide screen's.
COLUMN_SCREEN = r"\\u0000|[0-9]e[-+]|[:,\[]-?0\.0000"
_VISIBLE = r"[!-~]"
_NO_DIGEST = bytes(32)
# The kind the driver hands over for an archived endpoint (commit.sql, endpoint_kinds).
ARCHIVED = "archived"  # at least one printable ASCII character: str.strip() keeps it


def unknown_endpoint(name: str) -> str:
    return str(UnknownEndpoint(name))


def check_row(row: Mapping[str, Any], endpoints: Mapping[str, str]) -> tuple[str | None, bytes]:
    """(reason, canonical payload bytes); the reason is None for a valid row."""
    declared = row.get("reject_reason")
    if declared:
        return str(declared), b""
    try:
        check_supersedes(row.get("supersedes"), check_key(row.get("idempotency_key")))
        check_expires_at(row.get("expires_at"), row.get("not_before"))
        endpoint = check_endpoint_name(row.get("endpoint"))
        data = payload_bytes(row.get("payload"))
        for field, limit in _TEXT_LIMITS:
            check_optional_text(field, row.get(field), limit)
        for field in ("endpoint", "recipient", "ordering_key", "reference"):
            if "\x00" in (row.get(field) or ""):
                raise InvalidEffect(field, "contains a NUL character", "remove it")
        kind = endpoints.get(endpoint)
        if kind is None:
            return unknown_endpoint(endpoint), b""
        if kind == ARCHIVED:
            return str(ArchivedEndpoint(endpoint)), b""
        if kind == "email":
            check_email_effect(row.get("recipient"), json.loads(data))
    except InvalidEffect as exc:
        return str(exc), b""
    except ValueError as exc:  # e.g. a lone surrogate escape that UTF-8 cannot encode
        return _unencodable(exc), b""
    return None, data


def _payload_only(text: object) -> tuple[str | None, bytes]:
    """``check_row`` for a row the vectorised checks cleared: only its payload can fail."""
    try:
        return None, payload_bytes(text)
    except InvalidEffect as exc:
        return str(exc), b""
    except ValueError as exc:
        return _unencodable(exc), b""


def _unencodable(exc: ValueError) -> str:
    return f"payload: cannot be encoded as UTF-8 JSON ({exc}); fix the text"


def raw_json(row: Mapping[str, Any]) -> str:
    """The rejected row as JSON text that jsonb accepts (NUL characters replaced)."""
    clean = {k: _printable(v) for k, v in row.items() if k != "reject_reason"}
    return json.dumps(clean, ensure_ascii=False, default=str)


def _printable(value: Any) -> Any:
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


def checked_effects(batch: Any, endpoints: Mapping[str, str]) -> tuple[Any, Any]:
    """(valid rows, rejects) of one Arrow record batch, both Arrow tables.

    Valid rows carry ``VALID_COLUMNS`` (payload canonical, hash computed);
    rejects carry ``reason`` and ``raw_row`` (the row as JSON text). Only the
    payloads are handled row by row (orjson, then one digest, in one loop into
    one buffer); the rest is Arrow column operations. Rows the column checks
    do not clear get ``check_row``; cleared rows the screen flags get only the
    exact payload check (``payload_bytes``, enqueue's definition).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    column = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
    column.setdefault("supersedes", pa.nulls(batch.num_rows, pa.string()))
    for name in ("not_before", "expires_at"):
        column[name] = timestamp_column(column.get(name), batch.num_rows)
    cleared = pc.fill_null(_plain(column, endpoints), False)
    data, digests = _orjson_canonical(pc.if_else(cleared, column["payload"], None))
    screened = _screened_out(data)
    reasons: list[str] = []
    raw_rows: list[str] = []
    if screened:
        data, failed = _exact(column, cleared.to_pylist(), screened, endpoints, data, digests)
        reasons = [reason for reason, _ in failed]
        raw_rows = [raw for _, raw in failed]
    valid = {name: column[name] for name in VALID_COLUMNS if name in column}
    valid["payload"] = data.cast(pa.large_string())  # valid UTF-8: orjson wrote it
    valid["payload_sha256"] = _hex(digests, len(data))
    if reasons:
        mask = pc.is_valid(data)
        valid = {name: pc.filter(values, mask) for name, values in valid.items()}
    rejects = pa.table({"reason": pa.array(reasons, pa.string()), "raw_row": raw_rows})
    return pa.table({name: valid[name] for name in VALID_COLUMNS}), rejects


def _orjson_canonical(payloads: Any) -> tuple[Any, bytearray]:
    """orjson's sorted, compact bytes of each payload (``unscreened_canonical``) and
    their SHA-256 digests (32 zero bytes where null). The one loop over rows in
    Python: each row's bytes go into one buffer at once, which Arrow then takes
    without a copy; keeping 10,000 of orjson's bytes objects alive instead cost
    the executors ~3 us a row (bench/RESULTS.md, "sink CPU per row"). Null where the
    payload is null or not JSON (the exact path says why); a non-object gives
    bytes not starting with ``{``, which ``_screened_out`` catches."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    loads, dumps, sort_keys, sha256 = (
        orjson.loads,
        orjson.dumps,
        orjson.OPT_SORT_KEYS,
        hashlib.sha256,
    )
    body = bytearray()
    digests = bytearray()
    sizes: list[int | None] = []
    for text in payloads.cast(pa.large_binary()).to_pylist():
        try:
            data = dumps(loads(text), option=sort_keys)
        except (ValueError, TypeError):  # not JSON (or null): orjson's decode and encode errors
            sizes.append(None)
            digests += _NO_DIGEST
            continue
        body += data
        sizes.append(len(data))
        digests += sha256(data).digest()
    lengths = pa.array(sizes, pa.int64())
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(pc.fill_null(lengths, 0).to_numpy(), out=offsets[1:])
    validity = pc.is_valid(lengths).buffers()[1] if lengths.null_count else None
    data = pa.Array.from_buffers(
        pa.large_binary(), len(sizes), [validity, pa.py_buffer(offsets), pa.py_buffer(body)]
    )
    return data, digests


def _exact(
    column: Mapping[str, Any],
    cleared: list[bool],
    screened: list[int],
    endpoints: Mapping[str, str],
    data: Any,
    digests: bytearray,
) -> tuple[Any, list[tuple[str, str]]]:
    """The screened rows through the exact checks: their canonical bytes and digests
    replaced, null for a rejected row; (the new payloads, (reason, raw row) per reject)."""
    import pyarrow as pa

    canonical = data.to_pylist()
    failed: list[tuple[str, str]] = []
    for i in screened:
        if cleared[i]:  # only the payload can fail: no row dict unless it does
            reason, payload = _payload_only(column["payload"][i].as_py())
            row = None
        else:
            row = {name: values[i].as_py() for name, values in column.items()}
            reason, payload = check_row(row, endpoints)
        if reason is None:
            canonical[i] = payload
            digests[32 * i : 32 * i + 32] = hashlib.sha256(payload).digest()
        else:
            canonical[i] = None
            row = row or {name: values[i].as_py() for name, values in column.items()}
            failed.append((reason, raw_json(row)))
    return pa.array(canonical, pa.large_binary()), failed


def timestamp_column(values: Any, rows: int) -> Any:
    """A timestamp column as instants in UTC (all nulls when the batch has none), so
    its values are aware datetimes for ``check_row`` (a column without a time zone
    holds UTC: Spark's Arrow timestamps)."""
    import pyarrow as pa

    utc = pa.timestamp("us", tz="UTC")
    if values is None:
        return pa.nulls(rows, utc)
    return values.cast(utc)


def _hex(digests: bytearray, rows: int) -> Any:
    """``payload_sha256`` of each row as a string array: the digests in hex, converted
    for the whole column at once."""
    import pyarrow as pa

    hexed = binascii.hexlify(digests)
    return pa.Array.from_buffers(pa.binary(64), rows, [None, pa.py_buffer(hexed)]).cast(pa.string())


def _screened_out(data: Any) -> list[int]:
    """Rows the fast path did not clear (null), whose bytes are not a JSON object's,
    or whose bytes ``COLUMN_SCREEN`` (the screen ``payload_bytes`` applies, narrowed,
    here run by RE2 over the column) sends to the exact path; those rows get the
    exact check, and their bytes are replaced."""
    import pyarrow.compute as pc

    suspect = pc.or_kleene(
        pc.match_substring_regex(data, COLUMN_SCREEN),
        pc.greater(pc.binary_length(data), MAX_PAYLOAD_BYTES),
    )
    suspect = pc.or_kleene(suspect, pc.invert(pc.starts_with(data, "{")))
    rows: list[int] = pc.indices_nonzero(pc.fill_null(suspect, True)).to_pylist()
    return rows


def _plain(column: Mapping[str, Any], endpoints: Mapping[str, str]) -> Any:
    """True where a row surely passes every check but the payload's (webhook rows only)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    webhooks = pa.array(
        [name for name, kind in endpoints.items() if kind == "webhook"], pa.string()
    )
    plain = pc.and_kleene(
        pc.is_null(column["reject_reason"]),
        pc.match_substring_regex(column["idempotency_key"], _KEY_REGEX),
    )
    plain = pc.and_kleene(plain, pc.is_in(column["endpoint"], value_set=webhooks))
    plain = pc.and_kleene(plain, pc.is_null(column["supersedes"]))  # corrections: per row
    # A send-by time not after not_before: per row (check_expires_at says why).
    never = pc.fill_null(pc.less_equal(column["expires_at"], column["not_before"]), False)
    plain = pc.and_kleene(plain, pc.invert(never))
    plain = pc.and_kleene(plain, _clean_text(column["endpoint"], None, required=True))
    for field, limit in _TEXT_LIMITS:
        plain = pc.and_kleene(plain, _clean_text(column[field], limit))
    return plain


def _clean_text(values: Any, max_chars: int | None, *, required: bool = False) -> Any:
    """True where the text is surely fine (null allowed unless required), else false/null."""
    import pyarrow.compute as pc

    ok = pc.invert(pc.match_substring(values, "\x00"))
    if max_chars is not None:
        ok = pc.and_kleene(ok, pc.less_equal(pc.utf8_length(values), max_chars))
    if required:
        return pc.and_kleene(ok, pc.match_substring_regex(values, _VISIBLE))
    return pc.or_kleene(pc.is_null(values), ok)
