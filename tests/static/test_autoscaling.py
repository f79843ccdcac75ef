"""The autoscaling signal's manifests, checked with real tools: the ScaledObject against KEDA's CRD
(strict), the HPA alternative with kubernetes-validate, the trigger's PromQL with promtool (parsed,
then evaluated by promtool's rule tests on synthetic replicas), every metric and label value it
names against the sidecar's own exposition, and the prometheus-adapter rule in
docs/autoscaling.md against the trigger. Each check is run once on a broken copy to see it fail.
The live proof under load is tests/app/test_autoscaling_live.py."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.app import SidecarState
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from tests.helpers.k8s_manifests import K8S_VERSIONS, REPO, hpa, scaledobject

# A selector in PromQL: a metric name followed by its label braces.
SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def trigger_query(scaled: dict) -> str:
    [trigger] = scaled["spec"]["triggers"]
    return trigger["metadata"]["query"]


def sidecar_exposition() -> dict[str, list[dict[str, str]]]:
    """sample name -> label sets, from the sidecar's registry with its gauges bound the way the app
    binds them (SidecarState), rendered by prometheus_client's exposition code."""
    metrics = SidecarMetrics()
    SidecarState(Settings(auth_disabled=True), metrics)
    samples: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
    return samples


def missing_from_exposition(query: str, exposition: dict[str, list[dict[str, str]]]) -> list[str]:
    """Metric names, and label values of equality/regex matchers (other than job), that the
    query selects but the sidecar does not export."""
    missing = []
    selectors = SELECTOR.findall(query)
    assert selectors, f"no selector found in {query!r}"
    for name, matchers in selectors:
        if name not in exposition:
            missing.append(name)
            continue
        for label, op, value in MATCHER.findall(matchers):
            if label == "job" or op not in ("=", "=~"):
                continue  # job is the scrape job's, not the sidecar's
            have = {labels.get(label) for labels in exposition[name]}
            for wanted in value.split("|") if op == "=~" else [value]:
                if wanted not in have:
                    missing.append(f'{name}{{{label}="{wanted}"}}')
    return missing


def promtool_parse(query: str, tmp_path: Path) -> subprocess.CompletedProcess:
    rules = {"groups": [{"name": "autoscaling", "rules": [{"record": "palmyra:replica_demand", "expr": query}]}]}
    path = tmp_path / "autoscaling-rules.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    return subprocess.run(["promtool", "check", "rules", str(path)], check=False, capture_output=True, text=True)


