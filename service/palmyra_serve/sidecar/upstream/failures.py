"""Failures talking to the engine, and the one table that names each by its error code.

The relay's pool (upstream/pool.py) raises UpstreamError and its subclasses; the control-plane
calls (upstream/control.py, through aiohttp) raise aiohttp's errors, TimeoutError and OSError.
Either way the failure's code (code_of) is the label of palmyra_upstream_errors{kind}, and
errors.upstream() turns it into the error a client gets.
"""

from __future__ import annotations

import aiohttp

from palmyra_serve.sidecar.core.errors import ErrorCode


class UpstreamError(Exception):
    """A failure talking to the engine; its `code` is its row of _CODES. Raised as itself: the
    engine's answer could not be read (not HTTP, a head over the limits, closed with no answer)."""

    @property
    def code(self) -> ErrorCode:
        return code_of(self)


class ConnectFailed(UpstreamError):
    """Nothing was written: the engine cannot have seen the request."""


class UpstreamTimeout(UpstreamError):
    """No connection in time, or the engine silent past the read timeout."""


class StreamInterrupted(UpstreamError):
    """The engine closed the connection in the middle of a body."""


class PageTooLarge(UpstreamError):
    """A control-plane answer over its size cap (the engine's /metrics): a misbehaving engine."""


# The first row whose type the failure is an instance of names it, so the more specific come
# first: TimeoutError before aiohttp.ClientError (aiohttp's ServerTimeoutError is both) and
# before OSError (TimeoutError is one).
_CODES: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (ConnectFailed, ErrorCode.ENGINE_UNAVAILABLE),
    (UpstreamTimeout, ErrorCode.ENGINE_TIMEOUT),
    (StreamInterrupted, ErrorCode.STREAM_INTERRUPTED),
    (UpstreamError, ErrorCode.BAD_UPSTREAM),
    (TimeoutError, ErrorCode.ENGINE_TIMEOUT),
    (aiohttp.ClientResponseError, ErrorCode.BAD_UPSTREAM),  # an answer, but not one to use
    (aiohttp.ClientError, ErrorCode.ENGINE_UNAVAILABLE),
    (OSError, ErrorCode.ENGINE_UNAVAILABLE),
)

# What an `except` around a call to the engine catches: exactly the failures code_of names.
UPSTREAM_FAILURES: tuple[type[BaseException], ...] = tuple(kind for kind, _ in _CODES)


def code_of(exc: BaseException) -> ErrorCode:
    """The error code of a failure talking to the engine (one of UPSTREAM_FAILURES)."""
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    raise TypeError(f"not a failure talking to the engine: {exc!r}")
