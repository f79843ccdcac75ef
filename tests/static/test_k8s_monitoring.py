"""Monitoring and autoscaling objects of k8s/: the PrometheusRule is the Compose rules file,
dashboards are the Compose dashboard files (the generator writes both copies; the k8s one lives
inside the component's root so plain kustomize loads it), monitors scrape the ports and jobs the
rules expect (the engine's metrics at /engine/metrics on the sidecar's client port, the sidecar's
full page on its probe port, which only Prometheus is let into), exactly
one autoscaler scales, on the sidecars' demand; the "never ready" alert waits out the largest
startup-probe budget any overlay renders; the AlertmanagerConfig example validates against its CRD
and routes as Compose's Alertmanager does."""

from __future__ import annotations

import copy
import json
import re
import subprocess

import jsonschema
import pytest
import yaml

from tests.helpers.k8s_manifests import (
    CORE_API_GROUPS,
    EXAMPLES,
    K8S,
    OPT_IN,
    OVERLAYS,
    REPO,
    TARGET_IDS,
    TARGETS,
    CrdLoader,
    assert_valid,
    load_crd,
    need_kubectl,
    one,
    pod_spec,
    render,
    render_example,
    sidecar_listens,
    strict_schema,
)
from tests.helpers.modules import load_module

RULES_FILE = REPO / "monitoring" / "prometheus" / "rules" / "palmyra-alerts.yml"
DASHBOARDS = REPO / "monitoring" / "grafana" / "dashboards"
K8S_DASHBOARDS = K8S / "monitoring" / "dashboards"
# The accelerator overlays, each with the opt-in monitoring and KEDA components on top (as
# k8s/README.md and k8s/examples apply them).
MONITORED = [name for name in OVERLAYS if name != "cpu"]
JOB_MATCHER = re.compile(r'job=~"([^"]+)"')
LABEL_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def _generator():
    return load_module("render_prometheusrule", K8S / "monitoring" / "render_prometheusrule.py")


