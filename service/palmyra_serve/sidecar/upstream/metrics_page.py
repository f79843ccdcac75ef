"""/engine/metrics: the engine's own Prometheus page, served from a copy that is at most
MAX_AGE_S old, whatever the request rate.

Relaying the page per request made every request cost an engine render and up to two copies of
the page in the sidecar (40 concurrent GETs of a 15.6 MB page: 63 -> 887 MB of RSS). The page
needs no key (it is what Prometheus and the endpoint picker scrape, and the picker's
metrics-data-source cannot send one): its cost no longer depends on who asks, or how often. Here:
- One engine fetch at a time. A request finds the copy younger than MAX_AGE_S and is served it,
  or joins the fetch in flight (starting it if none is): at most one render per MAX_AGE_S, and
  the page a client gets is at most MAX_AGE_S plus one fetch old. The Inference Extension's
  endpoint picker scrapes every 200 ms and calls data older than 2 s stale
  (k8s/components/inference-gateway/picker-config.yaml): MAX_AGE_S is its interval.
- A failure (the engine down, slow, over the size cap) is kept as long as a page is: a dead
  engine costs one attempt per interval too.
- One format, fetched and served as is: Prometheus' text format, identity encoding. Prometheus
  and the picker both read it; OpenMetrics adds nothing vLLM uses (no exemplars), and gzip per
  request would be CPU per request again (a copy per encoding, memory). A client's Accept and
  Accept-Encoding are not forwarded.
- Memory: the copy being served, the one before it (responses still being written hold it),
  and the fetch in flight (read into the buffer that becomes the copy: no pieces to join), each
  at most MAX_PAGE_BYTES: memory_budget.py counts them (PAGE_COPIES). A response is written in
  slices copied from the page, so the client's write buffer never holds the page itself. No
  third copy lives on: while a response still writes the copy before, replaced less than
  READ_GRACE_S ago, the current copy is served a little longer (at most READ_GRACE_S plus a
  fetch old, under the picker's 2 s); past that, the next fetch cuts what still writes the copy
  before (a reader that slow is not a scraper: Prometheus and the picker read a page in
  milliseconds).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from starlette.responses import Response

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.disconnect import DISCONNECT_HOOK, DisconnectHook
from palmyra_serve.sidecar.upstream.control import EngineClient
from palmyra_serve.sidecar.upstream.failures import UPSTREAM_FAILURES, PageTooLarge, code_of

log = logging.getLogger("palmyra.sidecar")

MAX_AGE_S = 0.2
# How long a response writing the copy before the current one is waited for (see above).
READ_GRACE_S = 1.0
# Under Prometheus' default scrape timeout (10 s); a vLLM page is some hundred KiB.
FETCH_TIMEOUT_S = 5.0
MAX_PAGE_BYTES = 16 * 1024 * 1024
# Copies of the page alive at once (memory_budget.py): served, the one before it, and the fetch
# in flight, counted twice: its buffer grows by reallocation, and aiohttp holds what it read ahead.
PAGE_COPIES = 4
# What one response step copies from the page: uvicorn waits for the client's write buffer
# (64 KiB) to drain before each step, so a connection holds at most about two of these.
SLICE_BYTES = 64 * 1024
# Asked of the engine: the text format, not compressed.
ASKED = {"Accept": "text/plain; version=0.0.4", "Accept-Encoding": "identity"}


@dataclass(frozen=True)
class Fetched:
    """The engine's answer as read: status, type, encoding, bytes."""

    status: int
    content_type: str
    content_encoding: str | None
    body: bytes | bytearray  # never written to once read


