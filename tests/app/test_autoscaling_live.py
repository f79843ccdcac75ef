"""The autoscaling signal, proven live: a real Prometheus scrapes a real sidecar (in front of the
FAKE engine, whose per-request time is known, so the replica's capacity is known) every second,
while closed-loop clients load it at 0, 1x and 2x that capacity. The KEDA trigger's query, read
from the rendered ScaledObject (not copied), is evaluated through Prometheus' HTTP API, and the
replica count KEDA's HPA would compute from it must hold at 1x, at least double at 2x, and be the
minimum once a whole window has passed without load (measured after the load, so the same window
shows it forgets the load; an idle window before it would cost 30 s more). The
prometheus-adapter rule in docs/autoscaling.md (the HPA alternative) must give the same value.

Capacity: PALMYRA_MAX_IN_FLIGHT=4, each request a stream of 4 chunks 0.3 s apart ("fake:slow"):
4 clients keep the replica full without queuing (1x), 8 clients keep 4 in flight and 4 queued (2x).
"""

from __future__ import annotations

import functools
import math
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helpers import kustomize, procs
from tests.helpers.load import ClosedLoop
from tests.helpers.modules import load_module
from tests.helpers.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
LIMIT = 4  # PALMYRA_MAX_IN_FLIGHT of the sidecar under test
JOB = "palmyra-sidecar"
HPA_TOLERANCE = 0.1  # kube-controller-manager's default --horizontal-pod-autoscaler-tolerance


local_prometheus = load_module("palmyra_local_prometheus_autoscaling", REPO / "monitoring" / "local_prometheus.py")


@functools.cache
def rendered_scaledobject() -> dict:
    """The ScaledObject as a cluster receives it: an overlay with the KEDA component added, as an
    operator's own overlay adds it, rendered by kubectl."""
    k8s = REPO / "k8s"
    with tempfile.TemporaryDirectory(prefix="palmyra-keda-") as tmp:
        kustomize.write_stack(Path(tmp), k8s / "overlays" / "nvidia", [k8s / "components" / "autoscaling-keda"])
        out = subprocess.run(["kubectl", "kustomize", tmp], capture_output=True, text=True, check=True).stdout
    [scaled] = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "ScaledObject"]
    return scaled


