"""Structured logs: one JSON object a line, facts in fields, never secrets.

Call ``configure`` from entry points only. Log with
``log.info("short message", extra={"event": "effect.delivered", "idempotency_key": k})``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys

from spark_outbox.core.outside import one_line

# Attributes every LogRecord has; anything else came in through ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
# Never let these reach a log line, whatever a caller passes.
_SECRET_FIELDS = {"password", "secret", "signing_secret", "token", "smtp_password", "authorization"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name in _STANDARD or name.startswith("_"):
                continue
            entry[name] = "[redacted]" if name.lower() in _SECRET_FIELDS else value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """One line per record (a traceback follows on lines of its own): line breaks in
    the message and in every field (an SMTP server's multi-line reply in ``error``)
    are escaped, so no text from outside can forge a line."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{k}={'[redacted]' if k.lower() in _SECRET_FIELDS else one_line(str(v))}"
            for k, v in vars(record).items()
            if k not in _STANDARD and not k.startswith("_")
        )
        base = f"{record.levelname.lower():7} {record.name}: {one_line(record.getMessage())}"
        text = f"{base}  {extras}" if extras else base
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if root.level > logging.DEBUG:
        # Alembic announces every plugin at INFO; only its warnings matter here.
        logging.getLogger("alembic").setLevel(logging.WARNING)
