"""memory_budget.py: the sidecar's worst-case memory. It fits the sidecar container's limit for
the settings k8s/base deploys, counts the requests each admission mode lets in, and has a term for
every per-request buffer, the engine-metrics copies and the largest page the control app writes."""

from __future__ import annotations

import json

from prometheus_client import generate_latest

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar import memory_budget
from palmyra_serve.sidecar.app import create_app
from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.core.routes import ROUTE_LABELS
from palmyra_serve.sidecar.upstream import metrics_page
from tests.helpers import deployed


def test_the_worst_case_memory_fits_the_sidecar_container():
    """The settings k8s/base deploys (its ConfigMap, the sidecar's env and flags) against the
    sidecar's limit there; tests/static/test_k8s.py checks every overlay the same way."""
    deployment = deployed.base_deployment()
    limit = memory_budget.container_limit(deployment, "sidecar")
    settings = deployed.sidecar_settings(deployed.base_config(), deployed.containers(deployment)["sidecar"])
    assert settings.admission_mode == "adaptive" and settings.probe_port, "what the deployment runs"
    worst = memory_budget.worst_case(settings)
    assert worst <= limit, f"worst case {worst / 2**20:.0f} MiB > limit {limit / 2**20:.0f} MiB"
    # The sum is of the enforced limits: raising one of them moves it.
    bigger = settings.model_copy(update={"max_body_bytes": 4 * 2**20})
    assert memory_budget.worst_case(bigger) > limit, "the issue's 4 MiB bodies must not fit"
    assert memory_budget.quantity_bytes("512Mi") == 512 * 2**20 and memory_budget.quantity_bytes("1G") == 10**9


def test_the_budget_counts_the_requests_each_admission_mode_lets_in():
    fixed = Settings(_env_file=None, admission_mode="fixed", max_in_flight=10, max_queue=5, max_connections=100)
    assert memory_budget.in_flight(fixed) == 10 and memory_budget.relays(fixed) == 10
    assert memory_budget.body_budget(fixed) == 15 * fixed.max_body_bytes
    # Adaptive admits up to its ceiling (vLLM's max-num-seqs unless set), and does not gate the
    # requests that generate nothing: every connection may be relaying one.
    cpu = Settings(_env_file=None, platform="cpu", max_in_flight=10, max_connections=100)
    assert memory_budget.in_flight(cpu) == 128 and memory_budget.relays(cpu) == 100
    accelerator = Settings(_env_file=None, platform="ascend")
    assert memory_budget.in_flight(accelerator) == 256
    assert memory_budget.in_flight(cpu.model_copy(update={"engine_extra_args": "--max-num-seqs 32"})) == 32
    assert memory_budget.in_flight(cpu.model_copy(update={"admission_max_limit": 7})) == 7
    assert memory_budget.worst_case(accelerator) > memory_budget.worst_case(cpu)


def test_every_per_request_buffer_is_in_the_budget():
    """Each buffer a relayed request may hold is a term, counted once per request that holds it."""
    from palmyra_serve.sidecar.upstream import pool

    assert memory_budget.ERROR_PATH_BYTES <= memory_budget.RELAY_BYTES, "an error body is read instead of a stream"
    settings = Settings(_env_file=None, platform="cpu")
    rows = {t.what.split(":")[0]: t for t in memory_budget.terms(settings)}
    assert rows["relay buffers"].count == memory_budget.relays(settings)
    assert rows["engine connections' kernel receive buffers"].each == pool.RCVBUF_CHARGED
    assert rows["accounting"].count == memory_budget.in_flight(settings)


def test_the_budget_counts_the_metrics_copies_and_the_control_pages():
    settings = Settings(_env_file=None, auth_disabled=True)
    terms = {t.what: t for t in memory_budget.terms(settings)}
    page = next(t for what, t in terms.items() if "metrics page" in what)
    assert page.total == metrics_page.PAGE_COPIES * metrics_page.MAX_PAGE_BYTES
    # The largest page the control app writes whole: the sidecar's /metrics with a series for
    # every route and every status an engine may answer, and the API document.
    metrics = SidecarMetrics()
    for route in ROUTE_LABELS:
        for status in range(100, 1000):
            metrics.count_request(route, status)
    for code in (*errors.FRONT_END_CODES, *errors.REJECTION_CODES):
        metrics.reject(code)
    biggest = len(generate_latest(metrics.registry))
    document = len(json.dumps(create_app(settings).control.openapi()))
    print(
        f"sidecar /metrics with every status series: {biggest / 1024:.0f} KiB; API document {document / 1024:.0f} KiB"
    )
    assert max(biggest, document, 2 * metrics_page.SLICE_BYTES) <= memory_budget.CONTROL_PAGE_BYTES
    # In adaptive mode every connection is counted as relaying, with buffers larger than a page.
    assert memory_budget.RELAY_BYTES >= memory_budget.CONTROL_PAGE_BYTES
    assert memory_budget.non_relaying(settings) == 0
    fixed = Settings(_env_file=None, auth_disabled=True, admission_mode="fixed", max_in_flight=10, max_connections=100)
    assert memory_budget.non_relaying(fixed) == 90
