"""The HTTP front end: uvicorn's httptools protocol with bounds on what one connection may cost.

uvicorn (0.55) with httptools bounds none of these, and each was an attack on the sidecar:
- Request head size: httptools joins a header's pieces as they arrive, so a 200 MiB header took
  the process from 62 to 463 MB and 48 s of CPU. Here the bytes of a request head are counted
  before they reach the parser; past max_header_bytes (or max_header_count fields, or a request
  line over max_request_line_bytes) the client gets 431 (414) at once and the parser never
  sees the rest.
- Chunk framing and trailers: httptools joins a trailer field's pieces as they arrive too, and
  chunk-size lines and extensions are bytes that are not body data. Past the head, the bytes
  fed to the parser are counted: whatever is not body data, beyond CHUNK_LINE_ALLOWANCE per chunk,
  counts against max_header_bytes (431 beyond), and trailer fields against max_header_count;
  trailer fields are then dropped (RFC 9110 6.5.1 lets a recipient discard them; nothing here
  reads them). A 101 MiB trailer was relayed after 8.5 s of CPU and 200 MB of RSS.
- Head time: a client sending a header line every 5 s held its connection forever. The head must
  arrive within header_timeout_s of the connection opening (or of its first byte, for the next
  request on a kept-alive connection).
- Connections: at max_connections a new connection takes the place of an idle one (between
  requests; a connection in the middle of a request is never touched): first the one idle the
  longest among those that never carried an authenticated request, then among the others (a
  client reconnects; a gateway's idle pooled connection is as cheap to close). With none idle,
  it gets a canned 503 and is closed at once, before any parsing. Counting who asks, not where
  from, works both for clients that connect directly and behind a gateway whose connections all
  come from one address. Past CLOSE_ANONYMOUS_AT of the cap, a request on a connection that
  never authenticated is answered with `Connection: close` (unless that very request
  authenticates), and an unauthenticated response must be written within write_timeout_s of
  its first stall, so anonymous peers hold nothing past their answer. Connections to the probe
  port (settings.probe_port, which serves only the probes and /metrics: app.py) are not counted there but
  against their own PROBE_MAX_CONNECTIONS, so clients holding every client connection cannot
  fail the kubelet's probes (and get the pod restarted).
- A client that goes away: the relay hears it from connection_lost (DisconnectHook), not from a
  task per request parked in receive().
- A client that stops reading: with the kernel's unsent queue kept small (TCP_NOTSENT_LOWAT),
  the transport calls pause_writing() soon after its client stops reading; if resume_writing()
  does not follow within write_timeout_s, the transport is aborted. uvicorn then reports the
  disconnect to the app, whose watcher cancels the relay, which closes the engine connection,
  which makes vLLM abort the generation. Nothing runs per chunk: one timer per pause.
- Upgrade: refused with 400 (see errors.upgrade_refused); this service speaks HTTP/1.1 only, and
  llhttp stops parsing at an upgrade, which would leave a body unframed.
After a refusal, or a response sent before the request's body was read (401, 404, 413, ...), the
connection is closed "lingering", as nginx does: no more parsing, the rest of the input is read
and dropped for up to LINGER_S so the client sees the response rather than a reset.
"""

# Longer than 400 lines: one uvicorn protocol subclass; its overrides share the connection's state
# and are read together.

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import OrderedDict
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.disconnect import DISCONNECT_HOOK, DisconnectHook
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.core.routes import OTHER

LINGER_S = 2.0
# The kubelet opens one connection per probe and closes it; two containers' probes plus Compose's
# healthcheck need a handful, and each Prometheus scraping /metrics here keeps one open (an HA pair,
# two). Beyond this, a probe connection is refused like any other.
PROBE_MAX_CONNECTIONS = 16
NOTSENT_LOWAT = 16 * 1024
# A chunk-size line in hex (up to 16 digits), its CRLF and the CRLF after the data: framing that
# costs nothing extra. Beyond it (extensions, padding, trailers) a body's framing is counted.
CHUNK_LINE_ALLOWANCE = 32
# The share of max_connections past which anonymous requests do not keep their connection.
CLOSE_ANONYMOUS_AT = 0.75
TCP_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", 25)  # Linux's number


