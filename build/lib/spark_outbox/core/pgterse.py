"""Terse PostgreSQL error messages: no statement text, no DETAIL, no CONTEXT.

psycopg2 binds parameters on the client, so the server sees the values inline,
and libpq's default message quotes the statement around an error position
(``LINE 1: ... 'whsec_...' ...``) and carries the server's DETAIL (``Failing row
contains (..., whsec_..., ...)``) and CONTEXT (a COPY's row). SQLAlchemy's
``hide_parameters`` hides only its own listing of the parameters. With libpq's
terse verbosity the message is the primary text alone; the other fields stay
readable in ``exc.diag`` for code that needs them.

psycopg2 has no call for ``PQsetErrorVerbosity``; the function is looked up
through psycopg2's own extension module, so it is the libpq that psycopg2 uses
(the wheel bundles its own). Only psycopg2 and ctypes here: Spark executors
import this module.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import psycopg2._psycopg

_PQERRORS_TERSE = 0


@functools.cache
def _set_error_verbosity() -> Any:
    # dlsym on the extension's handle also searches its dependencies: its libpq.
    function = ctypes.CDLL(psycopg2._psycopg.__file__).PQsetErrorVerbosity
    function.argtypes = [ctypes.c_void_p, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def make_terse(conn: Any) -> None:
    """Make a psycopg2 connection's error messages terse (no values in them)."""
    _set_error_verbosity()(conn.pgconn_ptr, _PQERRORS_TERSE)
