"""The engine's answer relayed: the request sent upstream, then the status, headers and every chunk
as it arrives (never buffered), accounted as it passes (the API's stream account or body usage),
and a failure talking to the engine mapped to the client's error once."""

from __future__ import annotations

import logging
import time

from palmyra_serve.sidecar.admission.control import AdmissionControl
from palmyra_serve.sidecar.core import engine_errors, errors
from palmyra_serve.sidecar.core.disconnect import DisconnectHook
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.core.routes import RELAYED
from palmyra_serve.sidecar.lifecycle.health import HealthState
from palmyra_serve.sidecar.relay.apis import BY_API
from palmyra_serve.sidecar.relay.apis.base import BodyUsage
from palmyra_serve.sidecar.relay.context import RequestContext
from palmyra_serve.sidecar.relay.sse import SseAccount
from palmyra_serve.sidecar.relay.usage_event import UsageEventFilter
from palmyra_serve.sidecar.relay.watch import Pacing
from palmyra_serve.sidecar.upstream.failures import UpstreamError
from palmyra_serve.sidecar.upstream.pool import EnginePool, EngineResponse

log = logging.getLogger("palmyra.sidecar")

# The engine's response headers a client gets: only what describes the body. Everything else
# (hop-by-hop fields, the engine server's own date and server, set-cookie, CORS grants such as
# access-control-allow-origin: *, internal x- fields) stays inside the pod; the request id is ours.
RELAYED_RESPONSE = frozenset(
    {b"content-type", b"content-length", b"content-encoding", b"cache-control", b"retry-after"}
)
# What /ready's relay_failure says when a stream carried the engine's own error event.
ENGINE_ERROR_EVENT = "engine_error_event"
# How much of an engine's 5xx body the sidecar's log keeps (the client gets none of it).
ENGINE_ERROR_LOGGED = 4096


