"""``/docs`` from the app's own files (offline), and ``/`` leads to the support page.

FastAPI's own ``/docs`` loads Swagger UI from a CDN, so it is blank without
internet; its ``/redoc`` too (both are turned off in ``create_app``). The
assets here are vendored from npm's ``swagger-ui-dist`` (api/static/swagger-ui,
with its licence), and the page starts them from a file, not an inline script.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse

router = APIRouter(include_in_schema=False)

ASSETS = "/static/swagger-ui"
# Only the app's own files: the page needs no other origin, inline styles are Swagger UI's.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PAGE = f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>spark-outbox API</title>
  <link rel="stylesheet" href="{ASSETS}/swagger-ui.css">
</head>
<body>
<div id="swagger-ui" data-openapi-url="/openapi.json"></div>
<script src="{ASSETS}/swagger-ui-bundle.js"></script>
<script src="/static/docs-init.js"></script>
</body>
</html>
"""


@router.get("/", response_class=RedirectResponse)
def root() -> RedirectResponse:
    """People who open the bare address want the support page."""
    return RedirectResponse("/ui", status_code=307)


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui() -> HTMLResponse:
    return HTMLResponse(PAGE, headers={"Content-Security-Policy": CSP})