def adapter_query(job: str) -> str:
    """The prometheus-adapter externalRules metricsQuery from docs/autoscaling.md, with the label
    matchers the adapter would insert for the HPA's selector (job) filled in."""
    text = (REPO / "docs" / "autoscaling.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if "externalRules" in b]
    assert len(blocks) == 1, "docs/autoscaling.md: one yaml block with the adapter's externalRules"
    [rule] = yaml.safe_load(blocks[0])["externalRules"]
    return rule["metricsQuery"].replace("<<.LabelMatchers>>", f'job="{job}"')


def keda_replicas(value: float, target: float, lo: int, hi: int) -> int:
    """What the HPA behind a ScaledObject asks for with an AverageValue metric: ceil(value / target),
    clamped to [minReplicaCount, maxReplicaCount]."""
    return max(lo, min(hi, math.ceil(value / target)))


def hpa_replicas(value: float, target: float, current: int, lo: int, hi: int) -> int:
    """The same, with the HPA's tolerance: no change while value is within 10% of target x current."""
    if current and abs(value / (target * current) - 1.0) <= HPA_TOLERANCE:
        return current
    return keda_replicas(value, target, lo, hi)


# A streamed request the fake engine answers slowly: each client holds one slot for its duration.
SLOW = {"model": "palmyra-mini", "prompt": "fake:slow", "max_tokens": 4, "stream": True}


@pytest.fixture(scope="module")
def module_log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("autoscaling")


@pytest.fixture(scope="module")
def sidecar(module_log_dir: Path) -> Iterator[procs.Server]:
    # Fixed mode: the test needs a capacity it knows (the adaptive limit would move with the fake's latency).
    env = {
        "PALMYRA_ADMISSION_MODE": "fixed",
        "PALMYRA_MAX_IN_FLIGHT": str(LIMIT),
        "PALMYRA_MAX_QUEUE": "32",
        "PALMYRA_QUEUE_TIMEOUT_S": "60",
        "PALMYRA_CANARY_INTERVAL_S": "5",
        "PALMYRA_HEALTH_POLL_INTERVAL_S": "0.5",
    }
    with (
        procs.fake_engine(module_log_dir) as engine,
        procs.sidecar(engine.url, module_log_dir, extra_env=env, timeout_s=30, probe=True) as server,
    ):
        yield server


@pytest.fixture(scope="module")
def prom(sidecar: procs.Server) -> Iterator[object]:
    base = yaml.safe_load((REPO / "monitoring" / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    # The sidecar job as deployed: its probe port's page, under the client address as `instance`.
    targets = local_prometheus.scrape_targets([f"127.0.0.1:{sidecar.port}"], probes=[f"127.0.0.1:{sidecar.probe_port}"])
    cfg = local_prometheus.render_config(base, {JOB: targets[JOB]}, scrape_interval="1s")
    with local_prometheus.LocalPrometheus(cfg) as p:
        wait_until(lambda: p.targets_up().get(JOB), 30, "the sidecar scraped")
        yield p


def scalar(prom, expr: str) -> float | None:
    body = prom.query(expr)
    assert body["status"] == "success", f"{expr}: {body.get('error')}"
    result = body["data"]["result"]
    assert len(result) <= 1, f"{expr}: KEDA needs one series, got {result}"
    return float(result[0]["value"][1]) if result else None


def window_saw(prom, expr: str) -> bool:
    """True when a 0/1 condition over the last 30 s (the query's window) holds."""
    return scalar(prom, expr) == 1.0


def test_trigger_query_scales_with_demand(sidecar: procs.Server, prom) -> None:
    scaled = rendered_scaledobject()
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    query = trigger["metadata"]["query"]
    target = float(trigger["metadata"]["threshold"])
    lo, hi = scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]
    adapter = adapter_query(JOB)
    sel = f'{{job="{JOB}"}}'
    measured: dict[str, tuple[float, int, int]] = {}

    def measure(level: str, current: int) -> float:
        value = scalar(prom, query)
        assert value is not None, "empty answer: KEDA (ignoreNullValues false) would error, not scale"
        via_adapter = scalar(prom, adapter)
        assert via_adapter is not None and via_adapter == pytest.approx(value, abs=0.05), (value, via_adapter)
        measured[level] = (value, keda_replicas(value, target, lo, hi), hpa_replicas(value, target, current, lo, hi))
        print(f"autoscaling {level}: value={value:.3f} keda={measured[level][1]} hpa={measured[level][2]}")
        return value

    with ClosedLoop(sidecar.url, LIMIT, SLOW, timeout_s=60) as one_x:
        # 1x: the replica was full for the whole window (a scrape may catch one slot between requests).
        wait_until(
            lambda: window_saw(prom, f"min_over_time(palmyra_in_flight_requests{sel}[30s]) >= bool {LIMIT - 1}"),
            90,
            "a full window at 1x load",
        )
        queued = scalar(prom, f"max_over_time(palmyra_queued_requests{sel}[30s])")
        assert queued is not None and queued <= 1, queued
        measure("1x", 1)
    assert set(one_x.statuses) == {200}, set(one_x.statuses)
    assert measured["1x"][1] == 1 and measured["1x"][2] == 1  # holds: one replica full is what it should have

    with ClosedLoop(sidecar.url, 2 * LIMIT, SLOW, timeout_s=60) as two_x:
        # 2x: the window saw the replica full and the queue holding the other half.
        wait_until(
            lambda: (
                window_saw(prom, f"min_over_time(palmyra_in_flight_requests{sel}[30s]) >= bool {LIMIT - 1}")
                and window_saw(prom, f"min_over_time(palmyra_queued_requests{sel}[30s]) >= bool {LIMIT - 2}")
            ),
            90,
            "a full window at 2x load",
        )
        measure("2x", 1)
    assert set(two_x.statuses) == {200}, set(two_x.statuses)
    assert measured["2x"][1] >= 2 * measured["1x"][1]
    assert measured["2x"][2] >= 2 * measured["1x"][2]

    # Idle: once a whole window of samples holds no load (nothing in flight or queued, nothing
    # refused), the minimum.
    wait_until(
        lambda: (
            window_saw(prom, f"max_over_time(palmyra_in_flight_requests{sel}[30s]) == bool 0")
            and window_saw(prom, f"count_over_time(palmyra_in_flight_requests{sel}[30s]) >= bool 20")
        ),
        90,
        "a window without load",
    )
    measure("idle", 2)
    assert measured["idle"][1] == lo


def test_every_selector_of_the_query_has_series_from_the_real_sidecar(sidecar: procs.Server, prom) -> None:
    """Each selector of the trigger's query (metric name and label values) matches series Prometheus
    scraped from the real sidecar process, and its /metrics names every metric: a renamed metric
    or reason would leave the query silently at 0."""
    query = rendered_scaledobject()["spec"]["triggers"][0]["metadata"]["query"]
    selectors = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*\{[^}]*\}", query)
    assert len(selectors) >= 4, selectors
    exposition = httpx.get(f"{sidecar.url}/metrics", timeout=10).text
    for selector in selectors:
        assert re.search(rf"^{re.escape(selector.split('{')[0])}[{{ ]", exposition, re.MULTILINE), selector
        wait_until(functools.partial(scalar, prom, f"count({selector})"), 30, f"series for {selector}")
    listed = re.search(r'reason=~"([^"]+)"', query)
    assert listed, query
    reasons = listed.group(1).split("|")
    assert scalar(prom, f'count(palmyra_rejections_total{{job="{JOB}",reason=~"{"|".join(reasons)}"}})') == len(reasons)
