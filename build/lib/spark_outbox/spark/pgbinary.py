"""PostgreSQL's binary COPY format, built from Arrow columns without a per-row loop.

Runs on Spark executors (pyarrow and numpy only). Binary COPY spares
PostgreSQL the CSV parse of every field (the payload's quotes above all), the
bottleneck's own CPU: docs/spark.md "Throughput" has the measurement. A row
is a 16-bit field count, then per field a 32-bit big-endian length (-1: NULL)
and the value's bytes: text as UTF-8, jsonb as the version byte 1 and the text,
uuid as its 16 bytes, timestamptz as 64-bit microseconds since 2000-01-01 UTC.
Fields are length-prefixed column by column and joined row-wise by Arrow
kernels; the stream is the joined rows' contiguous value buffer.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import uuid
from typing import Any

HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)  # signature, flags, no extension
TRAILER = struct.pack("!h", -1)
_NULL = struct.pack("!i", -1)
_JSONB_VERSION = b"\x01"
_POSTGRES_EPOCH_US = 946_684_800_000_000  # 2000-01-01 UTC in Unix microseconds


def text(value: str | None) -> bytes:
    """One text field (a value shared by every row, e.g. the run's job)."""
    if value is None:
        return _NULL
    data = value.encode("utf-8")
    return struct.pack("!i", len(data)) + data


def uuid_field(value: str) -> bytes:
    return struct.pack("!i", 16) + uuid.UUID(value).bytes


def text_column(values: Any) -> Any:
    """Each value as one length-prefixed text field (NULL as length -1)."""
    return _prefixed(values, b"")


def jsonb_column(values: Any) -> Any:
    """Each JSON text as one jsonb field (version byte, then the text)."""
    return _prefixed(values, _JSONB_VERSION)


def timestamptz_column(values: Any) -> Any:
    """Each timestamp as one timestamptz field (microseconds since 2000-01-01 UTC)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = _contiguous(values)
    micros = pc.fill_null(values.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()), 0)
    shifted = (micros.to_numpy(zero_copy_only=False) - _POSTGRES_EPOCH_US).astype(">i8")
    fields = _join(struct.pack("!i", 8), _fixed(shifted.tobytes(), 8, len(values)))
    return pc.if_else(pc.is_null(values), pa.scalar(_NULL, pa.large_binary()), fields)


@dataclasses.dataclass(frozen=True)
class CopyData:
    """A binary COPY stream's rows (an Arrow buffer); ``open()`` reads the whole
    stream, header and trailer included, as often as a COPY is (re)tried."""

    body: Any = b""

    def open(self) -> io.RawIOBase:
        return _Reader([HEADER, self.body, TRAILER])

    def __bytes__(self) -> bytes:
        return HEADER + memoryview(self.body).tobytes() + TRAILER


class _Reader(io.RawIOBase):
    """Reads the parts in turn, slice by slice: the rows are never copied whole."""

    def __init__(self, parts: list[Any]) -> None:
        super().__init__()
        self._parts = [memoryview(part) for part in parts]

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while self._parts and not self._parts[0].nbytes:
            self._parts.pop(0)
        if not self._parts:
            return 0
        n = min(len(target), self._parts[0].nbytes)
        target[:n] = self._parts[0][:n]
        self._parts[0] = self._parts[0][n:]
        return n


def copy_stream(rows: int, shared: bytes, columns: list[Any]) -> CopyData:
    """The whole COPY stream: each row is ``shared`` (the field count and the fields
    every row has in common) followed by its fields from ``columns``."""
    if not rows:
        return CopyData()
    joined = _join(shared, *columns)
    _, offsets, body = joined.buffers()  # int64 offsets: no size limit
    (start,) = struct.unpack_from("=q", offsets, 8 * joined.offset)
    (end,) = struct.unpack_from("=q", offsets, 8 * (joined.offset + len(joined)))
    return CopyData(body.slice(start, end - start))


def field_count(n: int) -> bytes:
    return struct.pack("!h", n)


def _prefixed(values: Any, prefix: bytes) -> Any:
    """Length-prefixed fields of ``prefix`` + each value; a NULL value gives length -1."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = _contiguous(values).cast(pa.large_binary())
    if prefix:
        values = _join(prefix, values)
    lengths = pc.fill_null(pc.binary_length(values), -1)
    big_endian = lengths.to_numpy(zero_copy_only=False).astype(">i4").tobytes()
    return _join(_fixed(big_endian, 4, len(values)), pc.fill_null(values, _scalar(b"")))


def _join(*parts: Any) -> Any:
    """Row-wise concatenation of arrays (bytes: the same for every row)."""
    import pyarrow.compute as pc

    items = [_scalar(p) if isinstance(p, bytes) else p for p in parts]
    return pc.binary_join_element_wise(*items, _scalar(b""))


def _scalar(data: bytes) -> Any:
    import pyarrow as pa

    return pa.scalar(data, pa.large_binary())


def _contiguous(values: Any) -> Any:
    import pyarrow as pa

    if not isinstance(values, pa.ChunkedArray):
        return values
    return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()


def _fixed(data: bytes, width: int, n: int) -> Any:
    """``n`` items of ``width`` bytes each, as a binary array (no copy per item)."""
    import pyarrow as pa

    items = pa.Array.from_buffers(pa.binary(width), n, [None, pa.py_buffer(data)])
    return items.cast(pa.large_binary())
