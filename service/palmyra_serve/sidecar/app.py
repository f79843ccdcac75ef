"""create_app(): the sidecar as one ASGI application.

The control paths (health, readiness, metrics, the engine's own metrics page at
/engine/metrics, the OpenAPI document; routes.CONTROL_PATHS) go to
a small FastAPI app, which also runs the lifespan: the engine session and relay pool, the health
poller and the warmup supervisor. Every other request goes to the raw-ASGI relay (relay/handler.py), which
relays its allow-list (routes.RELAYED) and refuses the rest itself: the hot path pays for no
framework, and nothing outside the allow-list reaches the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from palmyra_serve import __version__
from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.admission.control import AdaptiveAdmission, build_admission, learn_ceiling
from palmyra_serve.sidecar.admission.plan import AdmissionPlan
from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.drain import DrainState
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.core.routes import CONTROL_PATHS, KEYED_CONTROL_PATHS, PROBE_PATHS
from palmyra_serve.sidecar.lifecycle.golden import GoldenReference
from palmyra_serve.sidecar.lifecycle.health import HealthState, poll_engine_health
from palmyra_serve.sidecar.lifecycle.warmup import Supervisor
from palmyra_serve.sidecar.openapi import add_proxied_routes
from palmyra_serve.sidecar.relay.handler import Relay
from palmyra_serve.sidecar.tenants.keys import ApiKeys, credential, validate_engine_key
from palmyra_serve.sidecar.tenants.tenancy import Tenancy
from palmyra_serve.sidecar.tenants.wiring import build_quotas
from palmyra_serve.sidecar.upstream.control import EngineClient, new_session
from palmyra_serve.sidecar.upstream.failures import UPSTREAM_FAILURES
from palmyra_serve.sidecar.upstream.metrics_page import (
    FETCH_TIMEOUT_S,
    MAX_PAGE_BYTES,
    EngineMetricsCache,
    PageResponse,
    engine_fetch,
)

log = logging.getLogger("palmyra.sidecar")

# The engine's page as adaptive admission reads it at start (its ceiling): the same bounds as
# /engine/metrics (metrics_page.py).
ENGINE_METRICS_TIMEOUT_S = FETCH_TIMEOUT_S
ENGINE_METRICS_MAX_BYTES = MAX_PAGE_BYTES


class SidecarState:
    """Everything the routes and background tasks share; lives on app.state.sidecar."""

    def __init__(self, settings: Settings, metrics: SidecarMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.drain_state = DrainState()  # moved only by drain() below; readiness and admission read it
        self.health = HealthState(metrics, settings.liveness_budget_s, drain=self.drain_state)
        self.plan = AdmissionPlan.of(settings)  # the one reading of the admission settings (admission/plan.py)
        self.admission = build_admission(settings, self.plan, self.drain_state)
        metrics.bind_gauges(lambda: self.admission.in_flight, lambda: self.admission.queued)
        metrics.bind_admission(
            lambda: self.admission.limit, lambda: self.admission.ceiling, self.admission.max_queue_wait_s
        )
        if isinstance(self.admission, AdaptiveAdmission):
            self.admission.on_fault = metrics.admission_faults.inc
        validate_engine_key(settings.engine_api_key)  # AuthConfigError: serve() refuses to start
        self.quotas = build_quotas(settings)
        self.quotas.on_remote_error = metrics.quota_store_errors.inc
        if self.quotas.remote is not None:
            metrics.bind_quota_store(lambda: 1.0 if self.quotas.remote_up else 0.0)
        keys = ApiKeys.from_settings(settings)  # AuthConfigError, TenantsFileError: serve() refuses to start
        keys.on_tenants = lambda tenants: metrics.show_tenants(tenants.by_name)
        metrics.show_tenants(keys.tenants.by_name)
        self.tenancy = Tenancy(settings, keys, self.quotas)
        self.relay = Relay(settings, metrics, self.admission, self.tenancy, self.health)
        metrics.bodies_arriving.set_function(self.relay.uploads_arriving)
        # GoldenFileError: serve() refuses to start, naming the file (lifecycle/golden.py).
        self.golden = GoldenReference.load(settings.golden_file) if settings.golden_file else None
        self.session: aiohttp.ClientSession | None = None
        self.engine_metrics: EngineMetricsCache | None = None  # set by the lifespan, with the session

    async def drain(self) -> bool:
        """Turn not-ready, keep serving for the propagation delay, then refuse (503 + Retry-After)
        while listening and wait for in-flight work: the two steps of core/drain.py."""
        self.health.begin_drain()
        if self.settings.drain_propagation_s > 0:
            # Endpoints and gateways still route here for a while: refusing now would fail those requests.
            log.info(
                "not ready; still serving while endpoints stop routing here",
                extra={"fields": {"propagation_s": self.settings.drain_propagation_s}},
            )
            await asyncio.sleep(self.settings.drain_propagation_s)
        log.info("draining", extra={"fields": {"in_flight": self.admission.in_flight, "queued": self.admission.queued}})
        drained = asyncio.ensure_future(self.admission.drain(self.settings.drain_timeout_s))
        await asyncio.sleep(0)  # admission is closed now: a body still arriving could only be refused
        self.relay.refuse_uploads()
        emptied = await drained
        log.info(
            "drained" if emptied else "drain timeout: requests still in flight",
            extra={"fields": {"in_flight": self.admission.in_flight}},
        )
        return emptied


async def read_engine_capacity(state: SidecarState, engine: EngineClient, interval_s: float) -> None:
    """Adaptive admission's ceiling comes from the engine (docs/admission.md): read its /metrics once
    it answers, retrying until then. Nothing to do where the plan's ceiling is not the engine's to
    say (fixed mode, an operator's ceiling)."""
    if not state.plan.ceiling_from_engine:
        return
    while True:
        try:
            asked = {"Accept-Encoding": "identity"}  # the text itself, whatever the session decompresses
            page = await engine.metrics(asked, ENGINE_METRICS_TIMEOUT_S, ENGINE_METRICS_MAX_BYTES)
            if page.status == 200:
                learn_ceiling(state.admission, state.plan, page.body.decode("utf-8", "replace"))
                return
        except UPSTREAM_FAILURES:
            pass  # not up yet: the health poller reports that; try again
        await asyncio.sleep(interval_s)


class SidecarApp:
    """The ASGI entry point: routes the hot path around the framework."""

    def __init__(self, control: FastAPI, state: SidecarState) -> None:
        self.control = control
        self.state = control.state
        self.sidecar = state
        self.relay = state.relay
        self.probe_port = state.settings.probe_port

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self.probe_port and scope["type"] == "http" and _scope_server_port(scope) == self.probe_port:
            if scope["path"] not in PROBE_PATHS:
                await _refuse_off_probe_port(scope, send)
                return
        elif scope["type"] == "http" and scope["path"] not in CONTROL_PATHS:
            await self.relay(scope, receive, send)
            return
        elif scope["type"] == "http" and scope["path"] in KEYED_CONTROL_PATHS and not self._keyed(scope):
            await _refuse_unauthorized(send)
            return
        await self.control(scope, receive, send)

    def _keyed(self, scope: dict) -> bool:
        headers = scope["headers"]
        auth = next((value for name, value in headers if name == b"authorization"), None)
        api_key = next((value for name, value in headers if name == b"x-api-key"), None)
        return self.relay.tenancy.keys.check(credential(auth, api_key))


def _scope_server_port(scope: Mapping[str, Any]) -> int | None:
    server = scope.get("server")
    return server[1] if server else None


async def _refuse_unauthorized(send: Any) -> None:
    await errors.send_error(send, errors.unauthorized(), None)


async def _refuse_off_probe_port(scope: dict, send: Any) -> None:
    # Not counted in palmyra_requests_total: the probe port is not a client door; nothing on it
    # reaches the relay or the engine.
    exc = errors.not_a_probe_path(scope["method"], scope["path"], ", ".join(sorted(PROBE_PATHS)))
    await errors.send_error(send, exc, None, close=True)


def create_app(
    settings: Settings | None = None,
    session: aiohttp.ClientSession | None = None,
    metrics: SidecarMetrics | None = None,
) -> SidecarApp:
    settings = settings or Settings()
    state = SidecarState(settings, metrics or SidecarMetrics())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        own_session = session is None
        state.session = session or new_session(settings.connect_timeout_s, settings.read_timeout_s)
        engine = EngineClient(state.session, settings.engine_url, settings.engine_api_key)
        state.engine_metrics = EngineMetricsCache(
            engine_fetch(engine, lambda: state.admission.queued), settings.retry_after_s
        )
        tasks = [
            asyncio.create_task(poll_engine_health(state.health, engine, settings.health_poll_interval_s)),
            asyncio.create_task(
                Supervisor(
                    settings,
                    state.health,
                    engine,
                    state.metrics,
                    reference=state.golden,
                    # A due golden replay waits for idle capacity: no relayed request holding or awaiting a slot.
                    busy=lambda: state.admission.in_flight + state.admission.queued,
                ).run()
            ),
            asyncio.create_task(read_engine_capacity(state, engine, settings.health_poll_interval_s)),
        ]
        if state.quotas.remote is not None:
            tasks.append(asyncio.create_task(state.quotas.watch()))
        log.info(
            "sidecar started",
            extra={
                "fields": {
                    "version": __version__,
                    "engine_url": settings.engine_url,
                    "auth": state.tenancy.keys.enabled,
                }
            },
        )
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await state.quotas.close()
            # The engine connections closed, the access log flushed, the last requests' spans sent
            # before the process goes (a bounded wait).
            await state.relay.close()
            if own_session:
                await state.session.close()

    control = FastAPI(
        title="palmyra-serve sidecar", version=__version__, lifespan=lifespan, docs_url="/docs", redoc_url=None
    )
    control.state.sidecar = state

    @control.get("/health", summary="Liveness of the engine, as the sidecar judges it")
    async def health() -> JSONResponse:
        live, body = state.health.liveness()
        return JSONResponse(body, status_code=200 if live else 503)

    @control.get("/health/sidecar", summary="Liveness of the sidecar process itself")
    async def sidecar_health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @control.get("/ready", summary="Readiness: warmup done and the engine answers")
    async def ready() -> JSONResponse:
        is_ready, body = state.health.readiness()
        body["model"] = settings.served_model_name
        return JSONResponse(body, status_code=200 if is_ready else 503)

    @control.get("/metrics", summary="Prometheus metrics of the sidecar (per-tenant series on the probe port only)")
    async def metrics_page(request: Request) -> Response:
        # No key: Prometheus sends none. So the client port, which anyone who may send a request
        # reaches, leaves out every family with a `tenant` label (each tenant's name, traffic and
        # refusals); the probe port, which is never published, serves the full page.
        full = bool(settings.probe_port) and _scope_server_port(request.scope) == settings.probe_port
        return Response(state.metrics.page(tenants=full), media_type=CONTENT_TYPE_LATEST)

    @control.get("/engine/metrics", summary="The engine's own Prometheus metrics, from a copy refreshed every 200 ms")
    async def engine_metrics_page() -> Response:
        # No key, like /metrics: it is what Prometheus and the Inference Extension's endpoint
        # picker scrape, and the picker cannot send one. Its cost does not grow with the request
        # rate: one engine render per interval at most, its copies in the memory budget
        # (metrics_page.py). The engine itself listens where only this sidecar reaches it.
        assert state.engine_metrics is not None
        return PageResponse(await state.engine_metrics.page())

    add_proxied_routes(control)
    return SidecarApp(control, state)
