"""The streaming relay to the engine: the hot path, written as raw ASGI, one request as named steps
around one context (relay/context.py):

    ingress   the head read once: headers to forward, key, request id (relay/ingress.py)
    identify  the key's tenant (tenants/tenancy.py), and the request's trace from its head
    route     the allow-list (core/routes.py): 404 / 405 here, never relayed; 503 while draining
    body      read under a size limit, a deadline and a budget (relay/body.py)
    inspect   every field decided (policy/), then the rewrites: the API's for accounting
              (relay/apis/), the tenant's salt and priority, and the tokens it reserves
    gates     the tenant's lease on its limits, then a slot in the engine (admission/), the
              client's going away heard throughout (relay/watch.py)
    pump      sent upstream, the answer relayed chunk by chunk and accounted (relay/pump.py)
    finish    the record published once: access log, metrics, traces, and the tenant's lease
              settled (relay/finish.py)

Every refusal below is a domain error (core/errors.py's ApiError, or admission's and upstream's own
exceptions mapped here once) and leaves by one path: counted once by its code, written once in the
route's API shape. A client that goes away, streamed or not, cancels the relay at once, which
closes the engine connection and makes vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import orjson

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.admission.control import Admission, AdmissionControl, Draining, Refused
from palmyra_serve.sidecar.admission.plan import AdmissionPlan
from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.disconnect import mark_authenticated
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.core.record import RequestRecord
from palmyra_serve.sidecar.core.routes import OTHER, RELAYED, Route
from palmyra_serve.sidecar.lifecycle.health import HealthState
from palmyra_serve.sidecar.observability.access_log import AccessLog
from palmyra_serve.sidecar.policy import checks, structured
from palmyra_serve.sidecar.policy.inspect import inspect
from palmyra_serve.sidecar.policy.tables import BY_TARGET
from palmyra_serve.sidecar.relay.apis import BY_API
from palmyra_serve.sidecar.relay.body import BodyReader, ClientGone
from palmyra_serve.sidecar.relay.context import RequestContext
from palmyra_serve.sidecar.relay.finish import Publisher
from palmyra_serve.sidecar.relay.ingress import Head, closing_connection, has_body
from palmyra_serve.sidecar.relay.pump import Pump
from palmyra_serve.sidecar.relay.watch import Gone, disconnect_hook
from palmyra_serve.sidecar.tenants.tenancy import Tenancy
from palmyra_serve.sidecar.upstream.pool import EnginePool

if TYPE_CHECKING:
    from palmyra_serve.sidecar.observability.tracing import Tracing

log = logging.getLogger("palmyra.sidecar")


class Relay:
    def __init__(
        self,
        settings: Settings,
        metrics: SidecarMetrics,
        admission: AdmissionControl,
        tenancy: Tenancy,
        health: HealthState,
        pool: EnginePool | None = None,
        access_log: AccessLog | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.admission = admission
        self.tenancy = tenancy
        self.health = health
        plan = AdmissionPlan.of(settings)
        self.gate_all = plan.gate_all  # which routes take a slot: the plan's call
        self.tokenize_gate = Admission(
            settings.tokenize_max_in_flight,
            settings.tokenize_max_queue,
            settings.tokenize_queue_timeout_s,
            settings.retry_after_s,
        )
        self.bodies = BodyReader(
            settings.max_body_bytes,
            settings.body_timeout_s,
            plan.body_budget(settings.max_body_bytes),
            settings.retry_after_s,
        )
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
        pool = (
            pool
            if pool is not None
            else EnginePool(settings.engine_url, settings.connect_timeout_s, settings.read_timeout_s)
        )
        self.pump = Pump(pool, settings.engine_api_key, settings.retry_after_s, metrics, health, admission)
        self.tracing: Tracing | None = None
        if settings.otlp_traces_endpoint:
            # Imported only here: with tracing off, OpenTelemetry is never loaded.
            from palmyra_serve.sidecar.observability.tracing import Tracing

            self.tracing = Tracing(settings)
        self.publish = Publisher(metrics, access_log if access_log is not None else AccessLog(), tenancy)

    # --- the request -------------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        ctx = self.ingress(scope, receive, send)
        try:
            self.identify(ctx)
            self.route(ctx)
            await self.read_body(ctx)
            self.inspect(ctx)
            ctx.record.status = await self.gates_and_pump(ctx)
        except errors.ApiError as exc:
            await self.refuse(ctx, exc)
        except ClientGone:
            ctx.record.status = 499  # nginx's "client closed request": counted, never sent
            ctx.record.client_disconnected = True
        except Exception as exc:
            await self.fault(ctx, exc)
        else:
            self.health.sidecar_faults_in_row = 0
        finally:
            self.bodies.release(ctx.held)
            await self.publish.finish(ctx, self.tracing)

    def ingress(self, scope: dict, receive: Any, send: Any) -> RequestContext:
        t0 = time.perf_counter()
        closing = self.health.draining
        if closing:
            send = closing_connection(send)
        path = scope["path"]
        entry = RELAYED.get(path)
        head = Head(scope["headers"])
        record = RequestRecord(head.request_id, scope["method"], path, entry.label if entry is not None else OTHER)
        return RequestContext(
            scope,
            receive,
            send,
            t0,
            entry,
            record,
            head.forward,
            head.authorization,
            head.api_key,
            head.content_length,
            closing,
        )

    def identify(self, ctx: RequestContext) -> None:
        """The key first: without one, nothing about the routes is revealed (no 404 or 405)."""
        tenant = self.tenancy.identify(ctx.authorization, ctx.api_key)
        if tenant is None:
            raise errors.unauthorized()
        ctx.tenant = tenant
        ctx.record.tenant = tenant.name
        mark_authenticated(ctx.scope)  # its connection is no longer anonymous (edge/protocol.py)
        if self.tracing is not None:
            # Traced from its head (t0), but only once its key is known: a caller without one
            # costs no spans, whatever traceparent it sends.
            ctx.record.trace = self.tracing.start(ctx.scope, ctx.record, ctx.t0)
            ctx.record.trace_id = ctx.record.trace.trace_id

    def route(self, ctx: RequestContext) -> None:
        scope, entry = ctx.scope, ctx.entry
        if entry is None:
            raise errors.not_found(scope["method"], scope["path"])
        if scope["method"] not in entry.methods:
            raise errors.method_not_allowed(scope["method"], scope["path"], entry.allow)
        if self.admission.draining:
            raise errors.draining(self.settings.retry_after_s)

    async def read_body(self, ctx: RequestContext) -> None:
        ctx.body = await self.bodies.read(ctx.receive, ctx.content_length)
        ctx.body_read = True
        ctx.held = len(ctx.body)

    def inspect(self, ctx: RequestContext) -> None:
        """Every field of the body decided (policy/fields.py: checked, rewritten, stripped, refused or
        passed); for a generation, the rewrites: the API's (relay/apis/), the tenant's (its cache
        salt and priority) and, for a tenant with a tokens limit, the tokens it reserves. The parsed
        body lives only inside this step; it is re-encoded only when something in it changed. A
        body whose content breaks a walk (nesting past Python's recursion) is the client's 400,
        never the sidecar's fault."""
        entry, tenant = ctx.entry, ctx.tenant
        assert entry is not None and tenant is not None
        if not ctx.body or entry.target not in BY_TARGET:
            return
        try:
            payload = orjson.loads(ctx.body)
        except orjson.JSONDecodeError:
            raise errors.invalid_json() from None
        try:
            seen = inspect(payload, BY_TARGET[entry.target], self.limits, entry.api)
        except RecursionError:
            raise errors.invalid_parameter("body", "The body is nested too deeply.") from None
        changed = seen.changed
        api = entry.api
        if api is not None:
            if ctx.record.trace is not None and isinstance(model := payload.get("model"), str):
                ctx.record.model = model
            rewrote, ctx.strip_usage = BY_API[api].rewrite(payload, seen)
            changed |= rewrote
            changed |= self.tenancy.rewrite(payload, tenant, api, self.health.engine_version)
            ctx.demand = self.tenancy.demand(payload, tenant, api, self.limits.max_tokens, seen.extra_prompt_bytes)
        if changed:
            ctx.body = orjson.dumps(payload)

    async def gates_and_pump(self, ctx: RequestContext) -> int:
        """The tenant's lease, then admission, then the relay, with the client's going away heard
        throughout: a queued request whose client left gives its queue place up at once, and a
        relayed one is cancelled (which closes the engine connection, and vLLM aborts the
        generation). A non-streamed generation sends nothing until it is done, so this is heard from
        the connection itself."""
        assert ctx.tenant is not None and ctx.entry is not None
        if ctx.record.trace is not None:
            ctx.record.admit_at = time.perf_counter()
        ctx.lease = await self.tenancy.lease(ctx.tenant, ctx.demand)
        ctx.ratelimit = ctx.lease.headers or []
        task = asyncio.current_task()
        assert task is not None
        hook, watcher = disconnect_hook(ctx.scope, ctx.receive)
        if hook.lost:
            raise ClientGone
        gone = Gone(task)
        hook.on_disconnect = gone.cancel_relay
        try:
            gate = self._gate_of(ctx.entry)
            ctx.ticket = await self._admit(gate, ctx) if gate is not None else None
            relayed = False
            try:
                ctx.record.status = await self.pump.relay(ctx, hook)
                relayed = True
                return ctx.record.status
            finally:
                if gate is not None and ctx.ticket is not None:
                    gap = ctx.gap_to_learn() if relayed else None
                    ok = relayed and ctx.record.status < 300 and not ctx.engine_failed
                    gate.release(ctx.ticket, gap, "ok" if ok else "ignore")
        except asyncio.CancelledError:
            if gone.flag:
                task.uncancel()  # our own cancellation, not the server's: report it as a gone client
                raise ClientGone from None
            raise
        finally:
            hook.on_disconnect = None
            if watcher is not None:
                watcher.cancel()

    def _gate_of(self, entry: Route) -> AdmissionControl | None:
        """Generations: the engine's admission. Tokenizations: a small gate of their own (cheap for
        the engine one by one, not by the hundred, and their latency says nothing about
        generating). Anything else: the engine's admission in fixed mode, none in adaptive."""
        if entry.generates:
            return self.admission
        if entry.tokenizes:
            return self.tokenize_gate
        return self.admission if self.gate_all else None

    async def _admit(self, gate: AdmissionControl, ctx: RequestContext) -> Any:
        """A slot in the engine, or the refusal: 429 with its reason and Retry-After, 503 when draining."""
        assert ctx.tenant is not None
        try:
            ticket = await gate.acquire(ctx.tenant.share)
        except Refused as exc:
            raise errors.overloaded(exc.reason, exc.retry_after_s) from None
        except Draining:
            raise errors.draining(self.settings.retry_after_s) from None
        self.metrics.queue_wait.observe(ticket.queue_wait_s)
        ctx.record.queue_wait_s = ticket.queue_wait_s
        return ticket

    # --- the ways out ------------------------------------------------------------------------
    async def refuse(self, ctx: RequestContext, exc: errors.ApiError) -> None:
        """Every refusal's one way out: counted once by its code (a failure talking to the engine was
        counted where it happened), written once in the route's API shape with the tenant's headers."""
        record = ctx.record
        record.status = exc.status
        record.error = exc.code
        if exc.code.family is not errors.Family.UPSTREAM:
            self.metrics.reject(exc.code)
        if ctx.tenant is not None:
            self.metrics.tenant_refusal(ctx.tenant.name, exc.code)
        exc = exc.with_headers(ctx.ratelimit)
        # Answered before its body was read: the connection ends after this response (the front end
        # lingers and discards the rest), and the client must be told so, or it sends its next
        # request into a closing connection (when closing, it was said already).
        close = not ctx.body_read and not ctx.closing and has_body(ctx.scope, ctx.content_length)
        await errors.send_error(ctx.send, exc, ctx.rid, close, ctx.api)

    async def fault(self, ctx: RequestContext, exc: Exception) -> None:
        """The sidecar's own code failed this request (a bug): counted, logged with its traceback,
        a 500 for the client if nothing was sent yet (else the connection is cut short), and told
        to readiness, which turns false when every request fails this way (lifecycle/health.py)."""
        ctx.record.status = 500
        ctx.record.error = errors.ErrorCode.INTERNAL_ERROR
        self.metrics.internal_errors.inc()
        self.health.report_sidecar_fault()
        log.error("internal error", exc_info=exc, extra={"fields": {"request_id": ctx.rid}})
        try:
            await errors.send_error(ctx.send, errors.internal_error(ctx.rid), ctx.rid, api=ctx.api)
        except RuntimeError:
            pass  # the response had started: returning leaves it incomplete, uvicorn closes the connection

    # --- the composition root's handles ---------------------------------------------------------
    def uploads_arriving(self) -> int:
        return self.bodies.uploads_arriving()

    def refuse_uploads(self) -> None:
        self.bodies.refuse_uploads()

    async def close(self) -> None:
        """At shutdown: the engine connections closed, the access log flushed, traces sent."""
        self.pump.pool.close()
        self.publish.access_log.flush()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)
