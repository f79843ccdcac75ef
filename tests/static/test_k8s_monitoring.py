"""Monitoring and autoscaling objects of k8s/: the PrometheusRule is the Compose rules file,
dashboards are the Compose dashboard files (the generator writes both copies; the k8s one lives
inside the component's root so plain kustomize loads it), monitors scrape the ports and jobs the
rules expect, and exactly one autoscaler scales, on the sidecars' demand."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import yaml
from test_k8s import K8S, OVERLAYS, REPO, TARGET_IDS, TARGETS, container, one, pod_spec, render

RULES_FILE = REPO / "monitoring" / "prometheus" / "rules" / "palmyra-alerts.yml"
DASHBOARDS = REPO / "monitoring" / "grafana" / "dashboards"
K8S_DASHBOARDS = K8S / "monitoring" / "dashboards"
MONITORED = [name for name in OVERLAYS if name != "cpu"]  # overlays that ship the monitoring component
JOB_MATCHER = re.compile(r'job=~"([^"]+)"')


def _load(name: str, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _generator():
    return _load("render_prometheusrule", K8S / "monitoring" / "render_prometheusrule.py")


def _dashboard_generator():
    return _load("k8s_generate_dashboards", REPO / "monitoring" / "grafana" / "generate_dashboards.py")


def _rules() -> dict:
    if not RULES_FILE.exists():
        pytest.skip(f"{RULES_FILE.relative_to(REPO)} not written yet")
    return yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))


# --- alert rules ---------------------------------------------------------------------------

def test_committed_prometheusrule_is_what_the_generator_writes_now():
    _rules()
    committed = (K8S / "monitoring" / "prometheusrule.yaml").read_text(encoding="utf-8")
    assert committed == _generator().render(RULES_FILE), (
        "k8s/monitoring/prometheusrule.yaml is stale: run python k8s/monitoring/render_prometheusrule.py"
    )


@pytest.mark.parametrize("overlay", MONITORED)
def test_rendered_prometheusrule_groups_equal_the_rules_file(overlay):
    rendered = one(render(overlay), "PrometheusRule")["spec"]["groups"]
    expected = _rules()["groups"]
    assert [g["name"] for g in rendered] == [g["name"] for g in expected]
    for got, want in zip(rendered, expected):
        assert got == want, f"group {want['name']} differs"


def test_generator_check_mode_detects_a_stale_file(tmp_path, monkeypatch):
    _rules()
    generator = _generator()
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text(generator.render(RULES_FILE).replace("palmyra-alerts", "renamed"), encoding="utf-8")
    monkeypatch.setattr(generator, "OUTPUT_FILE", stale)
    assert generator.main(["--check"]) == 1
    monkeypatch.setattr(generator, "OUTPUT_FILE", K8S / "monitoring" / "prometheusrule.yaml")
    assert generator.main(["--check"]) == 0


# --- dashboards ----------------------------------------------------------------------------

def test_every_dashboard_file_is_generated_into_a_configmap():
    """Every generated dashboard becomes a ConfigMap, read from the copy inside the component's
    root (kustomize's default load restrictor refuses ../../monitoring)."""
    root = (K8S / "monitoring").resolve()
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = {
        (root / f.split("=", 1)[-1]).resolve()
        for gen in kustomization.get("configMapGenerator", []) for f in gen.get("files", [])
    }
    assert all(path.is_relative_to(root) for path in listed), f"files outside {root}: {sorted(listed)}"
    assert {p.name for p in listed} == {p.name for p in DASHBOARDS.glob("*.json")}
    assert {p.name for p in listed} == set(_dashboard_generator().DASHBOARDS)


def test_k8s_dashboard_copies_are_the_generators_output():
    generator = _dashboard_generator()
    assert sorted(p.name for p in K8S_DASHBOARDS.glob("*.json")) == sorted(generator.DASHBOARDS)
    for name, build in generator.DASHBOARDS.items():
        committed = (K8S_DASHBOARDS / name).read_text(encoding="utf-8")
        assert committed == generator.render(build), (
            f"k8s/monitoring/dashboards/{name} is stale: run python3 monitoring/grafana/generate_dashboards.py"
        )


def test_dashboard_generator_check_mode_detects_a_stale_k8s_copy(tmp_path, monkeypatch):
    generator = _dashboard_generator()
    assert generator.main(["--check"]) == 0
    stale = tmp_path / "k8s-dashboards"
    stale.mkdir()
    for name, build in generator.DASHBOARDS.items():
        (stale / name).write_text(generator.render(build), encoding="utf-8")
    (stale / "palmyra-engine.json").write_text("{}\n", encoding="utf-8")
    monkeypatch.setattr(generator, "REPO", tmp_path)
    monkeypatch.setattr(generator, "OUT_DIRS", (generator.OUT, stale))
    assert generator.main(["--check"]) == 1


@pytest.mark.parametrize("overlay", MONITORED)
def test_dashboard_configmaps_carry_the_compose_json(overlay):
    maps = [o for o in render(overlay) if o["kind"] == "ConfigMap"
            and o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    rendered = {key: json.loads(text) for m in maps for key, text in m["data"].items()}
    expected = {p.name: json.loads(p.read_text(encoding="utf-8")) for p in DASHBOARDS.glob("*.json")}
    assert rendered == expected


# --- scraping ------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", MONITORED)
def test_monitors_scrape_the_named_ports_under_the_jobs_the_rules_expect(overlay):
    objects = render(overlay)
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    service = one(objects, "Service", "palmyra-serve")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    sidecar_job = next(r["replacement"] for r in endpoint["relabelings"] if r.get("targetLabel") == "job")

    pod_monitor = one(objects, "PodMonitor")
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    [pod_endpoint] = pod_monitor["spec"]["podMetricsEndpoints"]
    engine_ports = {p["name"]: p["containerPort"] for p in container(pod_spec(objects), "engine")["ports"]}
    assert engine_ports[pod_endpoint["port"]] == 8000
    assert not any(r.get("targetLabel") == "job" for r in pod_endpoint.get("relabelings", []))
    engine_job = f"some-namespace/{pod_monitor['metadata']['name']}"  # the operator's PodMonitor job

    matchers = {m for group in _rules()["groups"] for rule in group["rules"]
                for m in JOB_MATCHER.findall(str(rule["expr"]))}
    assert matchers, "the rules file no longer selects jobs: update this test"
    for matcher in matchers:
        assert any(re.fullmatch(matcher, job) for job in (sidecar_job, engine_job)), matcher
    for job in (sidecar_job, engine_job):
        assert any(re.fullmatch(m, job) for m in matchers), f"no rule watches job {job}"


# --- autoscaling ---------------------------------------------------------------------------

@pytest.mark.parametrize(("overlay", "components"), TARGETS, ids=TARGET_IDS)
def test_exactly_one_autoscaler_scales_on_the_sidecars_demand(overlay, components):
    objects = render(overlay, components)
    hpas = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    scaled = [o for o in objects if o["kind"] == "ScaledObject"]
    assert len(hpas) + len(scaled) == 1, "two autoscalers on one Deployment fight over replicas"
    if scaled:
        spec = scaled[0]["spec"]
        assert spec["scaleTargetRef"]["name"] == "palmyra-serve"
        assert spec["minReplicaCount"] >= 1
        [trigger] = spec["triggers"]
        assert trigger["type"] == "prometheus"
        assert trigger["metadata"]["serverAddress"].startswith("http://")
        # vLLM's queue stays empty while the sidecar holds it: the signal is the sidecar's
        # (its query and metrics are checked in test_autoscaling.py).
        assert "palmyra_concurrency_limit" in trigger["metadata"]["query"]
        assert float(trigger["metadata"]["threshold"]) > 0
    else:
        spec = hpas[0]["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "palmyra-serve"}
        [metric] = spec["metrics"]
        # prometheus-adapter computes it from the sidecars' series (docs/autoscaling.md).
        assert metric["type"] == "External"
        assert metric["external"]["metric"]["name"] == "palmyra_replica_demand"


def test_overlays_with_monitoring_also_autoscale_with_keda():
    for overlay in MONITORED:
        kinds = {o["kind"] for o in render(overlay)}
        assert {"ScaledObject", "ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds, overlay
    # The CPU overlay stays on built-in kinds, so it applies to a bare kind/minikube cluster.
    assert {o["apiVersion"].split("/")[0] for o in render("cpu")} <= {"v1", "apps", "policy", "autoscaling",
                                                                    "networking.k8s.io"}