def raw_response(exc: errors.ApiError) -> bytes:
    """A complete HTTP/1.1 response for an error the protocol itself answers (no ASGI cycle)."""
    body = exc.body()
    head = [
        STATUS_LINE[exc.status],
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
    ]
    if exc.retry_after is not None:
        head.append(b"retry-after: %d\r\n" % exc.retry_after)
    return b"".join(head) + b"\r\n" + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """Configured by bounded_protocol(); the limits are class attributes, shared by every connection."""

    settings: Settings
    metrics: SidecarMetrics | None = None
    max_connections: int
    probe_port: int
    probe_connections: int = 0  # open on the probe port; per protocol class (one per server)
    reclaiming: int = 0  # closed to make room but not yet gone
    # Client-port connections between requests, idle the longest first; per protocol class.
    idle_anonymous: OrderedDict[BoundedHttpToolsProtocol, None]
    idle_authenticated: OrderedDict[BoundedHttpToolsProtocol, None]
    close_anonymous_at: int
    max_head: int
    max_line: int
    max_fields: int
    header_timeout_s: float
    write_timeout_s: float
    busy: bytes
    head_too_large: errors.ApiError
    framing_too_large: errors.ApiError
    line_too_long: errors.ApiError
    upgrade: errors.ApiError
    header_timeout: errors.ApiError
    write_timeout: errors.ApiError

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # between requests counts as the head of the next one
        self._head_bytes = 0
        self._url_bytes = 0
        self._fields = 0
        self._message_done = True
        self._refusal: errors.ApiError | None = None
        self._discarding = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._probe = False
        self._disconnect_hook = DisconnectHook(self._abort)
        # Past the head: what of the bytes fed is not body data, beyond CHUNK_LINE_ALLOWANCE a chunk.
        self._framing = 0
        self._body_seen = 0
        self._chunks = 0
        self._messages = 0
        self._reading_body = False  # a request's head was passed on and its body is still coming
        self._reclaimed = False

    # --- connection ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        cls = type(self)
        self._probe = bool(self.probe_port) and _transport_port(transport) == self.probe_port
        if self._probe:
            full = cls.probe_connections >= PROBE_MAX_CONNECTIONS
        else:
            full = self._open_here() >= self.max_connections and not self._reclaim_one()
        if full:
            # Refused before anything is parsed or allocated: one write, one close.
            self.transport = transport
            self._discarding = True
            self._count(errors.too_many_connections(0))
            transport.write(self.busy)
            transport.close()
            self._probe = False  # never counted
            return
        if self._probe:
            cls.probe_connections += 1
        super().connection_made(transport)
        self._set_idle()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Keep at most NOTSENT_LOWAT bytes queued-but-unsent in the kernel. Linux otherwise
            # grows the send buffer to 4 MiB, which a slow token stream to a client that stopped
            # reading would take minutes to fill before pause_writing() (and the write timeout)
            # ever fired. Throughput is unaffected: data in flight is not counted.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, NOTSENT_LOWAT)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._write_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._write_timer = self._linger_timer = None
        if self._probe:
            self._probe = False
            type(self).probe_connections -= 1
        self._forget()
        if self._reclaimed:
            self._reclaimed = False
            type(self).reclaiming -= 1
        super().connection_lost(exc)
        hook = self._disconnect_hook
        hook.lost = True
        if hook.on_disconnect is not None:
            hook.on_disconnect()

    # --- input -------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._discarding:
            # Fed in pieces that fit what is left of the limit: a head, or a body's framing, never
            # reaches the parser beyond it (the parser joins a field's pieces as they come).
            head = self._in_head
            room = self.max_head - (self._head_bytes if head else self._framing)
            if room <= 0:
                self._refuse(self._refusal or (self.head_too_large if head else self.framing_too_large))
                return
            piece, view = view[:room], view[room:]
            if head:
                self._head_bytes += len(piece)
                self._feed(piece)
            else:
                self._feed_body(piece)
            if self.transport.is_closing():
                return

    def _feed_body(self, piece: memoryview) -> None:
        """A piece read past the head: what of it is not body data (chunk-size lines, extensions,
        trailer fields) counts against the limit, less CHUNK_LINE_ALLOWANCE per chunk; allowance
        left over is not banked (as Go's net/http counts a chunked body's overhead)."""
        body, chunks, messages = self._body_seen, self._chunks, self._messages
        self._feed(piece)
        if self._messages != messages:
            return  # the message ended in this piece: the next one's count starts from its head
        overhead = len(piece) - (self._body_seen - body) - CHUNK_LINE_ALLOWANCE * (self._chunks - chunks)
        self._framing = max(0, self._framing + overhead)

    def _feed(self, data: bytes | memoryview) -> None:
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # on_headers_complete already flagged the refusal
        except httptools.HttpParserError:
            if self._refusal is None:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
                return
        if self._refusal is not None and not self._discarding:
            self._refuse(self._refusal)

    # --- parser callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._message_done = False
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        if self._url_bytes > self.max_line:
            self._refusal = self._refusal or self.line_too_long
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        if not self._in_head:
            # A trailer field of a chunked body: counted like a header field, then dropped
            # (uvicorn would append it to the scope's headers, after the app has read them).
            if self._fields > self.max_fields:
                self._refusal = self._refusal or self.framing_too_large
            return
        if self._fields > self.max_fields:
            self._refusal = self._refusal or self.head_too_large
            return
        super().on_header(name, value)
        if self.headers[-1][0] == b"upgrade":
            self._refusal = self._refusal or self.upgrade

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = self._url_bytes = self._fields = 0
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._refusal is not None:
            return  # no request is started; _feed answers once the parser returns
        self._framing = 0
        self._forget()  # a request in progress: never closed to make room
        hook = self._disconnect_hook
        self.scope[DISCONNECT_HOOK] = hook  # type: ignore[literal-required]
        super().on_headers_complete()
        self._reading_body = True
        cycle = self.cycle
        if not hook.authenticated and cycle.keep_alive and self._open_here() >= self.close_anonymous_at:
            # Near the cap an anonymous request does not keep its connection (mark_authenticated
            # gives it back if this request passes the key check).
            cycle.keep_alive = False
            hook._reopen = cycle
        else:
            hook._reopen = None

    def on_body(self, body: bytes) -> None:
        self._body_seen += len(body)
        super().on_body(body)

    def on_chunk_header(self) -> None:
        self._chunks += 1

    def on_message_complete(self) -> None:
        if self._refusal is not None and not self._in_head:
            # Its head or its trailers went over the limits: _feed refuses it once the parser
            # returns, and the app (if one reads it) never sees the body end.
            return
        self._in_head = True
        self._message_done = True
        self._reading_body = False
        self._messages += 1
        self._fields = 0  # trailer fields counted against this message, not the next head
        self._framing = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if not self._message_done and not self.transport.is_closing():
            # Answered before the body arrived (401, 404, 413, ...): do not parse a body nobody
            # will read, and do not reset the connection under the client's response either.
            self._linger()
            return
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._set_idle()

    # --- output ------------------------------------------------------------------------------
    def pause_writing(self) -> None:
        self._disconnect_hook.write_pauses += 1
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout_s, self._on_write_timeout)

    def resume_writing(self) -> None:
        if self._write_timer is not None and (self._disconnect_hook.authenticated or not self._responding()):
            # An anonymous response keeps the deadline of its first stall to its end: reading
            # a little now and then does not let an unauthenticated peer hold the connection.
            self._write_timer.cancel()
            self._write_timer = None
        super().resume_writing()

    def _responding(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    # --- refusals and timers -----------------------------------------------------------------
    def _refuse(self, exc: errors.ApiError) -> None:
        if self._reading_body and not self.cycle.response_started:
            self._refuse_body(exc)
            return
        self._count(exc)
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head went wrong while the previous response is still being sent: let
            # that response finish, then close; read nothing more.
            self._discarding = True
            self.cycle.keep_alive = False
            return
        self.transport.write(raw_response(exc))
        self._linger()

    def _refuse_body(self, exc: errors.ApiError) -> None:
        """The body being read went wrong (its framing): the app still reading it hears a
        disconnect, and whatever it sends is dropped; it counts the request itself (499), this
        counts why. The refusal is written now, unless the response before it is still going out:
        then this request never runs, and the connection ends after that response."""
        if self.metrics is not None:
            self.metrics.rejections.labels(exc.code).inc()
        cycle = self.cycle
        cycle.disconnected = True
        cycle.message_event.set()
        self._reading_body = False
        queued = [entry for entry in self.pipeline if entry[0] is cycle]
        if queued:
            self.pipeline.remove(queued[0])
            self._discarding = True  # on_response_complete lingers: this message never ended
            self._forget()
            return
        self.transport.write(raw_response(exc))
        self._linger()

    def _linger(self) -> None:
        self._discarding = True
        self._forget()
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()  # after what is buffered: the client sees the response, then EOF
        self._linger_timer = self.loop.call_later(LINGER_S, self.transport.close)

    def _on_header_timeout(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        if self._head_bytes:
            self._count(self.header_timeout)
            if self.cycle is None or self.cycle.response_complete:
                self.transport.write(raw_response(self.header_timeout))
        self._discarding = True
        self.transport.close()

    def _on_write_timeout(self) -> None:
        self._write_timer = None
        if self.metrics is not None:  # the relay counts the request itself (499); this counts why
            self.metrics.rejections.labels(self.write_timeout.code).inc()
        self.transport.abort()  # connection_lost: the app sees a disconnect and cancels the relay

    # --- the connection cap ---------------------------------------------------------------------
    def _open_here(self) -> int:
        """Open client-port connections, less those already closing to make room."""
        cls = type(self)
        return len(self.connections) - cls.probe_connections - cls.reclaiming

    def _set_idle(self) -> None:
        """Between requests: may be closed to make room, the longest idle first."""
        if self._probe or self._reclaimed:
            return
        cls = type(self)
        idle = cls.idle_authenticated if self._disconnect_hook.authenticated else cls.idle_anonymous
        idle[self] = None
        idle.move_to_end(self)

    def _forget(self) -> None:
        cls = type(self)
        cls.idle_anonymous.pop(self, None)
        cls.idle_authenticated.pop(self, None)

    def _reclaim_one(self) -> bool:
        """Close the connection idle the longest, anonymous ones first, to make room for this one."""
        cls = type(self)
        for kind, idle in (("anonymous", cls.idle_anonymous), ("authenticated", cls.idle_authenticated)):
            if idle:
                victim, _ = idle.popitem(last=False)
                victim._reclaim()
                if self.metrics is not None:
                    self.metrics.connections_reclaimed.labels(kind).inc()
                return True
        return False

    def _reclaim(self) -> None:
        type(self).reclaiming += 1
        self._reclaimed = True
        self._discarding = True
        transport = self.transport
        if transport.get_write_buffer_size():
            transport.abort()  # an answer nobody reads would keep it open: no room is made
            return
        if self._head_bytes:
            transport.write(self.busy)  # a head on its way: the client is told why, not reset
        transport.close()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _count(self, exc: errors.ApiError) -> None:
        if self.metrics is not None:
            self.metrics.rejections.labels(exc.code).inc()
            self.metrics.count_request(OTHER, exc.status)


def _transport_port(transport: asyncio.Transport) -> int | None:
    sockname = transport.get_extra_info("sockname")
    return sockname[1] if isinstance(sockname, tuple) and len(sockname) >= 2 else None


def bounded_protocol(settings: Settings, metrics: SidecarMetrics | None) -> type[BoundedHttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, with these settings' limits."""
    attrs: dict[str, Any] = {
        "settings": settings,
        "metrics": metrics,
        "max_connections": settings.max_connections,
        "close_anonymous_at": max(1, int(settings.max_connections * CLOSE_ANONYMOUS_AT)),
        "idle_anonymous": OrderedDict(),
        "idle_authenticated": OrderedDict(),
        "probe_port": settings.probe_port,
        "max_head": settings.max_header_bytes,
        "max_line": settings.max_request_line_bytes,
        "max_fields": settings.max_header_count,
        "header_timeout_s": settings.header_timeout_s,
        "write_timeout_s": settings.write_timeout_s,
        "busy": raw_response(errors.too_many_connections(settings.retry_after_s)),
        "head_too_large": errors.header_too_large(settings.max_header_bytes),
        "framing_too_large": errors.chunk_framing_too_large(settings.max_header_bytes),
        "line_too_long": errors.request_line_too_long(settings.max_request_line_bytes),
        "upgrade": errors.upgrade_refused(),
        "header_timeout": errors.header_timeout(settings.header_timeout_s),
        "write_timeout": errors.write_timeout(settings.write_timeout_s),
    }
    return type("PalmyraHttpProtocol", (BoundedHttpToolsProtocol,), attrs)