class Pump:
    def __init__(
        self,
        pool: EnginePool,
        engine_key: str | None,
        retry_after_s: int,
        metrics: SidecarMetrics,
        health: HealthState,
        admission: AdmissionControl,
    ) -> None:
        self.pool = pool
        self.engine_auth = f"Bearer {engine_key}".encode() if engine_key else None
        self.retry_after_s = retry_after_s
        self.metrics = metrics
        self.health = health
        self.admission = admission

    async def relay(self, ctx: RequestContext, hook: DisconnectHook) -> int:
        """Send the request upstream and relay the answer; its status."""
        scope, record, fwd = ctx.scope, ctx.record, ctx.fwd
        fwd.append((b"x-request-id", ctx.rid.encode()))
        if self.engine_auth:
            fwd.append((b"authorization", self.engine_auth))
        target = RELAYED[scope["path"]].target  # the allow-list's canonical path, never the client's raw one
        if qs := scope.get("query_string"):
            target += b"?" + qs
        pacing = Pacing(hook)
        record.sent_at = time.perf_counter()
        if record.trace is not None:
            # The engine's spans continue the sidecar's trace, not whatever the client sent.
            fwd = [(n, v) for n, v in fwd if n != b"traceparent"]
            fwd.append((b"traceparent", record.trace.engine_traceparent(scope["method"], target, record.sent_at)))
        # A failed open leaves engine_done_at unset: its span then ends with the request's.
        try:
            resp = await self.pool.request(scope["method"], target, fwd, ctx.body)
        except UpstreamError as exc:
            raise self.upstream_failed(exc, ctx) from None
        try:
            if record.trace is not None:
                record.engine_status = resp.status
                if resp.opened_at >= record.sent_at:  # a connection opened for this request
                    record.connected_at = resp.opened_at
            if resp.status >= 400:
                return await self._relay_error(ctx, resp)
            return await self._stream(ctx, resp, pacing)
        finally:
            resp.release()  # closes the connection unless the response was read to its end
            if record.trace is not None:
                record.engine_done_at = time.perf_counter()

    def upstream_failed(self, exc: UpstreamError, ctx: RequestContext) -> errors.ApiError:
        """Count, log and map a failure talking to the engine; tell readiness unless it was only slow."""
        code = exc.code
        self.metrics.upstream_error(code)
        ctx.record.upstream_error = code
        ctx.record.upstream_detail = str(exc)
        if code != errors.ErrorCode.ENGINE_TIMEOUT:
            self.health.report_engine_failure(code)
        return errors.upstream(code, self.retry_after_s)

    async def _relay_error(self, ctx: RequestContext, resp: EngineResponse) -> int:
        """An engine error reaches the client rebuilt in its API's shape, status kept
        (core/engine_errors.py: a 5xx's text only in the log, under the request id)."""
        parts: list[bytes] = []
        size = 0
        reason = resp.reason or "error"
        try:
            while chunk := await resp.read_some():
                size += len(chunk)
                if size > engine_errors.MAX_ERROR_BODY:
                    if resp.status >= 500:
                        raise UpstreamError(f"an error body over {engine_errors.MAX_ERROR_BODY} bytes")
                    # A 4xx is the request's own fault whatever its size (vLLM echoes a request's
                    # values in its messages): the client gets its status, never a readiness event.
                    parts = []
                    reason = f"The engine refused this request ({resp.status}); its message was too long to relay."
                    break
                parts.append(chunk)
        except UpstreamError as exc:
            raise self.upstream_failed(exc, ctx) from None
        body = b"".join(parts)
        if resp.status >= 500:
            log.warning(
                "engine error",
                extra={
                    "fields": {
                        "request_id": ctx.rid,
                        "status": resp.status,
                        "body": body[:ENGINE_ERROR_LOGGED].decode("utf-8", "replace"),
                    }
                },
            )
        answer = engine_errors.from_engine(resp.status, body, reason, ctx.rid, ctx.api)
        headers = [
            (k, v)
            for k, v in response_headers(resp, ctx.rid, ctx.ratelimit)
            if k.lower() not in (b"content-length", b"content-type")
        ]
        headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
        await ctx.send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await ctx.send({"type": "http.response.body", "body": answer})
        return resp.status

    async def _stream(self, ctx: RequestContext, resp: EngineResponse, pacing: Pacing) -> int:
        send, record, ticket, api = ctx.send, ctx.record, ctx.ticket, ctx.api
        headers = response_headers(resp, ctx.rid, ctx.ratelimit)
        ctype = resp.content_type
        sse = ctype.startswith("text/event-stream")
        parts = BY_API[api] if resp.status == 200 and api is not None else None
        account = parts.stream_account() if sse and parts is not None else None
        # Admission's latency reports (docs/admission.md): the first token, and the stream's mean
        # gap per token once `probe` tokens are out, long before its end.
        report = ticket is not None and account is not None
        probe = self.admission.probe_tokens if report else 0
        reported_first = False
        # JSON bodies of generations: watched for their usage report, never kept whole.
        usage = parts.body_usage() if parts is not None and not sse and ctype.startswith("application/json") else None
        # The usage event the relay asked for on the client's behalf, taken out again: every read
        # goes through the filter while it may hold part of an event or until the filter knows the
        # engine's dialect (vLLM 0.18 writes "usage":null into every event: then each read, for
        # good); after that only the reads the accounting did not prove plain token events (the
        # one with the usage report among them), with no call for the others.
        strip = UsageEventFilter() if ctx.strip_usage and sse else None
        sift_all = True
        plain = False  # without an account, no read is proven plain
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        first = 0.0
        try:
            while chunk := await resp.read_some():
                now = time.perf_counter()
                if not first:
                    first = now
                if account is not None:
                    plain = account.feed(chunk, now)
                    if report and account.first_token:
                        assert ticket is not None
                        if not reported_first:
                            reported_first = True
                            self.admission.first_token(ticket)
                        elif probe and account.tokens_so_far() >= probe:
                            probe = 0
                            gap = account.mean_token_gap()
                            if gap is not None and not pacing.by_client():
                                self.admission.inter_token(ticket, gap)
                elif usage is not None:
                    usage.feed(chunk)
                if strip is not None and (sift_all or not plain):
                    chunk = strip.feed(chunk)
                    sift_all = strip.holding or strip.null_usage is not False
                if resp.finished:  # the engine's last bytes: the response's end goes in the same write
                    tail = strip.flush() if strip is not None else b""
                    await send({"type": "http.response.body", "body": chunk + tail, "more_body": False})
                    break
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            else:
                tail = strip.flush() if strip is not None else b""
                await send({"type": "http.response.body", "body": tail, "more_body": False})
        except UpstreamError as exc:
            ctx.engine_failed = True
            failure = self.upstream_failed(exc, ctx)
            if sse:
                await send({"type": "http.response.body", "body": failure.sse_event(api), "more_body": False})
                return failure.status
            # The status line and part of the body are out: the only honest end is a connection
            # closed short of the body's length (or of its last chunk), which every HTTP client
            # reports as a truncated response. Returning without completing the response makes
            # uvicorn close it (it logs one line, no traceback). Counted as the status the client
            # got; the access log says it was cut.
            record.truncated = True
            return resp.status
        finally:
            if account is not None:
                record.tokens_seen = account.tokens_so_far()  # what a stream cut short still cost
        self._account(ctx, resp.status, first, account, usage, pacing)
        return resp.status

    def _account(
        self,
        ctx: RequestContext,
        status: int,
        first: float,
        account: SseAccount | None,
        scanner: BodyUsage | None,
        pacing: Pacing,
    ) -> None:
        record, entry = ctx.record, ctx.entry
        assert entry is not None
        route = entry.label
        if first:
            self.metrics.ttft.labels(route).observe(first - ctx.t0)
            record.ttft_s = first - ctx.t0
        if status != 200 or entry.api is None:
            return
        if account is not None:
            account.finish()
            if account.error:
                # The engine ended the stream with its own error event (vLLM does when its core
                # dies): the client got it; readiness hears of it now, as for a cut stream.
                record.engine_error_event = True
                ctx.engine_failed = True
                self.health.record_generation(False)
                self.health.report_engine_failure(ENGINE_ERROR_EVENT)
            else:
                self.health.record_generation(True)
            completion = account.completion_tokens()
            prompt = account.prompt_tokens()
            reported = account.usage is not None
            itl = account.mean_event_gap()
            if itl is not None:
                self.metrics.itl.labels(route).observe(itl)
            per_token = account.mean_token_gap()
            if per_token is None and (tokens := account.tokens_so_far()) >= 2:
                # Every token came in one read (a fast engine, a coalescing network): the stream's
                # whole time from the request's sending over its tokens bounds the gap from above.
                per_token = (account.last_token - record.sent_at) / tokens
            if per_token is not None:
                record.token_gap_s = per_token
                record.client_paced = pacing.by_client()  # then the gap is the client's pace
        else:
            self.health.record_generation(True)
            usage = scanner.usage() if scanner is not None else None
            count = usage.get("completion_tokens") if usage else None
            completion = count if isinstance(count, int) else 0
            prompt = usage.get("prompt_tokens") if usage else None
            reported = usage is not None
        record.usage_missing = not reported and BY_API[entry.api].reports_usage
        self.metrics.output_tokens.labels(route).inc(completion)
        record.completion_tokens = completion
        if isinstance(prompt, int):
            self.metrics.prompt_tokens.labels(route).inc(prompt)
            record.prompt_tokens = prompt


def response_headers(resp: EngineResponse, rid: str, ratelimit: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The engine's headers on the allow-list (RELAYED_RESPONSE), plus our request id and the
    tenant's x-ratelimit-* (when it has limits)."""
    headers = [(k, v) for k, v in resp.raw_headers if k.lower() in RELAYED_RESPONSE]
    headers.append((b"x-request-id", rid.encode()))
    if ratelimit:
        headers += ratelimit
    return headers
