"""Serving the app under uvicorn until SIGTERM or SIGINT, then exiting cleanly."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

import uvicorn
from fastapi import FastAPI


def serve_until_stopped(app: FastAPI, host: str, port: int) -> None:
    # log_config=None keeps the JSON/text logging that the command line configured.
    config = uvicorn.Config(
        app, host=host, port=port, log_config=None, access_log=False, server_header=False
    )
    _CleanExitServer(config).run()


class _CleanExitServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown (exit status -15);
    the CLI contract is exit 0 after a clean shutdown, so the signal only asks to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        def stop(signum: int, frame: FrameType | None) -> None:
            if self.should_exit and signum == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for requests
            self.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
