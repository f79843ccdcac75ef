"""The streaming relay to the engine: the hot path, written as raw ASGI.

Per request: match the allow-list (routes.py; anything else is refused here, never relayed),
check the key, read the body under a size and time limit, check a generation's cost on the values
vLLM will use (policy/cost.py), take an admission slot,
send upstream, relay status, headers and every chunk as it arrives (never buffered), count it in
the metrics and fill in its RequestRecord (core/record.py): the access log's line is that record's
rendering, and admission learns from it. A client that goes away, streamed or not, cancels the
relay at once (the front end's DisconnectHook, or ASGI's http.disconnect under another server);
that closes the engine connection, which makes vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import orjson

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.admission.control import Admission, AdmissionControl, Draining, Refused, Ticket
from palmyra_serve.sidecar.admission.plan import AdmissionPlan
from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.disconnect import DISCONNECT_HOOK, DisconnectHook, mark_authenticated
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.core.record import RequestRecord
from palmyra_serve.sidecar.core.routes import GENERATION_ROUTES, OTHER, RELAYED, Api, Route
from palmyra_serve.sidecar.core.share import Share
from palmyra_serve.sidecar.lifecycle.health import HealthState
from palmyra_serve.sidecar.observability.access_log import AccessLog
from palmyra_serve.sidecar.policy import checks, structured
from palmyra_serve.sidecar.policy.fields import BY_TARGET
from palmyra_serve.sidecar.policy.inspect import inspect
from palmyra_serve.sidecar.relay.auth import ApiKeys, credential
from palmyra_serve.sidecar.relay.sse import SseAccount
from palmyra_serve.sidecar.relay.typed_events import BodyUsage, MessagesAccount, ResponsesAccount
from palmyra_serve.sidecar.relay.usage import UsageScanner
from palmyra_serve.sidecar.relay.usage_event import UsageEventFilter
from palmyra_serve.sidecar.tenants import reservation
from palmyra_serve.sidecar.tenants.config import TenantSpec
from palmyra_serve.sidecar.tenants.quota import Quotas, Reservation
from palmyra_serve.sidecar.tenants.salt import CacheSalts
from palmyra_serve.sidecar.upstream.failures import UpstreamError
from palmyra_serve.sidecar.upstream.pool import EnginePool, EngineResponse

if TYPE_CHECKING:
    from palmyra_serve.sidecar.observability.tracing import Tracing

# Not forwarded upstream: hop-by-hop headers (RFC 9110 section 7.6.1, plus the obsolete
# Proxy-Connection and those a Connection header lists, dropped per request), the ones the pool
# writes itself, and the client's key. Upgrade never gets here: the front end refuses it.
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
# The engine's response headers a client gets: only what describes the body. Everything else
# (hop-by-hop fields, the engine server's own date and server, set-cookie, CORS grants such as
# access-control-allow-origin: *, internal x- fields) stays inside the pod; the request id is ours.
RELAYED_RESPONSE = frozenset(
    {b"content-type", b"content-length", b"content-encoding", b"cache-control", b"retry-after"}
)
log = logging.getLogger("palmyra.sidecar")

SAFE_ID_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")
# What /ready's relay_failure says when a stream carried the engine's own error event.
ENGINE_ERROR_EVENT = "engine_error_event"
# How much of an engine's 5xx body the sidecar's log keeps (the client gets none of it).
ENGINE_ERROR_LOGGED = 4096
# A stream's accounting by the API it speaks (relay/sse.py for OpenAI's choices, relay/typed_events.py).
STREAM_ACCOUNTS: dict[Api, type[SseAccount]] = {Api.RESPONSES: ResponsesAccount, Api.MESSAGES: MessagesAccount}
# The engines whose Messages API carries cache_salt to the engine (vLLM 0.18.0's drops it).
MESSAGES_SALT_SINCE = (0, 32)


class ClientGone(Exception):
    """The client disconnected; nothing more can be sent."""


def request_id_from(raw: bytes | None) -> str:
    """Accept the caller's X-Request-Id when it is short and plain; else mint one."""
    if raw and len(raw) <= 128 and all(c in SAFE_ID_CHARS for c in raw):
        return raw.decode()
    return os.urandom(16).hex()


