"""A bound on every request body: larger ones get 413 before the app reads them.

uvicorn and FastAPI read a JSON body whole, whatever its size, so one client's
request of a few GB once held the API's memory (and every other caller's answers)
hostage. The largest body any route takes is a bulk action's list of keys
(``MAX_LOOKUP`` of them, ~70 KB), so a mebibyte leaves room and refuses no real
request. A declared ``Content-Length`` is refused before a byte is read; a chunked
body is counted as it arrives and refused at the first byte past the bound.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 1 << 20
TOO_LARGE = (
    f"the request body is larger than {MAX_BODY_BYTES // 1024} KiB, the most any route "
    "takes; send fewer keys at a time"
)


class BodyLimit:
    """ASGI middleware: a body of more than ``max_bytes`` ends in 413."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        # (One that is no number is uvicorn's to refuse, with 400.)
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await JSONResponse({"detail": TOO_LARGE}, status_code=413)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # Raised where the app reads its body: FastAPI answers it as 413.
                    raise HTTPException(413, TOO_LARGE)
            return message

        await self.app(scope, counted, send)
