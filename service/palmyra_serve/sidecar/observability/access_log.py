"""The access log: one JSON line per request, in the same shape as every other log line.

Written without the logging module's per-record machinery (record object, handler lock, a flush
per line), which cost about 7% of the sidecar's CPU per relayed request in benchmarks/relay.py.
Lines are buffered and flushed together at most FLUSH_S after the first one, when the buffer
grows large, and at shutdown, the way nginx's `access_log ... buffer= flush=` does.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import IO

import orjson

from palmyra_serve.logs import timestamp

FLUSH_S = 0.05
FLUSH_BYTES = 64 * 1024
LOGGER_NAME = "palmyra.access"


class AccessLog:
    def __init__(self, stream: IO[str] | None = None) -> None:
        # Same switch as every other logger: PALMYRA_LOG_LEVEL above info silences it.
        self.enabled = logging.getLogger(LOGGER_NAME).isEnabledFor(logging.INFO)
        self._stream = stream
        self._buffer = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        self._ts_second = -1
        self._ts_prefix = ""

    def write(self, now: float, fields: dict) -> None:
        if not self.enabled:
            return
        second = int(now)
        if second != self._ts_second:  # strftime once per second, not once per request
            self._ts_second = second
            self._ts_prefix = timestamp(second)[:-5]
        entry = {
            "ts": f"{self._ts_prefix}.{int(now * 1000) % 1000:03d}Z",
            "level": "info",
            "logger": LOGGER_NAME,
            "msg": "request",
            **fields,
        }
        self._buffer += orjson.dumps(entry, default=str)
        self._buffer += b"\n"
        if len(self._buffer) >= FLUSH_BYTES:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._buffer:
            return
        data = bytes(self._buffer)
        self._buffer.clear()
        stream = self._stream or sys.stdout
        raw = getattr(stream, "buffer", None)
        if raw is not None:
            stream.flush()  # keep order with lines the logging handler already wrote
            raw.write(data)
            raw.flush()
        else:
            stream.write(data.decode())
            stream.flush()
