"""The sidecar's Prometheus instruments, on an injectable registry.

Engine metrics stay on the engine's own /metrics; Prometheus scrapes both. Label values come from
small fixed sets (routes.py's route labels, errors.py's codes), so cardinality cannot grow with traffic.

Two views of one registry: the full page, served on the probe port (the operator's, never published),
and the client port's, which leaves out every family with a `tenant` label (ClientView): the client
port asks no key for /metrics, and which tenants exist and how much each asks for is not the
business of whoever can reach it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from palmyra_serve import __version__
from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.routes import ROUTE_LABELS

# Label values are error codes (errors.py): a rejection's reason and an upstream failure's kind
# are the `code` of the error the client got.
REJECTION_REASONS: tuple[str, ...] = errors.REJECTION_CODES
UPSTREAM_ERROR_KINDS: tuple[str, ...] = errors.UPSTREAM_CODES
RECLAIMED_KINDS = ("anonymous", "authenticated")
PHASES = ("waiting_for_engine", "warming_up", "ready", "not_ready", "draining")
# The phases of a start-up to ready (lifecycle/warmup.py): their sum is the time to ready.
STARTUP_PHASES = ("engine_up", "warmup")

# The label that makes a family the operator's only (ClientView).
TENANT_LABEL = "tenant"

# LLM-sized buckets: a first token in milliseconds, a long generation in minutes.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class TenantLimits(Protocol):
    """What the metrics show of a tenant (tenants/config.py's TenantSpec)."""

    @property
    def requests_per_minute(self) -> int | None: ...

    @property
    def tokens_per_minute(self) -> int | None: ...

    @property
    def max_concurrent(self) -> int | None: ...


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        disable_created_metrics()  # *_created series double the page and no dashboard reads them
        self.registry = registry if registry is not None else CollectorRegistry()
        self.client_view = ClientView(self.registry)
        r = self.registry
        self.requests = Counter(
            "palmyra_requests",
            "Client requests relayed or answered, by route and HTTP status.",
            ["route", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "palmyra_request_duration_seconds",
            "End-to-end request duration seen by the client.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "palmyra_time_to_first_token_seconds",
            "Time from request arrival to the first response body byte sent to the client.",
            ["route"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "palmyra_inter_token_latency_seconds",
            "Mean gap between the token events of one choice of a stream (one observation per stream).",
            ["route"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.output_tokens = Counter(
            "palmyra_output_tokens",
            "Generated tokens relayed (engine usage when reported, else text-bearing stream events).",
            ["route"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "palmyra_prompt_tokens", "Prompt tokens, from the engine's usage reports.", ["route"], registry=r
        )
        self.in_flight = Gauge("palmyra_in_flight_requests", "Requests currently relayed to the engine.", registry=r)
        self.queued = Gauge("palmyra_queued_requests", "Requests waiting for an admission slot.", registry=r)
        self.bodies_arriving = Gauge(
            "palmyra_request_bodies_arriving",
            "Requests whose body is still arriving (slow uploads; each under the body deadline).",
            registry=r,
        )
        # What one replica admits to the engine at once (the adaptive limit, or max_in_flight in
        # fixed mode): the autoscaler divides demand by it (docs/autoscaling.md, docs/admission.md).
        self.concurrency_limit = Gauge(
            "palmyra_concurrency_limit", "Requests this replica admits to the engine at once.", registry=r
        )
        self.concurrency_ceiling = Gauge(
            "palmyra_concurrency_ceiling",
            "Highest the concurrency limit may go (from the engine at start, or the operator's setting).",
            registry=r,
        )
        self.queue_max_wait = Gauge(
            "palmyra_queue_max_wait_seconds",
            "Longest a request may wait for a slot now (adaptive: what the TTFT SLO leaves).",
            registry=r,
        )
        self.queue_wait = Histogram(
            "palmyra_queue_wait_seconds",
            "Wait for an admission slot of every request admitted (0 when a slot was free).",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.rejections = Counter(
            "palmyra_rejections", "Requests the sidecar refused, by reason (the error code).", ["reason"], registry=r
        )
        self.admission_faults = Counter(
            "palmyra_admission_faults",
            "Faults inside adaptive admission's learning; each left the limit where it was (a bug to report).",
            registry=r,
        )
        self.internal_errors = Counter(
            "palmyra_internal_errors",
            "Requests the sidecar's own code failed (a bug to report); several in a row turn the replica not ready.",
            registry=r,
        )
        # The connection cap (edge/protocol.py): idle connections closed to admit a new one.
        self.connections_reclaimed = Counter(
            "palmyra_connections_reclaimed",
            "Idle client connections closed at the connection cap to admit a new one, by whether one of their"
            " requests had passed the key check.",
            ["kind"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "palmyra_upstream_errors", "Failures talking to the engine, by kind (the error code).", ["kind"], registry=r
        )
        self.ready = Gauge(
            "palmyra_ready", "1 when this replica is ready for traffic (warmup done, engine answers).", registry=r
        )
        self.engine_live = Gauge(
            "palmyra_engine_live", "1 while the engine is judged alive (not dead, not hung).", registry=r
        )
        self.phase = Gauge(
            "palmyra_warmup_phase", "1 for the current readiness phase, 0 for the others.", ["phase"], registry=r
        )
        self.warmup_duration = Gauge(
            "palmyra_warmup_duration_seconds", "Duration of the last successful warmup.", registry=r
        )
        self.warmup_runs = Counter("palmyra_warmup_runs", "Warmup attempts by outcome.", ["outcome"], registry=r)
        # No child until a start-up has finished: before the first ready there is no figure, and an
        # empty panel must look empty (not 0 s).
        self.startup_phase = Gauge(
            "palmyra_startup_phase_seconds",
            "Seconds each phase of the last start-up to ready took (engine_up: from the sidecar's start, or"
            " readiness lost, to the engine serving the model; warmup: from then to ready). Sum: time to ready.",
            ["phase"],
            registry=r,
        )
        self.canary_latency = Histogram(
            "palmyra_canary_latency_seconds",
            "Latency of the idle one-token canary.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.canary_failures = Counter(
            "palmyra_canary_failures", "Canary generations that failed or timed out.", registry=r
        )
        self.stand_in = Gauge(
            "palmyra_stand_in_weights", "1 when the engine serves random stand-in weights.", registry=r
        )
        # The golden check (lifecycle/golden.py), only with PALMYRA_GOLDEN_FILE: replays of the
        # reference's prompts by verdict, and what the last one found.
        self.golden_checks = Counter(
            "palmyra_golden_checks",
            "Replays of the golden reference's prompts, by verdict (agree, drift, error).",
            ["verdict"],
            registry=r,
        )
        self.golden_agreement = Gauge(
            "palmyra_golden_agreement_ratio",
            "Share of the compared positions whose token was the reference's, in the last golden check.",
            registry=r,
        )
        self.golden_drift = Gauge(
            "palmyra_golden_output_drift", "1 when the last golden check found output drift.", registry=r
        )
        Gauge("palmyra_build_info", "palmyra-serve version.", ["version"], registry=r).labels(__version__).set(1)

        # Per tenant (docs/tenants.md): the `tenant` label takes only names from the tenants file
        # and `default`, so the series are bounded by the file, whatever clients send.
        self.tenant_requests = Counter(
            "palmyra_tenant_requests",
            "Requests of each tenant that passed the key check, by HTTP status.",
            ["tenant", "status"],
            registry=r,
        )
        self.tenant_tokens = Counter(
            "palmyra_tenant_tokens",
            "Tokens of each tenant's generations, by kind (prompt, completion), as the engine counted them.",
            ["tenant", "kind"],
            registry=r,
        )
        self.tenant_refusals = Counter(
            "palmyra_tenant_refusals",
            "Each tenant's requests the sidecar refused, by reason (the error code).",
            ["tenant", "reason"],
            registry=r,
        )
        # Registered only when a shared store is configured (bind_quota_store): absent otherwise,
        # rather than a 0 that would read as "the store is down".
        self.quota_store_up = Gauge(
            "palmyra_quota_store_up",
            "1 while the shared quota store (Redis) answers; 0 while this replica enforces its share of every "
            "tenant limit alone. Absent without a shared store.",
            registry=None,
        )
        self.tenant_limit = Gauge(
            "palmyra_tenant_limit",
            "Each tenant's limits as the tenants file sets them (requests_per_minute, tokens_per_minute, "
            "max_concurrent per replica); absent for a limit the tenant does not have.",
            ["tenant", "limit"],
            registry=r,
        )
        self.quota_store_errors = Counter(
            "palmyra_quota_store_errors",
            "Quota calls to the shared store (Redis) that failed or timed out.",
            registry=r,
        )

        # Pre-create every child so each series exists from the first scrape and the hot path does
        # no label lookups for these.
        for route in ROUTE_LABELS:
            self.duration.labels(route)
            self.ttft.labels(route)
            self.itl.labels(route)
            self.output_tokens.labels(route)
            self.prompt_tokens.labels(route)
        for reason in REJECTION_REASONS:
            self.rejections.labels(reason)
        for kind in UPSTREAM_ERROR_KINDS:
            self.upstream_errors.labels(kind)
        for kind in RECLAIMED_KINDS:
            self.connections_reclaimed.labels(kind)
        for outcome in ("success", "failure"):
            self.warmup_runs.labels(outcome)
        for verdict in ("agree", "drift", "error"):
            self.golden_checks.labels(verdict)
        self._request_children: dict[tuple[str, int], Counter] = {}
        self._tenant_children: dict[tuple[str, int], Counter] = {}
        self._tenant_token_children: dict[tuple[str, str], Counter] = {}

    def page(self, *, tenants: bool) -> bytes:
        """The exposition page: every family (tenants=True, the probe port's), or the client port's
        without the per-tenant families."""
        return generate_latest(self.registry if tenants else self.client_view)

    def reject(self, code: str) -> None:
        """Count a refusal under its error code (codes come from errors.py's fixed constructors)."""
        self.rejections.labels(code).inc()

    def upstream_error(self, code: str) -> None:
        self.upstream_errors.labels(code).inc()

    def count_request(self, route: str, status: int) -> None:
        child = self._request_children.get((route, status))
        if child is None:
            child = self._request_children[(route, status)] = self.requests.labels(route, str(status))
        child.inc()

    def count_tenant(self, tenant: str, status: int, prompt: int | None, completion: int | None) -> None:
        child = self._tenant_children.get((tenant, status))
        if child is None:
            child = self._tenant_children[(tenant, status)] = self.tenant_requests.labels(tenant, str(status))
        child.inc()
        if prompt:
            self._tokens_child(tenant, "prompt").inc(prompt)
        if completion:
            self._tokens_child(tenant, "completion").inc(completion)

    def _tokens_child(self, tenant: str, kind: str) -> Counter:
        child = self._tenant_token_children.get((tenant, kind))
        if child is None:
            child = self._tenant_token_children[(tenant, kind)] = self.tenant_tokens.labels(tenant, kind)
        return child

    def _drop_tenants_except(self, names: set[str]) -> None:
        for counter in (self.tenant_requests, self.tenant_tokens, self.tenant_refusals):
            # prometheus_client keeps a metric's children by label values; the tenant is the first.
            for labels in [key for key in counter._metrics if key[0] not in names]:
                counter.remove(*labels)
        self._tenant_children = {k: v for k, v in self._tenant_children.items() if k[0] in names}
        self._tenant_token_children = {k: v for k, v in self._tenant_token_children.items() if k[0] in names}

    def tenant_refusal(self, tenant: str, code: str) -> None:
        self.tenant_refusals.labels(tenant, code).inc()

    def bind_quota_store(self, up: Callable[[], float]) -> None:
        """The shared quota store's state, read at scrape time (only when one is configured)."""
        self.quota_store_up.set_function(up)
        self.registry.register(self.quota_store_up)

    def show_tenants(self, tenants: Mapping[str, TenantLimits]) -> None:
        """The tenants file's limits as gauges, and every tenant's token series from 0 (so that the
        first request's tokens count in increase()); called at start and on every reload, which also
        drops every series of a tenant the file no longer names: /metrics stays bounded by the
        current file."""
        self.tenant_limit.clear()
        self._drop_tenants_except(set(tenants))
        for name, spec in tenants.items():
            for limit in ("requests_per_minute", "tokens_per_minute", "max_concurrent"):
                value = getattr(spec, limit)
                if value:
                    self.tenant_limit.labels(name, limit).set(value)
            for kind in ("prompt", "completion"):
                self.tenant_tokens.labels(name, kind)

    def bind_phase(self, current: Callable[[], str]) -> None:
        """The readiness phase, read at scrape time (the one /ready shows: see lifecycle/health.py)."""
        for phase in PHASES:
            self.phase.labels(phase).set_function(_is_phase(current, phase))

    def record_startup(self, seconds: dict[str, float]) -> None:
        """The phases of a start-up that just reached ready (keys: STARTUP_PHASES)."""
        for phase in STARTUP_PHASES:
            self.startup_phase.labels(phase).set(seconds[phase])

    def bind_gauges(self, in_flight: Callable[[], float], queued: Callable[[], float]) -> None:
        """Read admission counters at scrape time, so the hot path never touches these gauges."""
        self.in_flight.set_function(in_flight)
        self.queued.set_function(queued)

    def bind_admission(
        self, limit: Callable[[], float], ceiling: Callable[[], float], max_wait: Callable[[], float]
    ) -> None:
        """The limit, its ceiling and the queue's current wait bound, read at scrape time."""
        self.concurrency_limit.set_function(limit)
        self.concurrency_ceiling.set_function(ceiling)
        self.queue_max_wait.set_function(max_wait)


class ClientView(Collector):
    """The registry without every family that carries a `tenant` label, rendered by prometheus_client's
    own exposition (generate_latest takes any collector). A family is left out whole (HELP and TYPE
    too) when its collector declares the label, whether or not it has a series yet; a family of some
    other collector is left out when any of its samples carries the label. Per scrape this costs a
    pass over the collectors' label names and the samples the page renders anyway."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        hidden = tenant_families(self.registry)
        for family in self.registry.collect():
            if family.name in hidden or any(TENANT_LABEL in sample.labels for sample in family.samples):
                continue
            yield family


def tenant_families(registry: CollectorRegistry) -> set[str]:
    """The names of the families whose collector declares a `tenant` label. prometheus_client has no
    public accessor for a collector's label names; _collector_to_names and _labelnames have been
    stable across its releases (tests/static/test_contract.py reads them too), and a unit test
    fails if they stop naming the tenant families."""
    # list(): a snapshot, as registry.collect() takes one, should a collector register meanwhile.
    collectors = list(registry._collector_to_names.items())
    return {
        name
        for collector, names in collectors
        if TENANT_LABEL in getattr(collector, "_labelnames", ())
        for name in (*names, getattr(collector, "_name", ""))
    }


def _is_phase(current: Callable[[], str], phase: str) -> Callable[[], float]:
    return lambda: 1.0 if current() == phase else 0.0