class Relay:
    def __init__(
        self,
        settings: Settings,
        metrics: SidecarMetrics,
        admission: AdmissionControl,
        keys: ApiKeys,
        health: HealthState,
        quotas: Quotas | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.admission = admission
        plan = AdmissionPlan.of(settings)
        self.gate_all = plan.gate_all  # which routes take a slot: the plan's call
        self.tokenize_gate = Admission(
            settings.tokenize_max_in_flight,
            settings.tokenize_max_queue,
            settings.tokenize_queue_timeout_s,
            settings.retry_after_s,
        )
        self.keys = keys
        self.quotas = quotas if quotas is not None else Quotas()
        self.health = health
        self.engine_auth = f"Bearer {settings.engine_api_key}".encode() if settings.engine_api_key else None
        self.pool: EnginePool | None = None  # set by the app's lifespan
        self.access_log = AccessLog()
        # Bodies held in memory at once, over all connections: reading a body happens before
        # admission, so without this cap max_connections slow uploads could each hold a full body.
        self.body_budget = plan.body_budget(settings.max_body_bytes)
        self.body_held = 0
        self._uploads: set[asyncio.Task] = set()  # requests whose body is still arriving
        self._uploads_refused = False
        self.limits = checks.Limits(
            max_tokens=settings.max_tokens_cap or settings.max_model_len,
            max_choices=settings.max_choices,
            max_logprobs=settings.max_logprobs,
            prompt_logprobs_max_tokens=settings.prompt_logprobs_max_tokens,
            structured=structured.StructuredLimits(
                max_bytes=settings.structured_max_bytes,
                max_repeat=settings.structured_max_repeat,
                max_choices=settings.structured_max_choices,
                regex_and_grammar=settings.structured_regex_grammar,
            ),
        )
        self.salts = CacheSalts()
        self.tracing: Tracing | None = None
        if settings.otlp_traces_endpoint:
            # Imported only here: with tracing off, OpenTelemetry is never loaded.
            from palmyra_serve.sidecar.observability.tracing import Tracing

            self.tracing = Tracing(settings)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        t0 = time.perf_counter()
        closing = self.health.draining
        if closing:
            send = _closing_connection(send)
        path = scope["path"]
        entry = RELAYED.get(path)
        route = entry.label if entry is not None else OTHER
        auth = api_key = rid_raw = clen = None
        listed: list[bytes] | None = None
        fwd: list[tuple[bytes, bytes]] = []
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value
            elif name == b"x-api-key":  # the Anthropic SDK's header: the same key
                api_key = value
            elif name == b"x-request-id":
                rid_raw = value
            elif name == b"content-length":
                clen = value
            elif name == b"connection" or name == b"proxy-connection":
                listed = (listed or []) + [t.strip().lower() for t in value.split(b",")]
            if name not in DROP_REQUEST:
                fwd.append((name, value))
        if listed:  # headers a Connection header names are hop-by-hop too (RFC 9110 section 7.6.1)
            fwd = [(n, v) for n, v in fwd if n not in listed]
        rid = request_id_from(rid_raw)
        record = RequestRecord(rid, scope["method"], path, route)
        status = 500
        held = 0
        body_read = False
        tenant: TenantSpec | None = None
        taken: Reservation | None = None
        demand: reservation.Demand | None = None
        try:
            # The key first: without one, nothing about the routes is revealed (no 404 or 405).
            name = self.keys.identify(credential(auth, api_key))
            if name is None:
                raise _reject(self.metrics, errors.unauthorized())
            tenants = self.keys.tenants  # this request's view, whatever a reload does meanwhile
            tenant = tenants.spec(name)
            record.tenant = name
            mark_authenticated(scope)  # its connection is no longer anonymous (edge/protocol.py)
            if self.tracing is not None:
                # Traced from its head (t0), but only once its key is known: a caller without one
                # costs no spans, whatever traceparent it sends.
                record.trace = self.tracing.start(scope, record, t0)
                record.trace_id = record.trace.trace_id
            if entry is None:
                raise _reject(self.metrics, errors.not_found(scope["method"], path))
            if scope["method"] not in entry.methods:
                raise _reject(self.metrics, errors.method_not_allowed(scope["method"], path, entry.allow))
            if self.admission.draining:
                raise _reject(self.metrics, errors.draining(self.settings.retry_after_s))
            body = await self._read_body(receive, clen)
            body_read = True
            held = len(body)
            if body and entry.target in BY_TARGET:
                body, demand = self._inspect(body, entry, tenant, record, shared_engine=len(tenants.by_name) > 1)
            if record.trace is not None:
                record.admit_at = time.perf_counter()
            if self.quotas.limited(tenant):
                verdict = await self.quotas.admit(tenant, demand.tokens if demand is not None else None)
                record.ratelimit_headers = verdict.headers
                if verdict.reservation is None:
                    assert verdict.refusal is not None
                    raise _reject(self.metrics, verdict.refusal)
                taken = verdict.reservation
            share = tenants.share(name)
            status = await self._admitted_relay(scope, receive, send, entry, body, fwd, rid, record, t0, share)
        except errors.ApiError as exc:
            status = exc.status
            record.error = exc.code
            if tenant is not None:
                self.metrics.tenant_refusal(tenant.name, exc.code)
            if record.ratelimit_headers:
                exc = dataclasses.replace(exc, extra_headers=tuple(record.ratelimit_headers))
            # Answered before its body was read: the connection ends after this response (the
            # front end lingers and discards the rest), and the client must be told so, or it
            # sends its next request into a closing connection (when closing, it was said already).
            close = not body_read and not closing and _has_body(scope, clen)
            await errors.send_error(send, exc, rid, close, entry.api if entry is not None else None)
        except ClientGone:
            status = 499  # nginx's "client closed request": counted, never sent
            record.client_disconnected = True
        except Exception as exc:
            status = 500
            record.error = errors.ErrorCode.INTERNAL_ERROR
            await self._internal_fault(exc, send, rid, entry.api if entry is not None else None)
        else:
            self.health.sidecar_faults_in_row = 0
        finally:
            if taken is not None:
                self.quotas.release(taken)  # first: whatever fails below, the slot is given back
            self.body_held -= held
            took = time.perf_counter() - t0
            self.metrics.count_request(route, status)
            self.metrics.duration.labels(route).observe(took)
            record.status = status
            record.duration_s = took
            if record.trace is not None:
                self._end_trace(record, t0 + took)
            self.access_log.write(time.time(), record.log_fields())
            if tenant is not None:
                self.metrics.count_tenant(tenant.name, status, record.prompt_tokens, record.completion_tokens)
            if taken is not None:
                await self.quotas.settle(taken, tokens_spent(record, demand))

    async def _admitted_relay(
        self,
        scope: dict,
        receive: Any,
        send: Any,
        entry: Route,
        body: bytes,
        fwd: list[tuple[bytes, bytes]],
        rid: str,
        record: RequestRecord,
        t0: float,
        share: Share,
    ) -> int:
        """Admission, then the relay, with the client's going away heard throughout: a queued
        request whose client left gives its queue place up at once, and a relayed one is cancelled
        (which closes the engine connection, and vLLM aborts the generation). A non-streamed
        generation sends nothing until it is done, so this is heard from the connection itself."""
        task = asyncio.current_task()
        assert task is not None
        hook, watcher = _disconnect_hook(scope, receive)
        if hook.lost:
            raise ClientGone
        gone = _Gone(task)
        hook.on_disconnect = gone.cancel_relay
        try:
            gate = self._gate_of(entry)
            ticket = await self._admit(gate, record, share) if gate is not None else None
            relayed = False
            try:
                record.status = await self._relay(scope, send, entry.label, body, fwd, rid, record, t0, ticket, hook)
                relayed = True
                return record.status
            finally:
                if gate is not None and ticket is not None:
                    gap = record.gap_to_learn() if relayed else None
                    ok = relayed and record.status < 300 and not record.engine_failed
                    gate.release(ticket, gap, "ok" if ok else "ignore")
        except asyncio.CancelledError:
            if gone.flag:
                task.uncancel()  # our own cancellation, not the server's: report it as a gone client
                raise ClientGone from None
            raise
        finally:
            hook.on_disconnect = None
            if watcher is not None:
                watcher.cancel()

    def _end_trace(self, record: RequestRecord, end: float) -> None:
        """The request's spans ended; a failure of tracing costs its spans, never the request."""
        try:
            record.trace.finish(record, end)
        except Exception:
            log.exception("tracing a request failed", extra={"fields": {"request_id": record.request_id}})

    async def _internal_fault(self, exc: Exception, send: Any, rid: str, api: Api | None) -> None:
        """The sidecar's own code failed this request (a bug): counted, logged with its traceback,
        a 500 for the client if nothing was sent yet (else the connection is cut short), and told
        to readiness, which turns false when every request fails this way (lifecycle/health.py)."""
        self.metrics.internal_errors.inc()
        self.health.report_sidecar_fault()
        log.error("internal error", exc_info=exc, extra={"fields": {"request_id": rid}})
        try:
            await errors.send_error(send, errors.internal_error(rid), rid, api=api)
        except RuntimeError:
            pass  # the response had started: returning leaves it incomplete, uvicorn closes the connection

    def _gate_of(self, entry: Route) -> AdmissionControl | None:
        """Generations: the engine's admission. Tokenizations: a small gate of their own (cheap for
        the engine one by one, not by the hundred, and their latency says nothing about
        generating). Anything else: the engine's admission in fixed mode, none in adaptive."""
        if entry.generates:
            return self.admission
        if entry.tokenizes:
            return self.tokenize_gate
        return self.admission if self.gate_all else None

    async def _admit(self, gate: AdmissionControl, record: RequestRecord, share: Share) -> Ticket:
        """A slot in the engine, or the refusal: 429 with its reason and Retry-After, 503 when draining."""
        try:
            ticket = await gate.acquire(share)
        except Refused as exc:
            raise _reject(self.metrics, errors.overloaded(exc.reason, exc.retry_after_s)) from None
        except Draining:
            raise _reject(self.metrics, errors.draining(self.settings.retry_after_s)) from None
        self.metrics.queue_wait.observe(ticket.queue_wait_s)
        record.queue_wait_s = ticket.queue_wait_s
        return ticket

    async def _read_body(self, receive: Any, clen: bytes | None) -> bytes:
        limit = self.settings.max_body_bytes
        if clen is not None and clen.isdigit() and int(clen) > limit:
            raise _reject(self.metrics, errors.body_too_large(limit))
        chunks: list[bytes] = []
        size = 0
        uploading: asyncio.Task | None = None
        try:
            # A slow-loris body must not hold a connection (or, later, a slot): a deadline of its
            # own, much shorter than the engine's read timeout.
            async with asyncio.timeout(self.settings.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise ClientGone
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    self.body_held += len(chunk)
                    if size > limit:
                        raise _reject(self.metrics, errors.body_too_large(limit))
                    if self.body_held > self.body_budget:
                        raise _reject(self.metrics, errors.bodies_over_budget(self.settings.retry_after_s))
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
                    if uploading is None:  # a body still arriving: a drain must be able to end it
                        uploading = asyncio.current_task()
                        assert uploading is not None
                        self._uploads.add(uploading)
        except BaseException as exc:
            self.body_held -= size  # on success the caller releases it when the request ends
            if isinstance(exc, TimeoutError):
                raise _reject(self.metrics, errors.body_timeout()) from None
            if isinstance(exc, asyncio.CancelledError) and uploading is not None and self._uploads_refused:
                uploading.uncancel()  # refuse_uploads() cancelled it: answer, rather than vanish
                raise _reject(self.metrics, errors.draining(self.settings.retry_after_s)) from None
            raise
        finally:
            if uploading is not None:
                self._uploads.discard(uploading)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def uploads_arriving(self) -> int:
        return len(self._uploads)

    def refuse_uploads(self) -> None:
        """Draining, with admission closed: a body still arriving would only be refused once it is
        complete (a slow upload could hold the process's exit for its whole body deadline), so it
        is refused now, 503 with Retry-After and the connection closed."""
        self._uploads_refused = True
        for task in self._uploads:
            task.cancel()

    def _inspect(
        self, body: bytes, entry: Route, tenant: TenantSpec, record: RequestRecord, shared_engine: bool = False
    ) -> tuple[bytes, reservation.Demand | None]:
        """Every field of the body decided (policy/fields.py: checked, rewritten, stripped, refused or
        passed); for a generation, the rewrites: the usage report asked for on every stream (its
        event removed again when the client did not ask: record.strip_usage), the tenant's cache
        salt and priority; for a tenant with a tokens limit, the tokens it reserves. The parsed body
        lives only inside this call: it is dropped before the request waits; it is re-encoded only
        when something in it changed. A body whose content breaks a walk (nesting past Python's
        recursion) is the client's 400, never the sidecar's fault."""
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise _reject(self.metrics, errors.invalid_json()) from None
        try:
            seen = inspect(payload, BY_TARGET[entry.target], self.limits, entry.api)
        except errors.ApiError as exc:
            raise _reject(self.metrics, exc) from None
        except RecursionError:
            raise _reject(self.metrics, errors.invalid_parameter("body", "The body is nested too deeply.")) from None
        changed = seen.changed
        api = entry.api
        if api is None:
            return (orjson.dumps(payload) if changed else body), None
        if record.trace is not None and isinstance(model := payload.get("model"), str):
            record.model = model
        if seen.streams and api in (Api.COMPLETIONS, Api.CHAT):
            # Tokens are counted from the engine's usage report, never from events: asked for on
            # every stream, and removed again when the client did not ask for it (a client's
            # continuous_usage_stats had no effect without include_usage, and must not start to).
            payload["stream_options"] = {
                "include_usage": True,
                "continuous_usage_stats": seen.continuous_usage and seen.wants_usage,
            }
            record.strip_usage = not seen.wants_usage
            changed = True
        if api is Api.RESPONSES and payload.get("store") is not False:
            payload["store"] = False  # stateless (policy/fields.py): the engine keeps nothing
            changed = True
        salt = self.salts.of(tenant)
        if salt is not None:
            if api is Api.MESSAGES and shared_engine:
                self._messages_keep_private()
            payload["cache_salt"] = salt
            changed = True
        elif payload.pop("cache_salt", None) is not None:
            changed = True
        if api is Api.MESSAGES:
            self._messages_keep_order(tenant)  # vLLM's Messages API has no priority to set
        elif self.settings.priority_scheduling:
            if payload.get("priority") != tenant.priority:
                payload["priority"] = tenant.priority
                changed = True
        elif payload.pop("priority", None) is not None:
            changed = True
        demand = None
        if tenant.tokens_per_minute:
            demand = reservation.demand(
                payload,
                api,
                self.settings.quota_reserve_tokens,
                self.limits.max_tokens,
                seen.extra_prompt_bytes,
            )
        return (orjson.dumps(payload) if changed else body), demand

    def _messages_keep_private(self) -> None:
        """Where several tenants share the engine, one whose prompts stay out of the others' prefix
        cache is served the Messages API only by an engine that carries cache_salt through it (vLLM
        0.18.0's converts the request to a chat completion without it): elsewhere its prompts would
        share the cache after all."""
        if _version_at_least(self.health.engine_version, MESSAGES_SALT_SINCE):
            return
        raise _reject(
            self.metrics,
            errors.ApiError.of(
                errors.ErrorCode.UNSUPPORTED_PARAMETER,
                f"This engine (vLLM {self.health.engine_version or 'of unknown version'}) cannot keep a tenant's "
                "prompts out of the shared prefix cache on the Messages API, and this tenant's are kept private: "
                "use /v1/chat/completions, or ask the operator for `prefix_cache: shared`.",
            ),
        )

    def _messages_keep_order(self, tenant: TenantSpec) -> None:
        """vLLM's Messages API sets no priority: with priority scheduling on, a tenant ranked below the
        engine's default would jump ahead of its rank there, so it is sent to the routes that carry it."""
        if not self.settings.priority_scheduling or tenant.priority <= 0:
            return
        raise _reject(
            self.metrics,
            errors.ApiError.of(
                errors.ErrorCode.UNSUPPORTED_PARAMETER,
                "The Messages API cannot carry this tenant's scheduling priority: use /v1/chat/completions "
                "or /v1/responses.",
            ),
        )

    async def _relay(
        self,
        scope: dict,
        send: Any,
        route: str,
        body: bytes,
        fwd: list[tuple[bytes, bytes]],
        rid: str,
        record: RequestRecord,
        t0: float,
        ticket: Ticket | None,
        hook: DisconnectHook,
    ) -> int:
        assert self.pool is not None
        fwd.append((b"x-request-id", rid.encode()))
        if self.engine_auth:
            fwd.append((b"authorization", self.engine_auth))
        target = RELAYED[scope["path"]].target  # the allow-list's canonical path, never the client's raw one
        if qs := scope.get("query_string"):
            target += b"?" + qs
        pacing = _Pacing(hook)
        record.sent_at = time.perf_counter()
        if record.trace is not None:
            # The engine's spans continue the sidecar's trace, not whatever the client sent.
            fwd = [(n, v) for n, v in fwd if n != b"traceparent"]
            fwd.append((b"traceparent", record.trace.engine_traceparent(scope["method"], target, record.sent_at)))
        # A failed open leaves engine_done_at unset: its span then ends with the request's.
        resp = await self._open(scope["method"], target, fwd, body, record)
        try:
            if record.trace is not None:
                record.engine_status = resp.status
                if resp.opened_at >= record.sent_at:  # a connection opened for this request
                    record.connected_at = resp.opened_at
            if resp.status >= 400:
                return await self._relay_error(send, resp, rid, record, RELAYED[scope["path"]].api)
            return await self._stream(send, RELAYED[scope["path"]], resp, rid, record, t0, ticket, pacing)
        finally:
            resp.release()  # closes the connection unless the response was read to its end
            if record.trace is not None:
                record.engine_done_at = time.perf_counter()

    def _upstream_failed(self, exc: UpstreamError, record: RequestRecord) -> errors.ApiError:
        """Count, log and map a failure talking to the engine; tell readiness unless it was only slow."""
        code = exc.code
        self.metrics.upstream_error(code)
        record.upstream_error = code
        record.upstream_detail = str(exc)
        if code != errors.ErrorCode.ENGINE_TIMEOUT:
            self.health.report_engine_failure(code)
        return errors.upstream(code, self.settings.retry_after_s)

    async def _open(
        self, method: str, target: bytes, fwd: list[tuple[bytes, bytes]], body: bytes, record: RequestRecord
    ) -> EngineResponse:
        assert self.pool is not None
        try:
            return await self.pool.request(method, target, fwd, body)
        except UpstreamError as exc:
            raise self._upstream_failed(exc, record) from None

    async def _relay_error(
        self, send: Any, resp: EngineResponse, rid: str, record: RequestRecord, api: Api | None
    ) -> int:
        """An engine error reaches the client rebuilt in OpenAI's shape, status kept
        (errors.from_engine: a 5xx's text only in the log, under the request id)."""
        parts: list[bytes] = []
        size = 0
        reason = resp.reason or "error"
        try:
            while chunk := await resp.read_some():
                size += len(chunk)
                if size > errors.MAX_ERROR_BODY:
                    if resp.status >= 500:
                        raise UpstreamError(f"an error body over {errors.MAX_ERROR_BODY} bytes")
                    # A 4xx is the request's own fault whatever its size (vLLM echoes a request's
                    # values in its messages): the client gets its status, never a readiness event.
                    parts = []
                    reason = f"The engine refused this request ({resp.status}); its message was too long to relay."
                    break
                parts.append(chunk)
        except UpstreamError as exc:
            raise self._upstream_failed(exc, record) from None
        body = b"".join(parts)
        if resp.status >= 500:
            log.warning(
                "engine error",
                extra={
                    "fields": {
                        "request_id": rid,
                        "status": resp.status,
                        "body": body[:ENGINE_ERROR_LOGGED].decode("utf-8", "replace"),
                    }
                },
            )
        answer = errors.from_engine(resp.status, body, reason, rid, api)
        headers = [
            (k, v)
            for k, v in _response_headers(resp, rid, record)
            if k.lower() not in (b"content-length", b"content-type")
        ]
        headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})
        return resp.status

    async def _stream(
        self,
        send: Any,
        entry: Route,
        resp: EngineResponse,
        rid: str,
        record: RequestRecord,
        t0: float,
        ticket: Ticket | None,
        pacing: _Pacing,
    ) -> int:
        headers = _response_headers(resp, rid, record)
        ctype = resp.content_type
        sse = ctype.startswith("text/event-stream")
        api = entry.api
        counted = resp.status == 200 and api is not None
        account = STREAM_ACCOUNTS.get(api, SseAccount)() if sse and counted and api is not None else None
        # Admission's latency reports (docs/admission.md): the first token, and the stream's mean
        # gap per token once `probe` tokens are out, long before its end.
        report = ticket is not None and account is not None
        probe = self.admission.probe_tokens if report else 0
        reported_first = False
        # JSON bodies of generations: watched for their usage report, never kept.
        usage: UsageScanner | BodyUsage | None = None
        if counted and not sse and ctype.startswith("application/json"):
            usage = UsageScanner() if api in (Api.COMPLETIONS, Api.CHAT) else BodyUsage(api)  # type: ignore[arg-type]
        # The usage event the relay asked for on the client's behalf, taken out again.
        strip = UsageEventFilter() if record.strip_usage and sse else None
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        first = 0.0
        try:
            while chunk := await resp.read_some():
                now = time.perf_counter()
                if not first:
                    first = now
                if account is not None:
                    account.feed(chunk, now)
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
                if strip is not None and (strip.holding or b'"usage"' in chunk or not chunk.endswith(b"\n\n")):
                    chunk = strip.feed(chunk)  # else nothing to take out: passed as it is, no call
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
            record.engine_failed = True
            failure = self._upstream_failed(exc, record)
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
        self._account(entry, resp.status, first, t0, account, usage, record, pacing)
        return resp.status

    def _account(
        self,
        entry: Route,
        status: int,
        first: float,
        t0: float,
        account: SseAccount | None,
        scanner: UsageScanner | BodyUsage | None,
        record: RequestRecord,
        pacing: _Pacing,
    ) -> None:
        route = entry.label
        if first:
            self.metrics.ttft.labels(route).observe(first - t0)
            record.ttft_s = first - t0
        if status != 200 or route not in GENERATION_ROUTES:
            return
        if account is not None:
            account.finish()
            if account.error:
                # The engine ended the stream with its own error event (vLLM does when its core
                # dies): the client got it; readiness hears of it now, as for a cut stream.
                record.engine_error_event = True
                record.engine_failed = True
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
        record.usage_missing = not reported and entry.api in (Api.RESPONSES, Api.MESSAGES)
        self.metrics.output_tokens.labels(route).inc(completion)
        record.completion_tokens = completion
        if isinstance(prompt, int):
            self.metrics.prompt_tokens.labels(route).inc(prompt)
            record.prompt_tokens = prompt


