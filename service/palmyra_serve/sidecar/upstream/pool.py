"""The relay's own HTTP/1.1 client: a keep-alive pool of asyncio connections to the one engine,
with responses parsed by httptools (the C parser uvicorn itself uses).

Why not aiohttp on this path: in benchmarks/relay.py (workload A, 64 SSE chunks per request)
aiohttp spent about 45% of the sidecar's CPU per request, most of it in per-chunk bookkeeping
(one buffer entry, flow-control check and resume per HTTP chunk). Here every socket read is
parsed in C and whatever it yielded is handed to the relay as one piece, so a burst of events
the engine wrote back to back costs one wakeup and one write to the client. aiohttp stays for
the control-plane calls (upstream/control.py), where its convenience costs nothing that matters.

Deliberately narrow: one origin, HTTP/1.1, no redirects, cookies, proxies or decompression;
bodies are relayed as the engine sent them, de-chunked. Interim (1xx) responses are skipped,
bodies delimited by the connection's close are complete at the close, trailers are dropped, and
an engine whose response head is too large or has too many fields is a protocol error.

A request is never sent twice: once its bytes are written the engine may have acted on it (a
generation could run twice), whatever the connection does next. Reused connections are retired
well before the engine's keep-alive timeout instead (MAX_IDLE_S).
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from urllib.parse import urlsplit

import httptools

from palmyra_serve.sidecar.upstream.failures import ConnectFailed, StreamInterrupted, UpstreamError, UpstreamTimeout

# Above this much unread body the engine connection stops being read, so a slow client slows the
# engine's socket instead of growing the sidecar's memory. One read is at most READ_BYTES (the
# connection reads into its own buffer of that size), so a connection holds at most
# HIGH_WATER + READ_BYTES of body: memory_budget.py counts it per request.
HIGH_WATER = 64 * 1024
READ_BYTES = 64 * 1024
# The kernel's receive buffer of an engine connection, fixed instead of autotuned (Linux would
# grow it to megabytes for a reader that keeps up, and cgroup v2 charges it to this container).
# Linux doubles the value for its bookkeeping: RCVBUF_CHARGED is what it costs.
ENGINE_RCVBUF = 64 * 1024
RCVBUF_CHARGED = 2 * ENGINE_RCVBUF
# The engine's uvicorn closes idle keep-alive connections after 5 s (vLLM's default); reusing one
# near that edge races its close, and a request written into that race fails without a retry
# (see the module doc), so idle connections are retired a full second earlier.
MAX_IDLE_S = 4.0
# Bounds on the engine's response head (status line and fields, interim responses included):
# vLLM sends under 1 KiB in a handful of fields; far more is a misbehaving engine, not data to hold.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100


class _HeadTooLarge(Exception):
    """Raised inside a parser callback; becomes an UpstreamError."""


class _Connection(asyncio.BufferedProtocol):
    """One TCP connection to the engine and the response currently arriving on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        self.wait_since = 0.0
        self.opened_at = 0.0  # perf_counter when connected (a trace's `connect` event)
        self.silence_timer: asyncio.TimerHandle | None = None
        self.buffer = memoryview(bytearray(READ_BYTES))
        self.reset()

    def reset(self) -> None:
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.body: list[bytes] = []
        self.buffered = 0
        self.head_done = False
        self.interim = False
        self.close_delimited = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.buffer[:nbytes])  # the parser copies what it keeps (on_body)

    def data_received(self, data: bytes | memoryview) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
            if not self.head_done:
                # Counted per read, before the parser's callbacks see a field: a never-ending
                # field would otherwise grow inside the parser unseen.
                self.head_bytes += len(data)
                if self.head_bytes > MAX_HEAD_BYTES:
                    raise _HeadTooLarge(f"over {MAX_HEAD_BYTES} bytes")
        except (httptools.HttpParserError, _HeadTooLarge) as exc:
            cause = exc.__context__ if isinstance(exc.__context__, _HeadTooLarge) else exc
            self.error = UpstreamError(f"unreadable response from the engine: {cause}")
            self.closed = True
            self.transport.close()  # type: ignore[union-attr]
        if self.buffered > HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.close_delimited and self.head_done and not self.complete and self.error is None and exc is None:
            self.complete = True  # no length, not chunked: the body ends where the connection does
            self.keep_alive = False
        if not self.complete and self.error is None:
            if self.head_done:
                self.error = StreamInterrupted("the engine closed the connection mid-response")
            else:
                self.error = UpstreamError("the engine closed the connection without answering")
        self._wake()

    # httptools callbacks
    def on_message_begin(self) -> None:
        if not self.head_done:  # after an interim response: the final one starts afresh
            self.reason = b""
            self.headers = []

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # a chunked body's trailer: never relayed (the head is gone already), never kept
        headers = self.headers
        headers.append((name, value))
        if len(headers) > MAX_HEADERS:
            raise _HeadTooLarge(f"over {MAX_HEADERS} header fields")
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge(f"over {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            if status == 101:
                raise _HeadTooLarge("101 Switching Protocols: no upgrade was asked for")
            self.interim = True  # 100 Continue, 103 Early Hints...: not the answer, skipped
            return
        self.status = status
        self.head_done = True
        framed = False
        for name, value in self.headers:
            lname = name.lower()
            if lname == b"content-length" or (lname == b"transfer-encoding" and b"chunked" in value.lower()):
                framed = True
        self.close_delimited = not framed and status not in (204, 304)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        # Asked here, while the parser still holds this message's flags; once the next message
        # begins (even within the same read) it answers for that one.
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True

    # used by EngineResponse
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_silence(self, timeout_s: float) -> None:
        self.silence_timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # not waiting now: the next wait arms a new check
        quiet = self.loop.time() - self.wait_since
        if quiet >= timeout_s:
            waiter.set_exception(UpstreamTimeout("the engine was silent for longer than the read timeout"))
        else:
            self.silence_timer = self.loop.call_later(timeout_s - quiet, self._check_silence, timeout_s)

    async def wait(self, timeout_s: float) -> None:
        """Until the next read, the end of the response, an error, or timeout_s of silence."""
        self.waiter = self.loop.create_future()
        self.wait_since = self.loop.time()
        # One timer outlives many waits and re-arms for what is left of the current one, instead
        # of a timer armed and cancelled for every chunk a stream relays.
        if self.silence_timer is None:
            self.silence_timer = self.loop.call_later(timeout_s, self._check_silence, timeout_s)
        try:
            await self.waiter
        finally:
            self.waiter = None

    def take_body(self) -> bytes:
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        return data

    def abort(self) -> None:
        self.closed = True
        if self.silence_timer is not None:
            self.silence_timer.cancel()
            self.silence_timer = None
        if self.transport is not None:
            self.transport.close()


class EngineResponse:
    """Status and headers of an engine response; its body is read piece by piece as it arrives."""

    __slots__ = ("_conn", "_pool", "content_type", "raw_headers", "reason", "status")

    def __init__(self, conn: _Connection, pool: EnginePool) -> None:
        self._conn = conn
        self._pool = pool
        self.status = conn.status
        self.reason = conn.reason.decode("latin-1")
        self.raw_headers = conn.headers
        self.content_type = ""
        for name, value in conn.headers:
            if name.lower() == b"content-type":
                self.content_type = value.decode("latin-1").lower()

    async def read_some(self) -> bytes:
        """All body bytes that arrived since the last call, waiting for some; b"" at the end."""
        conn = self._conn
        while not conn.body:
            if conn.complete:
                return b""
            if conn.error is not None:
                raise conn.error
            await conn.wait(self._pool.read_timeout_s)
        return conn.take_body()

    @property
    def opened_at(self) -> float:
        """When its connection was opened (perf_counter)."""
        return self._conn.opened_at

    @property
    def finished(self) -> bool:
        """The whole body arrived and was read: what read_some returned last was its end."""
        conn = self._conn
        return conn.complete and not conn.body

    async def read(self) -> bytes:
        """The whole body. The relay streams with read_some(); benchmarks/ read error answers whole."""
        parts = []
        while chunk := await self.read_some():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Back to the pool when the response was read to its end on a reusable connection, and
        was not an error: vLLM 0.18's server (the Ascend image's) closes the connection right after
        some 4xx answers without saying so, and the next request written into that close came back
        unanswered (502) in the vllm018 tier. Errors are rare; a fresh connection for the request
        after one costs a connect on the loopback."""
        conn = self._conn
        reusable = conn.complete and conn.keep_alive and not conn.closed and conn.error is None and not conn.body
        if reusable and conn.status < 400:
            self._pool._put(conn)
        else:
            conn.abort()


class EnginePool:
    def __init__(self, engine_url: str, connect_timeout_s: float, read_timeout_s: float) -> None:
        parts = urlsplit(engine_url)
        tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if tls else 80)
        self.prefix = parts.path.rstrip("/").encode("latin-1")
        self.host_header = parts.netloc.encode("latin-1")
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._ssl = ssl.create_default_context() if tls else None
        self._idle: collections.deque[_Connection] = collections.deque()

    async def request(
        self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> EngineResponse:
        """Send one request and wait for the response head. `target` is the raw path plus query."""
        head = [method.encode("latin-1"), b" ", self.prefix, target, b" HTTP/1.1\r\nhost: ", self.host_header, b"\r\n"]
        if body or method in ("POST", "PUT", "PATCH"):
            head += [b"content-length: ", str(len(body)).encode(), b"\r\n"]
        for name, value in headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"\r\n")
        head_bytes = b"".join(head)
        head_only = method == "HEAD"
        conn = self._take() or await self._connect()
        conn.reset()
        # From here on the request may have reached the engine: it is never sent again, even when
        # a reused connection turns out closed with nothing answered (an error the client sees).
        # Head and body in one gathered write (uvloop sends the list with one writev), not one
        # joined message: a join would copy the body (up to max_body_bytes) and hold the copy
        # until the engine answers, the whole generation for a non-streamed one.
        if body:
            conn.transport.writelines((head_bytes, body))  # type: ignore[union-attr]
        else:
            conn.transport.write(head_bytes)  # type: ignore[union-attr]
        try:
            while not conn.head_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(self.read_timeout_s)
        except BaseException:
            conn.abort()
            raise
        if head_only:  # no body follows, whatever the headers say; the connection is not reused
            conn.complete = True
            conn.keep_alive = False
            conn.abort()
        return EngineResponse(conn, self)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(lambda: _Connection(loop), self.host, self.port, ssl=self._ssl)
        except TimeoutError:
            raise UpstreamTimeout(f"connecting to the engine took over {self.connect_timeout_s} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to the engine: {exc}") from None
        conn.opened_at = time.perf_counter()
        sock = conn.transport.get_extra_info("socket")  # type: ignore[union-attr]
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, ENGINE_RCVBUF)
        return conn

    def _take(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the least likely to be closing
            if not conn.closed and not conn.transport.is_closing() and now - conn.idle_since < MAX_IDLE_S:  # type: ignore[union-attr]
                return conn
            conn.abort()
        return None

    def _put(self, conn: _Connection) -> None:
        now = conn.idle_since = time.monotonic()
        idle = self._idle
        idle.append(conn)
        # Retire connections left unused at the bottom of the stack since traffic last peaked.
        while idle and (idle[0].closed or now - idle[0].idle_since >= MAX_IDLE_S):
            idle.popleft().abort()

    def close(self) -> None:
        while self._idle:
            self._idle.popleft().abort()
