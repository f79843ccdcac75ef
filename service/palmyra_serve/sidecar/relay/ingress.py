"""A request's head as the relay reads it: which headers go upstream, the key, the request id, the
body's announced length, and what a draining replica adds to every answer."""

from __future__ import annotations

import os
from typing import Any

# Not forwarded upstream: hop-by-hop headers (RFC 9110 section 7.6.1, plus the obsolete
# Proxy-Connection and those a Connection header lists, dropped per request), the ones the pool
# writes itself, and the client's key (either header). Upgrade never gets here: the front end
# refuses it.
DROP_REQUEST = frozenset(
    {
        b"connection",
        b"proxy-connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"authorization",
        b"x-api-key",
        b"x-request-id",
        b"expect",
    }
)
SAFE_ID_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


class Head:
    """The headers of one request, read in one pass."""

    __slots__ = ("api_key", "authorization", "content_length", "forward", "request_id")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.authorization: bytes | None = None
        self.api_key: bytes | None = None  # the Anthropic SDK's header: the same key
        self.content_length: bytes | None = None
        rid: bytes | None = None
        listed: list[bytes] | None = None
        fwd: list[tuple[bytes, bytes]] = []
        for name, value in headers:
            if name == b"authorization":
                self.authorization = value
            elif name == b"x-api-key":
                self.api_key = value
            elif name == b"x-request-id":
                rid = value
            elif name == b"content-length":
                self.content_length = value
            elif name == b"connection" or name == b"proxy-connection":
                listed = (listed or []) + [t.strip().lower() for t in value.split(b",")]
            if name not in DROP_REQUEST:
                fwd.append((name, value))
        if listed:  # headers a Connection header names are hop-by-hop too (RFC 9110 section 7.6.1)
            fwd = [(n, v) for n, v in fwd if n not in listed]
        self.forward = fwd
        self.request_id = request_id_from(rid)


def request_id_from(raw: bytes | None) -> str:
    """Accept the caller's X-Request-Id when it is short and plain; else mint one."""
    if raw and len(raw) <= 128 and all(c in SAFE_ID_CHARS for c in raw):
        return raw.decode()
    return os.urandom(16).hex()


def has_body(scope: dict, content_length: bytes | None) -> bool:
    if content_length is not None:
        return content_length.strip() not in (b"", b"0")
    return any(name == b"transfer-encoding" for name, _ in scope["headers"])


def closing_connection(send: Any) -> Any:
    """While draining, every response says `Connection: close` (uvicorn then closes the
    connection after it): a client on a kept-alive connection, which kube-proxy and most
    connection pools keep pinned to this pod, reconnects and is routed to a replica that stays."""

    async def send_closing(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message["headers"], (b"connection", b"close")]}
        await send(message)

    return send_closing