def _response_headers(resp: EngineResponse, rid: str, record: RequestRecord) -> list[tuple[bytes, bytes]]:
    """The engine's headers on the allow-list (RELAYED_RESPONSE), plus our request id and the
    tenant's x-ratelimit-* (when it has limits)."""
    headers = [(k, v) for k, v in resp.raw_headers if k.lower() in RELAYED_RESPONSE]
    headers.append((b"x-request-id", rid.encode()))
    if record.ratelimit_headers:
        headers += record.ratelimit_headers
    return headers


def tokens_spent(record: RequestRecord, demand: reservation.Demand | None) -> int:
    """What a request cost its tenant's tokens per minute: the engine's usage when it reported it;
    nothing for a request the engine never got or refused (its 4xx); for a client that left before
    the usage came, what it reserved, at least its estimated prompt and the tokens relayed (leaving
    just before the end must not make a generation free); for an engine that failed, the estimated
    prompt and the tokens relayed; for an API that always reports usage and did not (its report past
    the accounting's cap, relay/typed_events.py), at least the whole reservation."""
    if demand is None or not record.sent_at:
        return 0
    if record.usage_missing:
        return max(demand.tokens, demand.prompt_tokens + record.tokens_seen)
    if record.completion_tokens is not None:
        prompt = record.prompt_tokens if record.prompt_tokens is not None else demand.prompt_tokens
        return prompt + record.completion_tokens
    seen = demand.prompt_tokens + record.tokens_seen
    if record.client_disconnected:
        return max(demand.tokens, seen)
    if 400 <= record.status < 500:
        return 0
    return seen


