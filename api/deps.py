"""Dependencies as ``Annotated`` aliases: routes declare what they need by type.

One unit of work per request: ``Conn`` is a connection inside a transaction
that commits when the route returns and rolls back when it raises. Dependencies
that do no I/O are ``async`` so they cost no thread-pool hop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Connection, Engine

from spark_outbox.console import tokens
from spark_outbox.core import db
from spark_outbox.core.settings import Settings


async def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_conn(engine: Annotated[Engine, Depends(get_engine)]) -> Iterator[Connection]:
    """The request's unit of work; a lost database becomes ``DatabaseUnavailable`` (503).

    Function-scoped (``Conn``): the transaction commits when the route returns, BEFORE
    the response is sent. With FastAPI's default (request) scope the exit code runs after
    the response has gone: a client was told 200 (or redirected to a page that then read
    the old state) before the change was committed, and a commit that failed was
    reported as done."""
    with db.translated(), engine.begin() as conn:
        yield conn


EngineDep = Annotated[Engine, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Conn = Annotated[Connection, Depends(get_conn, scope="function")]

_bearer = HTTPBearer(auto_error=False, description="a token from `outbox tokens create`")


def authenticated(
    conn: Conn,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> tokens.Token:
    """Any live token (support or operator): the read endpoints."""
    return tokens.authenticate(conn, credentials.credentials if credentials else None)


async def operator(token: Annotated[tokens.Token, Depends(authenticated)]) -> tokens.Token:
    """An operator token: the write endpoints."""
    return tokens.require_operator(token)


Reader = Annotated[tokens.Token, Depends(authenticated)]
Operator = Annotated[tokens.Token, Depends(operator)]


def masked_for(token: tokens.Token, settings: Settings) -> tuple[str, ...]:
    """The payload paths ``audit`` masks for this token: the sensitive fields for the
    support role (in payloads and in the receivers' text), none for operators."""
    return () if token.is_operator else settings.sensitive_fields
