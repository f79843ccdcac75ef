"""JSON logs: one object per line, with the structured fields a record carries in `extra["fields"]`."""

from __future__ import annotations

import logging
import sys
import time

import orjson


def timestamp(created: float) -> str:
    """UTC, millisecond precision: 2026-12-02T16:12:56.123Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created * 1000) % 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(level: str = "info") -> None:
    """Route every logger (ours, uvicorn's, aiohttp's) through one JSON handler on stdout."""
    # One access line per request is on the hot path: skip the caller lookup (a stack walk) and
    # the thread/process bookkeeping that no field here uses.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
