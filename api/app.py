"""``create_app(settings)``: the status and delivery-audit API and the support page.

Nothing is built at import: the engine is created in the lifespan from the
settings the entry point passes in, and disposed of at shutdown.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from spark_outbox.api import errors
from spark_outbox.api.bodylimit import BodyLimit
from spark_outbox.api.metrics import ApiMetrics
from spark_outbox.api.routes import (
    admin,
    batches,
    docs,
    effects,
    operator,
    rejects,
    resend,
    status,
    ui,
    ui_audit,
    ui_lists,
    uncertain,
)
from spark_outbox.core import db, revisions
from spark_outbox.core.settings import Settings

HERE = Path(__file__).parent


def create_app(settings: Settings) -> FastAPI:
    """The app for ``settings.database_url`` (required: the caller picks the database)."""
    url = db.require_url(settings.database_url)
    metrics = ApiMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = db.create_engine(url, application_name="outbox-api")
        try:
            # This release's routes read columns an older schema lacks: refuse to start.
            revisions.require_usable(engine, "the API", unreachable_ok=True)
            app.state.engine = engine
            metrics.watch_queue(engine)
            yield
        finally:
            engine.dispose()

    app = FastAPI(
        title="spark-outbox",
        summary="Status, delivery audit and operator actions of the outbox",
        version="0.1.0",
        lifespan=lifespan,
        # Their pages load Swagger UI / ReDoc from a CDN: api/routes/docs.py serves /docs.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.add_middleware(BodyLimit)
    errors.install(app)
    for module in (
        status,
        effects,
        batches,
        rejects,
        operator,
        resend,
        uncertain,
        admin,
        ui,
        ui_lists,
        ui_audit,
        docs,
    ):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}}},
    )
    def prometheus_metrics() -> Response:
        """Prometheus text format; open, see api/metrics.py for why."""
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.middleware("http")
    async def count_requests_and_secure_ui(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        if request.url.path.startswith("/ui"):
            response.headers.update(ui.SECURITY_HEADERS)
        route = request.scope.get("route")
        template = getattr(route, "path", "unmatched")
        metrics.observe(request.method, template, response.status_code, started)
        return response

    return app