def adapter_metrics_query() -> str:
    text = (REPO / "docs" / "autoscaling.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if "externalRules" in b]
    assert len(blocks) == 1, "docs/autoscaling.md: one yaml block with the adapter's externalRules"
    [rule] = yaml.safe_load(blocks[0])["externalRules"]
    assert rule["name"]["as"] == hpa()["spec"]["metrics"][0]["external"]["metric"]["name"]
    return rule["metricsQuery"]


def normalized(promql: str) -> str:
    return re.sub(r"\s+", "", promql)


# --- schemas ---------------------------------------------------------------------------------


def test_scaledobject_is_valid_for_kedas_crd_and_a_fault_is_not(crd_validators):
    scaled = scaledobject()
    validator = crd_validators[(scaled["apiVersion"], "ScaledObject")]
    assert not [e.message for e in validator.iter_errors(scaled)]
    broken = copy.deepcopy(scaled)
    broken["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]["stabilisationWindowSeconds"] = (
        60
    )
    assert list(validator.iter_errors(broken)), "a misspelled behaviour field passed the CRD"
    broken = copy.deepcopy(scaled)
    broken["spec"]["triggers"][0]["metadata"]["threshold"] = 1  # trigger metadata is map[string]string
    assert list(validator.iter_errors(broken)), "a non-string threshold passed the CRD"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_hpa_alternative_is_valid_kubernetes_and_a_fault_is_not(version):
    obj = hpa()
    kubernetes_validate.validate(obj, version, strict=True)
    broken = copy.deepcopy(obj)
    broken["spec"]["metrics"][0]["external"]["target"]["averageValues"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


# --- the query -------------------------------------------------------------------------------


def test_trigger_query_parses_and_a_broken_one_does_not(tmp_path):
    query = trigger_query(scaledobject())
    ok = promtool_parse(query, tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = promtool_parse(query.rstrip().removesuffix(")"), tmp_path)
    assert bad.returncode != 0, "promtool accepted a query with an unbalanced parenthesis"


def test_every_metric_and_reason_the_query_names_is_exported_by_the_sidecar():
    exposition = sidecar_exposition()
    query = trigger_query(scaledobject())
    names = {name for name, _ in SELECTOR.findall(query)}
    # the demand terms and the capacity they are divided by
    assert {"palmyra_in_flight_requests", "palmyra_queued_requests", "palmyra_concurrency_limit"} <= names
    assert missing_from_exposition(query, exposition) == []
    # the same check catches a renamed metric and a reason the sidecar never counts
    assert missing_from_exposition(query.replace("palmyra_queued_requests", "palmyra_queue_requests"), exposition) == [
        "palmyra_queue_requests"
    ]
    assert missing_from_exposition(query.replace("queue_full", "queue_overflow"), exposition) == [
        'palmyra_rejections_total{reason="queue_overflow"}'
    ]


def test_concurrency_limit_is_the_admission_limit():
    """The denominator is what the replica admits, not a constant: change the setting, it follows."""
    for limit in (4, 64):
        metrics = SidecarMetrics()
        SidecarState(Settings(admission_mode="fixed", max_in_flight=limit, auth_disabled=True), metrics)
        assert metrics.registry.get_sample_value("palmyra_concurrency_limit") == limit
    for ceiling in (16, 200):  # adaptive (the default): the limit of the moment, under its ceiling
        metrics = SidecarMetrics()
        state = SidecarState(Settings(admission_max_limit=ceiling, auth_disabled=True), metrics)
        assert metrics.registry.get_sample_value("palmyra_concurrency_limit") == state.admission.limit == ceiling // 2
        assert metrics.registry.get_sample_value("palmyra_concurrency_ceiling") == ceiling


def test_query_arithmetic_on_synthetic_replicas(tmp_path):
    """promtool evaluates the trigger's query on two synthetic replicas (limit 4): idle 0; one full
    replica 1; full + 4 queued on one and full on the other 3; refusals for capacity count (30 s x
    rate), refusals for other reasons do not; a limit of 0 cannot divide by zero."""
    query = trigger_query(scaledobject())
    rules = tmp_path / "empty-rules.yml"
    rules.write_text("groups: []\n", encoding="utf-8")

    def series(metric: str, instance: str, values: str, **labels: str) -> dict:
        extra = "".join(f',{k}="{v}"' for k, v in labels.items())
        return {"series": f'{metric}{{job="palmyra-sidecar",instance="{instance}"{extra}}}', "values": values}

    # 1 sample per 10 s; minute 0-2 idle, 3-5 one replica full, 6-8 both busy, 9-11 refusing.
    inputs = [
        series("palmyra_concurrency_limit", "a", "4x72"),
        series("palmyra_concurrency_limit", "b", "4x35 0x36"),
        series("palmyra_in_flight_requests", "a", "0x17 4x54"),
        series("palmyra_in_flight_requests", "b", "0x35 4x36"),
        series("palmyra_queued_requests", "a", "0x35 4x18 0x18"),
        series("palmyra_queued_requests", "b", "0x72"),
        # a: from minute 9, 1 capacity refusal per 10 s (0.1/s -> 30 x 0.1 = 3 slots)
        series("palmyra_rejections_total", "a", "0x53 1+1x18", reason="queue_full"),
        series("palmyra_rejections_total", "a", "0x72", reason="queue_timeout"),
        # b: draining refusals all along: not demand
        series("palmyra_rejections_total", "b", "0+5x72", reason="draining"),
        series("palmyra_rejections_total", "b", "0x72", reason="queue_full"),
    ]
    # b's limit is 0 from minute 6: clamp_min makes it 1, so b counts 4/1 = 4.
    expected = {"2m": 0, "5m": 1, "8m": 2 + 4, "11m": (4 + 3) / 4 + 4}
    tests: dict[str, Any] = {
        "rule_files": [str(rules)],
        "evaluation_interval": "10s",
        "tests": [
            {
                "interval": "10s",
                "input_series": inputs,
                "promql_expr_test": [
                    {"expr": query, "eval_time": t, "exp_samples": [{"labels": "{}", "value": v}]}
                    for t, v in expected.items()
                ],
            }
        ],
    }
    path = tmp_path / "autoscaling.test.yml"
    path.write_text(yaml.safe_dump(tests), encoding="utf-8")
    run = subprocess.run(["promtool", "test", "rules", str(path)], check=False, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    # and a wrong expectation fails: the check can fail
    tests["tests"][0]["promql_expr_test"][1]["exp_samples"][0]["value"] = 2
    path.write_text(yaml.safe_dump(tests), encoding="utf-8")
    assert subprocess.run(["promtool", "test", "rules", str(path)], check=False, capture_output=True).returncode != 0


# --- the two autoscalers agree ---------------------------------------------------------------


def test_adapter_rule_computes_the_triggers_query():
    """docs/autoscaling.md's adapter rule, with the matchers the adapter inserts for the HPA's
    selector, is the trigger's query: one signal, whichever autoscaler runs."""
    keda = trigger_query(scaledobject())
    [metric] = hpa()["spec"]["metrics"]
    labels = metric["external"]["metric"]["selector"]["matchLabels"]
    matchers = ",".join(f'{k}="{v}"' for k, v in labels.items())
    adapter = adapter_metrics_query()
    assert normalized(adapter.replace("<<.LabelMatchers>>", matchers)) == normalized(keda)
    assert normalized(adapter.replace("<<.LabelMatchers>>", 'job="other"')) != normalized(keda)


def test_hpa_and_scaledobject_agree_on_target_bounds_and_windows():
    scaled, plain = scaledobject(), hpa()
    [trigger] = scaled["spec"]["triggers"]
    [metric] = plain["spec"]["metrics"]
    assert metric["type"] == "External" and trigger["metricType"] == metric["external"]["target"]["type"]
    assert float(trigger["metadata"]["threshold"]) == float(metric["external"]["target"]["averageValue"])
    assert scaled["spec"]["minReplicaCount"] == plain["spec"]["minReplicas"] >= 1  # no scale to zero
    assert scaled["spec"]["maxReplicaCount"] == plain["spec"]["maxReplicas"]
    assert scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == plain["spec"]["behavior"]
    behavior = plain["spec"]["behavior"]
    # slower down than up: a removed replica costs a full start to get back
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] > behavior["scaleUp"]["stabilizationWindowSeconds"]