def _dashboard_generator():
    return load_module("k8s_generate_dashboards", REPO / "monitoring" / "grafana" / "generate_dashboards.py")


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
    rendered = one(render(overlay, OPT_IN), "PrometheusRule")["spec"]["groups"]
    expected = _rules()["groups"]
    assert [g["name"] for g in rendered] == [g["name"] for g in expected]
    for got, want in zip(rendered, expected, strict=True):
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
        for gen in kustomization.get("configMapGenerator", [])
        for f in gen.get("files", [])
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
    maps = [
        o
        for o in render(overlay, OPT_IN)
        if o["kind"] == "ConfigMap" and o["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    ]
    rendered = {key: json.loads(text) for m in maps for key, text in m["data"].items()}
    expected = {p.name: json.loads(p.read_text(encoding="utf-8")) for p in DASHBOARDS.glob("*.json")}
    assert rendered == expected


# --- scraping ------------------------------------------------------------------------------

ENGINE_METRICS_PATH = "/engine/metrics"  # where the sidecar relays the engine's page, unchanged
NAMESPACE = "some-namespace"
POD_IP = "10.1.2.3"
ENGINE_MONITOR, SIDECAR_MONITOR = "palmyra-engine", "palmyra-sidecar"  # the two PodMonitors' names
GO_GROUP = re.compile(r"\$\{(\w+)\}|\$(\w+)")  # $1 and ${1} in a Prometheus replacement


def _relabel(labels: dict[str, str], relabelings: list[dict]) -> dict[str, str]:
    """The operator's `replace` relabelings (the only action used here), applied as Prometheus does;
    then `instance` defaults to the scraped address, as Prometheus sets it when no relabeling did."""
    labels = dict(labels)
    for r in relabelings:
        assert r.get("action", "replace") == "replace", f"this test models replace only: {r}"
        value = r.get("separator", ";").join(labels.get(name, "") for name in r.get("sourceLabels", []))
        match = re.fullmatch(r.get("regex", "(.*)"), value)
        if match:
            template = GO_GROUP.sub(lambda m: f"\\g<{m.group(1) or m.group(2)}>", r.get("replacement", "$1"))
            labels[r["targetLabel"]] = match.expand(template)
    labels.setdefault("instance", labels["__address__"])
    return labels


def pod_monitor_target(objects: list[dict], name: str) -> dict[str, str]:
    """Labels and scrape address of a PodMonitor's one target in a pod, as the Prometheus operator
    generates them (namespace, pod, container owning the named port, job "<ns>/<name>", endpoint,
    the address; then the monitor's own relabelings)."""
    monitor = one(objects, "PodMonitor", name)
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    owners = [
        (c["name"], p["containerPort"])
        for c in pod_spec(objects)["containers"]
        for p in c.get("ports", [])
        if p.get("name") == endpoint["port"]
    ]
    assert len(owners) == 1, f"port {endpoint['port']!r} is declared by {owners}"
    [(owner, port)] = owners
    labels = {
        "namespace": NAMESPACE,
        "pod": "palmyra-serve-7d9f8b6c5-x2x4q",
        "container": owner,
        "job": f"{NAMESPACE}/{monitor['metadata']['name']}",
        "endpoint": endpoint["port"],
        "__address__": f"{POD_IP}:{port}",
    }
    labels = _relabel(labels, endpoint.get("relabelings", []))
    del labels["__address__"]
    return {**labels, "__port__": str(port), "__owner__": owner, "__path__": endpoint.get("path", "/metrics")}


def assert_monitors_scrape_through_the_sidecar(objects: list[dict], rules: dict, keda_query: str | None) -> None:
    spec = pod_spec(objects)
    listens = sidecar_listens(spec)
    engine_target = pod_monitor_target(objects, ENGINE_MONITOR)
    sidecar_target = pod_monitor_target(objects, SIDECAR_MONITOR)
    # Both through the sidecar: the engine has no port outside its loopback. The engine's page on
    # the client port; the sidecar's own on the probe port, the only page with the per-tenant
    # series (the client port's /metrics leaves them out).
    assert engine_target["__owner__"] == sidecar_target["__owner__"] == "sidecar"
    assert int(engine_target["__port__"]) == listens.port, engine_target
    assert listens.probe_port and int(sidecar_target["__port__"]) == listens.probe_port, sidecar_target
    assert engine_target["__path__"] == ENGINE_METRICS_PATH
    assert sidecar_target["__path__"] == "/metrics"
    # One replica, one `instance` in both jobs (the Alertmanager groups and inhibits by it): the
    # client address, the one the engine's page is scraped at.
    assert sidecar_target["instance"] == engine_target["instance"] == f"{POD_IP}:{listens.port}", (
        sidecar_target,
        engine_target,
    )
    # The engine's series are labelled as the engine's, under the jobs the shared rules watch.
    assert engine_target["container"] == "engine", engine_target
    matchers = {
        m for group in rules["groups"] for rule in group["rules"] for m in JOB_MATCHER.findall(str(rule["expr"]))
    }
    assert matchers, "the rules file no longer selects jobs: update this test"
    jobs = {"engine": engine_target["job"], "sidecar": sidecar_target["job"]}
    for matcher in matchers:
        assert any(re.fullmatch(matcher, job) for job in jobs.values()), matcher
    for which, job in jobs.items():
        assert any(re.fullmatch(m, job) for m in matchers), f"no rule watches the {which} job {job}"
    # The autoscaler's query selects the sidecar target's series (its demand) by their labels.
    if keda_query is not None:
        selected = {
            name: (op, value) for name, op, value in LABEL_MATCHER.findall(keda_query) if name in sidecar_target
        }
        assert selected, keda_query
        for name, (op, value) in selected.items():
            hit = re.fullmatch(value, sidecar_target[name]) if "~" in op else value == sidecar_target[name]
            assert bool(hit) == op.startswith("="), f"{name}{op}{value!r} misses the sidecar's {sidecar_target[name]!r}"


def _keda_query(objects: list[dict]) -> str | None:
    scaled = [o for o in objects if o["kind"] == "ScaledObject"]
    return scaled[0]["spec"]["triggers"][0]["metadata"]["query"] if scaled else None


@pytest.mark.parametrize("overlay", MONITORED)
def test_monitors_scrape_the_sidecar_port_under_the_jobs_the_rules_expect(overlay):
    objects = render(overlay, OPT_IN)
    assert_monitors_scrape_through_the_sidecar(objects, _rules(), _keda_query(objects))


def test_monitor_check_can_fail():
    good = render("ascend-cce", OPT_IN)
    rules = _rules()
    assert_monitors_scrape_through_the_sidecar(good, rules, _keda_query(good))

    def endpoint(objects, name=ENGINE_MONITOR):
        return one(objects, "PodMonitor", name)["spec"]["podMetricsEndpoints"][0]

    faults = {
        "the sidecar's page from the client port (no per-tenant series there)": lambda o: endpoint(
            o, SIDECAR_MONITOR
        ).__setitem__("port", "http"),
        "the sidecar's series under the probe port's address (another instance than the engine's)": lambda o: endpoint(
            o, SIDECAR_MONITOR
        ).__setitem__("relabelings", endpoint(o, SIDECAR_MONITOR)["relabelings"][:1]),
        "a sidecar job the rules and autoscalers do not watch": lambda o: endpoint(o, SIDECAR_MONITOR).__setitem__(
            "relabelings", endpoint(o, SIDECAR_MONITOR)["relabelings"][1:]
        ),
        "the engine's own /metrics path": lambda o: endpoint(o).__setitem__("path", "/metrics"),
        "no container relabeling (the engine's series labelled as the sidecar's)": lambda o: endpoint(o).__setitem__(
            "relabelings", []
        ),
        "a job the rules do not watch": lambda o: endpoint(o)["relabelings"].append(
            {"action": "replace", "targetLabel": "job", "replacement": "vllm"}
        ),
        "a port the pod does not declare": lambda o: endpoint(o).__setitem__("port", "engine-metrics"),
    }
    for what, fault in faults.items():
        objects = copy.deepcopy(good)
        fault(objects)
        with pytest.raises(AssertionError):
            assert_monitors_scrape_through_the_sidecar(objects, rules, _keda_query(objects))
        print(f"caught: {what}")
    # The KEDA query itself is checked too: one that selects another job than the sidecars' misses.
    objects = copy.deepcopy(good)
    query = _keda_query(objects)
    assert query is not None and 'job="palmyra-sidecar"' in query
    with pytest.raises(AssertionError):
        assert_monitors_scrape_through_the_sidecar(
            objects, rules, query.replace('job="palmyra-sidecar"', 'job="palmyra-engine"')
        )


def assert_only_prometheus_reaches_the_probe_port(objects: list[dict]) -> None:
    """The policies selecting the replicas admit the probe port (the sidecar's full /metrics, every
    tenant's series; a small connection cap shared with the kubelet's probes) to selected pods only,
    never from anywhere or from a whole namespace, and that is the port the sidecar PodMonitor
    scrapes. (The kubelet's probes come from the node, which NetworkPolicy always admits.)"""
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    probe_port = sidecar_listens(pod_spec(objects)).probe_port
    assert probe_port and int(pod_monitor_target(objects, SIDECAR_MONITOR)["__port__"]) == probe_port
    rules = [
        rule
        for policy in objects
        if policy["kind"] == "NetworkPolicy"
        and policy["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
        and "Ingress" in policy["spec"].get("policyTypes", ["Ingress"])
        for rule in policy["spec"].get("ingress", [])
    ]
    admitting = [r for r in rules if not r.get("ports") or probe_port in {p["port"] for p in r["ports"]}]
    assert admitting, f"nothing may reach port {probe_port}: Prometheus cannot scrape the sidecar"
    for rule in admitting:
        assert rule.get("ports"), f"a rule without ports opens the probe port too: {rule}"
        assert rule.get("from"), f"the probe port from anywhere: {rule}"
        for peer in rule["from"]:
            assert peer.get("podSelector", {}).get("matchLabels"), f"a whole namespace or range admitted: {peer}"


@pytest.mark.parametrize("overlay", MONITORED)
def test_only_prometheus_reaches_the_probe_port(overlay):
    assert_only_prometheus_reaches_the_probe_port(render(overlay, OPT_IN))


def test_probe_port_policy_check_can_fail():
    good = render("ascend-cce", OPT_IN)
    assert_only_prometheus_reaches_the_probe_port(good)

    def rule(objects):
        return one(objects, "NetworkPolicy", "palmyra-serve-metrics")["spec"]["ingress"][0]

    faults = {
        "no policy for Prometheus": lambda o: o.remove(one(o, "NetworkPolicy", "palmyra-serve-metrics")),
        "from anywhere": lambda o: rule(o).pop("from"),
        "from every pod of a namespace": lambda o: rule(o)["from"][0].pop("podSelector"),
        "every port of the pod": lambda o: rule(o).pop("ports"),
        "the base policy opens it to all": lambda o: one(o, "NetworkPolicy", "palmyra-serve")["spec"]["ingress"][0][
            "ports"
        ].append({"port": 8081, "protocol": "TCP"}),
    }
    for what, fault in faults.items():
        objects = copy.deepcopy(good)
        fault(objects)
        with pytest.raises(AssertionError):
            assert_only_prometheus_reaches_the_probe_port(objects)
        print(f"caught: {what}")


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


def test_every_overlay_applies_with_core_apis_alone_and_the_opt_ins_add_their_kinds():
    # A cluster with nothing but Kubernetes' own APIs takes every overlay; monitoring and KEDA are
    # components an operator adds where their CRDs are installed.
    for overlay in OVERLAYS:
        groups = {o["apiVersion"].rpartition("/")[0] or "v1" for o in render(overlay)}
        assert groups <= CORE_API_GROUPS, (overlay, groups - CORE_API_GROUPS)
    for overlay in MONITORED:
        kinds = {o["kind"] for o in render(overlay, OPT_IN)}
        assert {"ScaledObject", "PodMonitor", "PrometheusRule", "NetworkPolicy"} <= kinds, overlay


# --- alerts against the manifests ----------------------------------------------------------------

NEVER_READY = "PalmyraReplicaNeverReady"
# The warmup after an engine that answers at its startup probe's last try (about 100 s for the
# full-size model on CPU, benchmarks/results/startup.md) must fit between the probe's budget and
# the alert; more than this, and a start the probe has given up on goes unreported for longer.
WARMUP_ALLOWANCE_S = 300
DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str) -> float:
    """A Prometheus duration (`21m`, `1h30m`) in seconds."""
    parts = DURATION.findall(duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a Prometheus duration: {duration!r}"
    return sum(int(n) * UNIT_S[u] for n, u in parts)


def _alert(name: str) -> dict:
    return next(r for g in _rules()["groups"] for r in g["rules"] if r.get("alert") == name)


def startup_budget_s(objects: list[dict]) -> float:
    """The longest start the kubelet allows a container of the Deployment before it restarts it:
    initialDelaySeconds + periodSeconds x failureThreshold of its startupProbe (Kubernetes'
    defaults where unset), the largest over the pod's containers."""
    budgets = [
        probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
        for c in pod_spec(objects)["containers"]
        if (probe := c.get("startupProbe"))
    ]
    assert budgets, "no container has a startup probe: the never-ready alert's wait has no anchor"
    return max(budgets)


def assert_never_ready_waits_out_the_startup_probe(budget_s: float, for_s: float) -> None:
    # Fires only once the probe has given up on a start (never during one it still allows), and
    # no later than the warmup allowance after that.
    assert budget_s <= for_s, f"{NEVER_READY} fires after {for_s:.0f} s, inside the probe's {budget_s:.0f} s"
    assert for_s <= budget_s + WARMUP_ALLOWANCE_S, (
        f"{NEVER_READY} waits {for_s:.0f} s, more than {WARMUP_ALLOWANCE_S} s past the probe's {budget_s:.0f} s"
    )


def test_never_ready_waits_out_the_largest_startup_probe_any_overlay_renders():
    """Every overlay, alone and with its components, and every example overlay, rendered by the
    real kustomize: the largest startup-probe budget is what the alert's `for:` must outlast (the
    probe restarts the engine container, not the sidecar, so the sidecar's count of successful
    warmups stays 0 across such a restart)."""
    rendered = {f"{o}{''.join('+' + c for c in comps)}": render(o, comps) for o, comps in TARGETS}
    rendered |= {
        f"example {p.parent.name}": render_example(p.parent.name) for p in EXAMPLES.glob("*/kustomization.yaml")
    }
    budgets = {name: startup_budget_s(objects) for name, objects in rendered.items()}
    largest = max(budgets.values())
    for_s = seconds(_alert(NEVER_READY)["for"])
    print(
        f"startup probe budget: largest {largest:.0f} s ({max(budgets, key=budgets.__getitem__)}); "
        f"{NEVER_READY} for: {for_s:.0f} s"
    )
    assert largest == 1080, f"the base's 108 x 10 s changed: {budgets}"  # keep docs/runbooks.md in step
    assert_never_ready_waits_out_the_startup_probe(largest, for_s)


def test_the_startup_probe_check_can_fail():
    objects = render("cpu")
    for_s = seconds(_alert(NEVER_READY)["for"])
    assert_never_ready_waits_out_the_startup_probe(startup_budget_s(objects), for_s)
    engine = next(c for c in pod_spec(objects)["containers"] if c.get("startupProbe"))
    engine["startupProbe"]["failureThreshold"] *= 2  # a slower accelerator's start, the alert left alone
    with pytest.raises(AssertionError, match="inside the probe"):
        assert_never_ready_waits_out_the_startup_probe(startup_budget_s(objects), for_s)
    engine["startupProbe"]["failureThreshold"] //= 4  # a faster start: the alert now waits far too long
    with pytest.raises(AssertionError, match="more than"):
        assert_never_ready_waits_out_the_startup_probe(startup_budget_s(objects), for_s)
    assert seconds("1h30m") == 5400 and seconds("21m") == 1260


AGGREGATION = re.compile(r"\b(sum|avg|min|max|count|group|stddev|stdvar)\s*(by|without)?\s*(\([^()]*\))?\s*\(")


def dropped_namespace(expr: str) -> list[str]:
    """Aggregations in `expr` whose result has no `namespace` label."""
    found = []
    for match in AGGREGATION.finditer(expr):
        _op, modifier, labels = match.groups()
        names = {n.strip() for n in (labels or "()")[1:-1].split(",") if n.strip()}
        kept = "namespace" in names if modifier == "by" else modifier == "without" and "namespace" not in names
        if not kept:
            found.append(match.group(0))
    return found


def test_every_alert_keeps_the_namespace_of_its_series():
    """The AlertmanagerConfig routes only alerts labelled with its own namespace (the operator adds
    that matcher), so an aggregation that drops `namespace`, in an alert or in a recording rule one
    reads, would send that alert nowhere in Kubernetes."""
    rules = [r for g in _rules()["groups"] for r in g["rules"]]
    recorded = {r["record"]: str(r["expr"]) for r in rules if "record" in r}
    for rule in rules:
        if "alert" not in rule:
            continue
        expr = str(rule["expr"])
        exprs = [expr] + [text for name, text in recorded.items() if re.search(re.escape(name) + r"(?![\w:])", expr)]
        for text in exprs:
            assert not dropped_namespace(text), f"{rule['alert']}: {dropped_namespace(text)} drops namespace"
    assert dropped_namespace("sum by (job) (rate(x[5m]))") and dropped_namespace("max(x)")
    assert not dropped_namespace("sum by (namespace, job) (x) > on() group_left() max_over_time(y[5m])")


# --- the AlertmanagerConfig example --------------------------------------------------------------

ALERTMANAGER_EXAMPLE = K8S / "monitoring" / "alertmanager"
COMPOSE_ALERTMANAGER = REPO / "monitoring" / "alertmanager" / "alertmanager.yml"
CRDS = REPO / "tests" / "data" / "schemas" / "crds"


def render_alertmanager_example() -> list[dict]:
    need_kubectl()
    result = subprocess.run(
        ["kubectl", "kustomize", str(ALERTMANAGER_EXAMPLE)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    # kustomize writes the matchers' `=` bare, which PyYAML alone would not take for a string.
    return [doc for doc in yaml.load_all(result.stdout, Loader=CrdLoader) if doc]  # a SafeLoader subclass


def child_route_validator() -> jsonschema.protocols.Validator:
    """The CRD's own schema of a route, for the child routes, which the CRD keeps as free-form JSON
    (a recursive type; the operator parses them into the same struct): unknown fields are errors."""
    crd = load_crd(CRDS / "monitoring.coreos.com_alertmanagerconfigs.yaml")
    [version] = crd["spec"]["versions"]
    route = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["route"]
    return jsonschema.Draft7Validator(strict_schema(route))


def assert_child_routes_valid(route: dict, validator: jsonschema.protocols.Validator) -> None:
    for child in route.get("routes", []):
        errors = [f"{e.message} at {list(e.path)}" for e in validator.iter_errors(child)]
        assert not errors, f"child route {child}: {errors}"
        assert_child_routes_valid(child, validator)


def _matchers(matchers: list[dict]) -> list[str]:
    return [f'{m["name"]}{m.get("matchType", "=")}"{m["value"]}"' for m in matchers]


def assert_routes_as_compose_does(spec: dict, compose: dict) -> None:
    """The example's routing is the Compose Alertmanager's, field by field (camelCase there)."""
    route, want = spec["route"], compose["route"]
    assert route["groupBy"] == want["group_by"]
    for camel, snake in (
        ("groupWait", "group_wait"),
        ("groupInterval", "group_interval"),
        ("repeatInterval", "repeat_interval"),
    ):
        assert route[camel] == want[snake], camel
    children = [(_matchers(c["matchers"]), c["repeatInterval"]) for c in route["routes"]]
    assert children == [(c["matchers"], c["repeat_interval"]) for c in want["routes"]]
    [webhook] = next(r for r in spec["receivers"] if r["name"] == route["receiver"])["webhookConfigs"]
    assert webhook["sendResolved"] is True and "url" not in webhook, "the URL is a secret: from the Secret only"
    assert webhook["urlSecret"] == {"name": "palmyra-serve-alert-webhook", "key": "url"}
    inhibit = [
        {
            "source_matchers": _matchers(r["sourceMatch"]),
            "target_matchers": _matchers(r["targetMatch"]),
            "equal": r["equal"],
        }
        for r in spec["inhibitRules"]
    ]
    assert inhibit == compose["inhibit_rules"]


def test_the_alertmanagerconfig_example_validates_and_routes_as_compose_does(crd_validators):
    objects = render_alertmanager_example()
    assert [o["kind"] for o in objects] == ["AlertmanagerConfig"]
    assert_valid(objects, crd_validators)  # strict: a field the API server would prune is an error
    [config] = objects
    assert_child_routes_valid(config["spec"]["route"], child_route_validator())
    compose = yaml.safe_load(COMPOSE_ALERTMANAGER.read_text(encoding="utf-8"))
    assert_routes_as_compose_does(config["spec"], compose)
    # The alerts it names exist.
    names = {r["alert"] for g in _rules()["groups"] for r in g["rules"] if "alert" in r}
    for rule in config["spec"]["inhibitRules"]:
        for m in rule["sourceMatch"] + rule["targetMatch"]:
            assert m["name"] != "alertname" or m["value"] in names, m
    # An example, not part of what `kubectl apply -k` of an overlay (with the opt-ins) applies.
    for overlay in MONITORED:
        assert "AlertmanagerConfig" not in {o["kind"] for o in render(overlay, OPT_IN)}, overlay


def test_the_alertmanagerconfig_checks_can_fail(crd_validators):
    [good] = render_alertmanager_example()
    compose = yaml.safe_load(COMPOSE_ALERTMANAGER.read_text(encoding="utf-8"))
    typo = copy.deepcopy(good)
    typo["spec"]["receivers"][0]["webhookConfigs"][0]["urlSecrets"] = typo["spec"]["receivers"][0]["webhookConfigs"][
        0
    ].pop("urlSecret")
    with pytest.raises(AssertionError, match="violates its CRD"):
        assert_valid([typo], crd_validators)
    child = copy.deepcopy(good)
    child["spec"]["route"]["routes"][0]["repeat_interval"] = "1h"  # Compose's spelling, pruned by the operator
    with pytest.raises(AssertionError, match="child route"):
        assert_child_routes_valid(child["spec"]["route"], child_route_validator())
    drift = copy.deepcopy(good)
    drift["spec"]["route"]["routes"][0]["repeatInterval"] = "12h"
    with pytest.raises(AssertionError):
        assert_routes_as_compose_does(drift["spec"], compose)