@dataclass(eq=False)
class Page:
    """One answer of the engine (or the failure to get one), shared by every response served from it."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes | bytearray  # never written to once fetched
    fetched_at: float  # when its fetch started (monotonic): its age is counted from there
    writers: set[DisconnectHook] = field(default_factory=set)  # connections writing it now
    installed_at: float = 0.0  # when it became the current copy


class EngineMetricsCache:
    def __init__(
        self,
        fetch: Callable[[], Awaitable[Fetched]],
        retry_after_s: int,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self.retry_after_s = retry_after_s
        self.max_age_s = max_age_s
        self._clock = clock
        self._current: Page | None = None
        self._previous: Page | None = None
        self._inflight: asyncio.Future[Page] | None = None

    async def page(self) -> Page:
        """The copy if it is fresh enough; else the fetch in flight, shared (a caller that goes
        away does not cancel it for the others)."""
        current = self._current
        if current is not None and (self._fresh(current) or self._previous_still_read(current)):
            return current
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._refresh())
        return await asyncio.shield(self._inflight)

    def _fresh(self, current: Page) -> bool:
        return self._clock() - current.fetched_at < self.max_age_s

    def _previous_still_read(self, current: Page) -> bool:
        previous = self._previous
        return previous is not None and bool(previous.writers) and self._clock() - current.installed_at < READ_GRACE_S

    async def _refresh(self) -> Page:
        started = self._clock()
        try:
            page = await self._answer(started)
        finally:
            self._inflight = None
        self._install(page)
        return page

    async def _answer(self, started: float) -> Page:
        try:
            got = await self._fetch()
        except UPSTREAM_FAILURES as exc:
            return self._failure(exc, started)
        headers = [(b"content-type", got.content_type.encode("latin-1"))]
        if got.content_encoding:
            headers.append((b"content-encoding", got.content_encoding.encode("latin-1")))
        return Page(got.status, headers, got.body, started)

    def _failure(self, exc: BaseException, started: float) -> Page:
        code = code_of(exc)
        log.warning("engine metrics unavailable", extra={"fields": {"error": code, "detail": str(exc)[:300]}})
        # 503 for every failure here: to a scraper the page is simply not there right now.
        failure = errors.upstream(code, self.retry_after_s)
        headers = [(b"content-type", b"application/json"), (b"retry-after", str(self.retry_after_s).encode())]
        return Page(503, headers, failure.body(), started)

    def _install(self, page: Page) -> None:
        page.installed_at = self._clock()
        stale, self._previous, self._current = self._previous, self._current, page
        if stale is not None:
            for hook in list(stale.writers):
                hook.abort()  # a reader slower than the page changes: its copy is let go


# The engine's queue gauge as vLLM writes it, with or without labels (model_name, engine).
WAITING = re.compile(rb"^vllm:num_requests_waiting(?:\{[^}\n]*\})? ([^ \n]+)", re.MULTILINE)


def add_sidecar_queue(body: bytearray, queued: int) -> None:
    """Count the requests waiting in the sidecar's admission queue in the engine's own queue gauge,
    in place (no second copy of the page): the endpoint picker scores replicas on
    vllm:num_requests_waiting, and under adaptive admission a busy replica's queue is here, not in
    the engine. The first series is the one changed (one engine per pod)."""
    match = WAITING.search(body)
    if match is None:
        return
    try:
        value = float(match.group(1))
    except ValueError:
        return
    body[match.start(1) : match.end(1)] = repr(value + queued).encode()


def engine_fetch(
    engine: EngineClient, sidecar_queued: Callable[[], int] | None = None
) -> Callable[[], Awaitable[Fetched]]:
    """The engine's page, read into one buffer that becomes the copy served: no pieces to join;
    with `sidecar_queued`, the sidecar's queue added to the engine's (add_sidecar_queue)."""
    url = f"{engine.base_url}/metrics"
    headers = {**engine.headers, **ASKED}

    async def fetch() -> Fetched:
        async with asyncio.timeout(FETCH_TIMEOUT_S):
            async with engine.session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=None)) as resp:
                body = bytearray()
                async for chunk in resp.content.iter_any():
                    if len(body) + len(chunk) > MAX_PAGE_BYTES:
                        raise PageTooLarge(f"the engine's /metrics page exceeds {MAX_PAGE_BYTES} bytes")
                    body += chunk
                if sidecar_queued is not None and resp.status == 200 and (queued := sidecar_queued()) > 0:
                    add_sidecar_queue(body, queued)
                return Fetched(
                    resp.status,
                    resp.headers.get("Content-Type", "text/plain"),
                    resp.headers.get("Content-Encoding"),
                    body,
                )

    return fetch


class PageResponse(Response):
    """A response that writes a shared page in copied slices (see the module's docstring)."""

    def __init__(self, page: Page) -> None:  # not Response's: the body is never rendered or copied whole
        self.page = page
        self.status_code = page.status
        self.background = None

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        page = self.page
        body = page.body
        headers = [*page.headers, (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": page.status, "headers": headers})
        hook: DisconnectHook | None = scope.get(DISCONNECT_HOOK)
        if hook is not None:
            page.writers.add(hook)
        try:
            await _write_slices(send, body, hook)
        finally:
            if hook is not None:
                page.writers.discard(hook)


async def _write_slices(send: Any, body: bytes | bytearray, hook: DisconnectHook | None) -> None:
    view = memoryview(body)
    try:
        for start in range(0, max(len(view), 1), SLICE_BYTES):
            if hook is not None and hook.lost:
                return  # cut or gone: uvicorn closes the connection, nothing more to send
            end = start + SLICE_BYTES
            await send({"type": "http.response.body", "body": bytes(view[start:end]), "more_body": end < len(view)})
    finally:
        view.release()