def _closing_connection(send: Any) -> Any:
    """While draining, every response says `Connection: close` (uvicorn then closes the
    connection after it): a client on a kept-alive connection, which kube-proxy and most
    connection pools keep pinned to this pod, reconnects and is routed to a replica that stays."""

    async def send_closing(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message["headers"], (b"connection", b"close")]}
        await send(message)

    return send_closing


class _Pacing:
    """Whether a stream's client set its pace: the client's transport paused the relay's writes
    (its reader was slower than the engine) since the stream began. Admission learns the engine's
    gap only from streams the engine paced."""

    __slots__ = ("hook", "pauses")

    def __init__(self, hook: DisconnectHook) -> None:
        self.hook = hook
        self.pauses = hook.write_pauses

    def by_client(self) -> bool:
        return self.hook.write_pauses != self.pauses


class _Gone:
    """The relay's task and whether this module cancelled it because its client went away."""

    __slots__ = ("flag", "task")

    def __init__(self, task: asyncio.Task) -> None:
        self.flag = False
        self.task = task

    def cancel_relay(self) -> None:
        """Unwinding the relay closes the engine connection, which makes the engine abort the
        generation."""
        self.flag = True
        self.task.cancel()


def _disconnect_hook(scope: dict, receive: Any) -> tuple[DisconnectHook, asyncio.Task | None]:
    """The connection's DisconnectHook: the front end's (edge/protocol.py), which hears a client
    leave from connection_lost at no cost per request; under another ASGI server, one made here
    and fed by a task waiting on ASGI's own `http.disconnect` (the body is read by then, so that
    task is receive()'s only caller)."""
    hook: DisconnectHook | None = scope.get(DISCONNECT_HOOK)
    if hook is not None:
        return hook, None
    hook = DisconnectHook()
    return hook, asyncio.create_task(_hear_disconnect(receive, hook))


async def _hear_disconnect(receive: Any, hook: DisconnectHook) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    hook.lost = True
    if hook.on_disconnect is not None:
        hook.on_disconnect()


def _has_body(scope: dict, clen: bytes | None) -> bool:
    if clen is not None:
        return clen.strip() not in (b"", b"0")
    return any(name == b"transfer-encoding" for name, _ in scope["headers"])


def _reject(metrics: SidecarMetrics, exc: errors.ApiError) -> errors.ApiError:
    """Count a refusal; its metric reason is always its error code."""
    metrics.reject(exc.code)
    return exc


def _version_at_least(version: str | None, floor: tuple[int, int]) -> bool:
    """Whether a vLLM version string ("0.32.0", "0.18.0+ascend") is at least major.minor `floor`;
    an unknown or unreadable one is not."""
    if version is None:
        return False
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= floor
