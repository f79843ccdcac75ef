"""The inference-gateway component (k8s/components/inference-gateway): load-aware routing through
the Gateway API Inference Extension (InferencePool, GIE v1.6.0) and the llm-d-router endpoint
picker (v0.10.0).

It renders with plain `kubectl kustomize` on every overlay and validates strictly against the
vendored CRDs. The CEL rules of those CRDs (which a JSON-schema run does not evaluate) that these
objects could break are checked by hand, each quoted from the vendored CRD. The rest checks what
must line up for routing to work at all, against sources other than the component's own files:
the pool selects the Deployment's pods on the sidecar's port, the route sends the sidecar's API
routes (its own route table) to the pool or the Service, the picker reads the metric names vLLM
exports (its source in the installed engine) from the path and port the pool targets, and the
NetworkPolicies let the picker and the gateway through.

The live counterpart, tests/engine/test_engine_metrics_path.py, scrapes that path on a real
sidecar in front of the real engine.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from palmyra_serve.sidecar.core.routes import CONTROL_PATHS, GENERATION_ROUTES, RELAYED
from tests.helpers.k8s_manifests import K8S, REPO, assert_valid, container, discovered_overlays, one, pod_spec, render

API_ROUTES = {path: route.label for path, route in RELAYED.items()}

COMPONENT = "components/inference-gateway"
CONFIG_FILE = K8S / COMPONENT / "picker-config.yaml"
CRDS = REPO / "tests" / "data" / "schemas" / "crds"
DOC = REPO / "docs" / "inference-gateway.md"
POOL_GROUP = "inference.networking.k8s.io"
# The sidecar's port carries the engine's own metrics page at this path (the hardened-edge
# contract: the engine listens on loopback only, the sidecar relays its page unchanged).
ENGINE_METRICS_PATH = "/engine/metrics"
# What the picker reads from a vLLM page: llm-d-router v0.10.0's built-in vLLM mapping
# (pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go, defaultEngineConfigs).
PICKER_READS = {
    "queuedRequestsSpec": "vllm:num_requests_waiting",
    "runningRequestsSpec": "vllm:num_requests_running",
    "kvUsageSpec": "vllm:kv_cache_usage_perc",
    "loraSpec": "vllm:lora_requests_info",
    "cacheInfoSpec": "vllm:cache_config_info",
}
LORA_ONLY = "vllm:lora_requests_info"
# Fields the picker's strict decoder accepts at v0.10.0 (apix/config/v1alpha1/
# endpointpickerconfig_types.go, and each plugin's parameter struct): anything else stops it.
CONFIG_FIELDS = {
    "apiVersion",
    "kind",
    "featureGates",
    "plugins",
    "schedulingProfiles",
    "dataLayer",
    "flowControl",
    "requestHandler",
    "saturationDetector",
    "parser",
}
PLUGIN_FIELDS = {"name", "type", "parameters"}
PROFILE_FIELDS = {"name", "plugins"}
PROFILE_PLUGIN_FIELDS = {"pluginRef", "weight"}
DATA_LAYER_FIELDS = {
    "injectDefaults",
    "sources",
    "discovery",
    "crossReplicaSyncerPluginRef",
    "crossReplicaSyncInterval",
}
PARAMETERS = {  # source/metrics/datasource.go, extractor/metrics/factories.go
    "metrics-data-source": {
        "scheme",
        "path",
        "port",
        "insecureSkipVerify",
        "caCertPath",
        "clientCertPath",
        "clientKeyPath",
        "interval",
    },
    "core-metrics-extractor": {"engineLabelKey", "defaultEngine", "engineConfigs"},
}
ENGINE_CONFIG_FIELDS = {
    "name",
    *PICKER_READS,
    "cacheBlockSizeLabelName",
    "cacheNumBlocksLabelName",
    "cacheBlockSizeSpec",
    "cacheNumBlocksSpec",
    "customMetrics",
}
# Plugin types of the config, as registered in llm-d-router v0.10.0.
KNOWN_TYPES = {
    "queue-scorer",
    "kv-cache-utilization-scorer",
    "prefix-cache-scorer",
    "metrics-data-source",
    "core-metrics-extractor",
    "max-score-picker",
    "single-profile-handler",
    "openai-parser",
}
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"  # GEP-1762
NAMESPACE = {"kubernetes.io/metadata.name": "palmyra"}
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}


def gateway_objects(overlay: str = "cpu") -> list[dict]:
    return render(overlay, (COMPONENT,))


def _component_only(objects: list[dict], overlay: str = "cpu") -> list[dict]:
    base = {(o["kind"], o["metadata"]["name"]) for o in render(overlay)}
    return [o for o in objects if (o["kind"], o["metadata"]["name"]) not in base]


# --- rendering and schemas -------------------------------------------------------------------


@pytest.mark.parametrize("overlay", discovered_overlays())
def test_component_renders_on_every_overlay_and_validates(overlay, crd_validators):
    objects = gateway_objects(overlay)
    keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), "an object rendered twice"
    for kind in ("InferencePool", "HTTPRoute"):
        assert one(objects, kind)
    for kind in ("Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "ServiceMonitor", "NetworkPolicy"):
        assert one(objects, kind, "palmyra-serve-epp")
    assert_valid(objects, crd_validators)


def test_crd_validation_catches_a_misspelled_pool_field(crd_validators):
    pool = one(gateway_objects(), "InferencePool")
    validator = crd_validators[(pool["apiVersion"], "InferencePool")]
    assert not list(validator.iter_errors(pool))
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    assert list(validator.iter_errors(pool))


# --- CEL rules, by hand -----------------------------------------------------------------------


def _cel_rules(crd_file: str, field: str = "rule") -> set[str]:
    """The CRD's CEL rules (or their messages), whitespace-normalised."""
    crd = yaml.safe_load((CRDS / crd_file).read_text(encoding="utf-8"))
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            found.update(" ".join(r.get(field, "").split()) for r in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(crd["spec"]["versions"])
    return found


# Quoted from the vendored CRDs; the test below fails when an upgraded CRD changes one, so the
# hand-written checks cannot silently fall behind.
POOL_RULES = {
    # spec.endpointPickerRef ("port is required when kind is 'Service' or unspecified")
    "epp_port": "self.kind != 'Service' || has(self.port)",
    # spec.targetPorts ("port number must be unique")
    "unique_ports": "self.all(p1, self.exists_one(p2, p1.number==p2.number))",
}
ROUTE_RULES = {
    # spec.rules[].backendRefs[] ("Must have port for Service reference")
    "service_port": "(size(self.group) == 0 && self.kind == 'Service') ? has(self.port) : true",
    # spec.rules[].matches[].path (one of several; the others below are their siblings)
    "absolute_path": "(self.type in ['Exact','PathPrefix']) ? self.value.startsWith('/') : true",
    "no_double_slash": "(self.type in ['Exact','PathPrefix']) ? !self.value.contains('//') : true",
    # spec.rules[].timeouts ("backendRequest timeout cannot be longer than request timeout")
    "timeouts": (
        "!(has(self.request) && has(self.backendRequest) && duration(self.request) != duration('0s') "
        "&& duration(self.backendRequest) > duration(self.request))"
    ),
}


def test_the_cel_rules_checked_here_are_the_vendored_crds_rules():
    pool_rules, route_rules = (
        _cel_rules("inference.networking.k8s.io_inferencepools.yaml"),
        _cel_rules("gateway.networking.k8s.io_httproutes.yaml"),
    )
    assert set(POOL_RULES.values()) <= pool_rules
    assert set(ROUTE_RULES.values()) <= route_rules
    # The match-count and parentRefs rules are long expressions; their messages identify them.
    messages = _cel_rules("gateway.networking.k8s.io_httproutes.yaml", "message")
    assert {
        (
            "While 16 rules and 64 matches per rule are allowed, the total number of matches across all rules "
            "in a route must be less than 128"
        ),
        "sectionName must be specified when parentRefs includes 2 or more references to the same parent",
    } <= messages


_DURATION = re.compile(r"^(?:[0-9]{1,5}(?:h|m|s|ms)){1,4}$")  # GEP-2257, as the CRD's pattern
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_PATH_CHARS = re.compile(r"^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$")


def _seconds(duration: str) -> float:
    assert _DURATION.match(duration), duration
    return sum(float(n) * _UNIT_S[u] for n, u in re.findall(r"([0-9]+)(ms|h|m|s)", duration))


def pool_cel_errors(pool: dict) -> list[str]:
    spec, errors = pool["spec"], []
    ref = spec.get("endpointPickerRef")
    if ref is not None and ref.get("kind", "Service") == "Service" and "port" not in ref:  # kind defaults to Service
        errors.append("endpointPickerRef: port is required when kind is 'Service' or unspecified")
    numbers = [p["number"] for p in spec["targetPorts"]]
    if len(numbers) != len(set(numbers)):
        errors.append("targetPorts: port number must be unique")
    return errors


def route_cel_errors(route: dict) -> list[str]:
    spec, errors = route["spec"], []
    parents = [
        (p.get("group", "gateway.networking.k8s.io"), p.get("kind", "Gateway"), p["name"], p.get("namespace", ""))
        for p in spec.get("parentRefs", [])
    ]
    for parent in set(parents):
        same = [p for p, key in zip(spec["parentRefs"], parents, strict=True) if key == parent]
        if len(same) > 1 and not all(p.get("sectionName") or p.get("port") for p in same):
            errors.append("parentRefs: sectionName must be specified for 2 or more references to the same parent")
    rules = spec.get("rules", [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}])
    if sum(len(r.get("matches", [])) for r in rules) >= 128:
        errors.append("rules: fewer than 128 matches in all")
    for rule in rules:
        for ref in rule.get("backendRefs", []):
            if ref.get("group", "") == "" and ref.get("kind", "Service") == "Service" and "port" not in ref:
                errors.append(f"backendRef {ref['name']}: Must have port for Service reference")
        for match in rule.get("matches", [{"path": {"type": "PathPrefix", "value": "/"}}]):
            path = match.get("path", {"type": "PathPrefix", "value": "/"})
            if path["type"] in ("Exact", "PathPrefix"):
                value = path["value"]
                bad = (
                    not value.startswith("/")
                    or any(s in value for s in ("//", "/./", "/../", "%2f", "%2F", "#"))
                    or value.endswith(("/..", "/."))
                    or not _PATH_CHARS.match(value)
                )
                if bad:
                    errors.append(f"path {value!r}: not a valid absolute path")
        timeouts = rule.get("timeouts", {})
        if (
            "request" in timeouts
            and "backendRequest" in timeouts
            and _seconds(timeouts["request"]) != 0
            and _seconds(timeouts["backendRequest"]) > _seconds(timeouts["request"])
        ):
            errors.append("timeouts: backendRequest timeout cannot be longer than request timeout")
    return errors


def test_pool_and_route_pass_the_cel_rules():
    objects = gateway_objects()
    assert pool_cel_errors(one(objects, "InferencePool")) == []
    assert route_cel_errors(one(objects, "HTTPRoute")) == []


def test_cel_checks_catch_what_the_api_server_would_reject():
    objects = gateway_objects()
    pool, route = one(objects, "InferencePool"), one(objects, "HTTPRoute")
    no_port = copy.deepcopy(pool)
    del no_port["spec"]["endpointPickerRef"]["port"]
    del no_port["spec"]["endpointPickerRef"]["kind"]  # unspecified is Service too
    assert pool_cel_errors(no_port)
    twice = copy.deepcopy(pool)
    twice["spec"]["targetPorts"].append(dict(twice["spec"]["targetPorts"][0]))
    assert pool_cel_errors(twice)
    for fault in ("service_port", "relative_path", "timeouts", "parents"):
        broken = copy.deepcopy(route)
        rule = broken["spec"]["rules"][-1]
        if fault == "service_port":
            del next(r for r in rule["backendRefs"] if r["kind"] == "Service")["port"]
        elif fault == "relative_path":
            rule["matches"][0]["path"]["value"] = "v1/models"
        elif fault == "timeouts":
            rule["timeouts"] = {"request": "30s", "backendRequest": "1m"}
        else:
            broken["spec"]["parentRefs"].append(dict(broken["spec"]["parentRefs"][0]))
        assert route_cel_errors(broken), fault


# --- the pool, the picker and the route line up ----------------------------------------------


def _matches(selector: dict, labels: dict) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) against a label set."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _pod_labels(objects: list[dict], deployment: str) -> dict:
    return one(objects, "Deployment", deployment)["spec"]["template"]["metadata"]["labels"]


def _container_port(c: dict, name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    return next(p["containerPort"] for p in c["ports"] if p.get("name") == name_or_number)


def sidecar_port(objects: list[dict]) -> int:
    return _container_port(container(pod_spec(objects), "sidecar"), "http")


def test_pool_selects_the_replicas_on_the_sidecar_port_and_nothing_else():
    objects = gateway_objects()
    pool = one(objects, "InferencePool")
    replicas = one(objects, "Deployment", "palmyra-serve")
    assert _matches(pool["spec"]["selector"], replicas["spec"]["template"]["metadata"]["labels"])
    # Exactly the Deployment's pods: its own selector and the pool's agree.
    assert pool["spec"]["selector"]["matchLabels"] == replicas["spec"]["selector"]["matchLabels"]
    picker = one(objects, "Deployment", pool["spec"]["endpointPickerRef"]["name"])
    assert not _matches(pool["spec"]["selector"], picker["spec"]["template"]["metadata"]["labels"])
    # The sidecar, never the engine: its port is the one the client Service exposes too.
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [sidecar_port(objects)]
    engine_ports = {p["containerPort"] for p in container(pod_spec(objects), "engine").get("ports", [])}
    assert not engine_ports & {p["number"] for p in pool["spec"]["targetPorts"]}
    assert pool["spec"].get("appProtocol", "http") == "http"  # the sidecar speaks HTTP/1.1


def _picker(objects: list[dict]) -> tuple[dict, dict]:
    pool = one(objects, "InferencePool")
    service = one(objects, "Service", pool["spec"]["endpointPickerRef"]["name"])
    deployment = next(
        o
        for o in objects
        if o["kind"] == "Deployment"
        and _matches({"matchLabels": service["spec"]["selector"]}, o["spec"]["template"]["metadata"]["labels"])
    )
    return service, deployment


def _args(c: dict) -> dict[str, str]:
    out = {}
    for arg in c["args"]:
        assert arg.startswith("--") and "=" in arg, f"flags as --name=value: {arg}"
        key, _, value = arg[2:].partition("=")
        out[key] = value
    return out


def test_pool_points_at_the_picker_and_the_picker_at_the_pool():
    objects = gateway_objects()
    pool = one(objects, "InferencePool")
    service, deployment = _picker(objects)
    epp = deployment["spec"]["template"]["spec"]["containers"][0]
    args = _args(epp)
    assert args["pool-name"] == pool["metadata"]["name"]
    assert args.get("pool-group", POOL_GROUP) == POOL_GROUP == pool["apiVersion"].split("/")[0]
    # endpointPickerRef.port is the Service port, which leads to the container's ext_proc port.
    ref_port = pool["spec"]["endpointPickerRef"]["port"]["number"]
    svc_port = next(p for p in service["spec"]["ports"] if p["port"] == ref_port)
    assert _container_port(epp, svc_port["targetPort"]) == int(args["grpc-port"])
    # Probes ask the picker's gRPC health port; its pool namespace comes from the pod's own.
    assert (
        epp["readinessProbe"]["grpc"]["port"] == epp["livenessProbe"]["grpc"]["port"] == int(args["grpc-health-port"])
    )
    env = {e["name"]: e for e in epp["env"]}
    assert env["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "pool-namespace" not in args
    # The monitor scrapes the port the picker serves its metrics on.
    monitor = one(objects, "ServiceMonitor", service["metadata"]["name"])
    assert _matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    [endpoint] = monitor["spec"]["endpoints"]
    metrics_port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    assert _container_port(epp, metrics_port["targetPort"]) == int(args["metrics-port"])
    # The role covers what the picker watches, bound to its service account.
    role, binding = one(objects, "Role", "palmyra-serve-epp"), one(objects, "RoleBinding", "palmyra-serve-epp")
    granted = {
        (g, r)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        if {"get", "list", "watch"} <= set(rule["verbs"])
    }
    assert {(POOL_GROUP, "inferencepools"), ("", "pods")} <= granted
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == [deployment["spec"]["template"]["spec"]["serviceAccountName"]]


def picker_config(objects: list[dict]) -> dict:
    """The EndpointPickerConfig the picker loads: the key of the ConfigMap mounted where
    --config-file points."""
    _, deployment = _picker(objects)
    spec = deployment["spec"]["template"]["spec"]
    epp = spec["containers"][0]
    path = Path(_args(epp)["config-file"])
    mount = next(m for m in epp["volumeMounts"] if Path(m["mountPath"]) == path.parent)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    config_map = one(objects, "ConfigMap", volume["configMap"]["name"])
    return yaml.safe_load(config_map["data"][path.name])


def test_picker_config_is_what_the_picker_decodes():
    config = picker_config(gateway_objects())
    assert (config["apiVersion"], config["kind"]) == ("llm-d.ai/v1alpha1", "EndpointPickerConfig")
    assert set(config) <= CONFIG_FIELDS
    names = {}
    for plugin in config["plugins"]:
        assert set(plugin) <= PLUGIN_FIELDS and plugin["type"] in KNOWN_TYPES, plugin
        names[plugin.get("name", plugin["type"])] = plugin  # the loader names a plugin by its type
        assert set(plugin.get("parameters") or {}) <= PARAMETERS.get(plugin["type"], set()), plugin
    for profile in config["schedulingProfiles"]:
        assert set(profile) <= PROFILE_FIELDS
        for ref in profile["plugins"]:
            assert set(ref) <= PROFILE_PLUGIN_FIELDS and ref["pluginRef"] in names, ref
    layer = config["dataLayer"]
    assert set(layer) <= DATA_LAYER_FIELDS
    for source in layer["sources"]:
        assert source["pluginRef"] in names
        assert all(e["pluginRef"] in names for e in source["extractors"])


def _metrics_source(config: dict) -> dict:
    sources = [p for p in config["plugins"] if p["type"] == "metrics-data-source"]
    assert len(sources) == 1, "one metrics source"
    return sources[0]


def test_picker_scrapes_the_engine_metrics_on_the_port_the_pool_targets():
    objects = gateway_objects()
    config, pool = picker_config(objects), one(objects, "InferencePool")
    source = _metrics_source(config)
    params = source.get("parameters") or {}
    assert params.get("path", "/metrics") == ENGINE_METRICS_PATH, "the sidecar's own /metrics has no vllm: series"
    assert ENGINE_METRICS_PATH in CONTROL_PATHS, "a path the sidecar answers itself"
    assert params.get("scheme", "http") == "http"
    # Without `port` the picker scrapes each endpoint's pool target port (the override replaces it).
    targets = [p["number"] for p in pool["spec"]["targetPorts"]]
    port = params.get("port", targets[0] if len(targets) == 1 else None)
    assert port == sidecar_port(objects) and port in targets
    # Only this source feeds the extractor; the default injection would add a scrape of /metrics.
    layer = config["dataLayer"]
    assert layer.get("injectDefaults", True) is False or source.get("name", source["type"]) == "metrics-data-source"
    [wired] = layer["sources"]
    assert wired["pluginRef"] == source.get("name", source["type"])
    assert [e["pluginRef"] for e in wired["extractors"]] == [
        p.get("name", p["type"]) for p in config["plugins"] if p["type"] == "core-metrics-extractor"
    ]


def configured_metric_names(config: dict) -> dict[str, str]:
    """spec field -> vLLM metric name, from the extractor's vllm engine config (selectors cut)."""
    [extractor] = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    [vllm] = [e for e in extractor["parameters"]["engineConfigs"] if e["name"] == "vllm"]
    assert set(vllm) <= ENGINE_CONFIG_FIELDS
    return {field: value.split("{")[0] for field, value in vllm.items() if field in PICKER_READS and value}


def _vllm_source() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vllm is not installed (the CPU engine's venv has it)")
    return Path(spec.origin).parent / "v1" / "metrics" / "loggers.py"


def vllm_exported_names(source: Path) -> dict[str, bool]:
    """Every `vllm:` metric the engine's Prometheus logger registers -> whether it is registered
    only when LoRA is configured (inside an `if ... lora_config ...` block)."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    found: dict[str, bool] = {}

    def visit(node: ast.AST, under_lora: bool) -> None:
        if isinstance(node, ast.If) and "lora_config" in ast.unparse(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, under_lora)
            return
        names = []
        if isinstance(node, ast.Call):
            names = [k.value for k in node.keywords if k.arg == "name"]
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "name" for t in node.targets):
            names = [node.value]
        for value in names:
            if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value.startswith("vllm:"):
                found[value.value] = found.get(value.value, True) and under_lora
        for inner in ast.iter_child_nodes(node):
            visit(inner, under_lora)

    visit(tree, False)
    return found


def test_picker_reads_names_vllm_really_exports():
    configured = configured_metric_names(picker_config(gateway_objects()))
    exported = vllm_exported_names(_vllm_source())
    assert len(exported) > 20, "the logger source was not understood"
    missing = {name for name in configured.values() if name not in exported}
    assert not missing, f"vLLM registers no such metric: {missing}"
    # All five, the same as the picker's built-in vLLM mapping.
    assert configured == PICKER_READS
    # Registered unconditionally: these four are on every engine's page.
    assert {n for n in configured.values() if exported[n]} == {LORA_ONLY}
    # vllm:lora_requests_info exists only when the engine runs with LoRA; the picker then reads no
    # adapters, without an error (extractor.go: a missing LoRA metric is skipped).


def test_metric_name_check_sees_a_misspelled_or_conditional_name(tmp_path):
    exported = vllm_exported_names(_vllm_source())
    assert "vllm:num_request_waiting" not in exported and "vllm:num_requests_waiting" in exported
    fake = tmp_path / "loggers.py"
    fake.write_text('g(name="vllm:a")\nif cfg.lora_config is not None:\n    g(name="vllm:b")\n', encoding="utf-8")
    assert vllm_exported_names(fake) == {"vllm:a": False, "vllm:b": True}


def _path_match(match: dict, path: str) -> bool:
    """Gateway API path matching: Exact, or PathPrefix by whole path elements."""
    rule = match.get("path", {"type": "PathPrefix", "value": "/"})
    value = rule["value"]
    if rule["type"] == "Exact":
        return path == value
    prefix = value.rstrip("/")
    return path == prefix or path.startswith(prefix + "/") or prefix == ""


def route_backend(route: dict, path: str) -> tuple[str, str, str] | None:
    """(group, kind, name) the route sends `path` to; the longest matching path wins."""
    best: tuple[int, dict] | None = None
    for rule in route["spec"]["rules"]:
        for match in rule.get("matches", [{}]):
            if _path_match(match, path):
                length = len(match.get("path", {}).get("value", "/"))
                if best is None or length > best[0]:
                    best = (length, rule)
    if best is None:
        return None
    [ref] = best[1]["backendRefs"]
    return ref.get("group", ""), ref.get("kind", "Service"), ref["name"]


def test_route_sends_generation_to_the_pool_and_the_rest_of_the_api_to_the_service():
    objects = gateway_objects()
    route, pool = one(objects, "HTTPRoute"), one(objects, "InferencePool")
    service = one(objects, "Service", "palmyra-serve")
    to_pool = (POOL_GROUP, "InferencePool", pool["metadata"]["name"])
    to_service = ("", "Service", service["metadata"]["name"])
    # The sidecar's own route table decides.
    for path, name in API_ROUTES.items():
        expected = to_pool if name in GENERATION_ROUTES else to_service
        assert route_backend(route, path) == expected, path
    for path in (*CONTROL_PATHS, "/v1/completionsx"):
        assert route_backend(route, path) is None, f"{path} must not be reachable through the gateway"
    service_ref = next(r for rule in route["spec"]["rules"] for r in rule["backendRefs"] if r["kind"] == "Service")
    assert service_ref["port"] in {p["port"] for p in service["spec"]["ports"]}
    parent = route["spec"]["parentRefs"][0]
    assert (parent.get("group"), parent.get("kind")) == ("gateway.networking.k8s.io", "Gateway")
    # No gateway-imposed cut of long streams on the generation rule.
    rule = next(r for r in route["spec"]["rules"] if r["backendRefs"][0]["kind"] == "InferencePool")
    assert _seconds(rule["timeouts"]["request"]) == 0


# --- NetworkPolicy ---------------------------------------------------------------------------


def _port_allowed(rule: dict, port: int, names: dict[str, int]) -> bool:
    if not rule.get("ports"):
        return True
    for spec in rule["ports"]:
        if spec.get("protocol", "TCP") != "TCP":
            continue
        want = spec.get("port")
        number = names.get(want) if isinstance(want, str) else want
        if want is None or number == port or (number is not None and number <= port <= spec.get("endPort", number)):
            return True
    return False


def _peer_allowed(peer: dict, src: dict, src_ns: dict, same_ns: bool) -> bool:
    if "ipBlock" in peer:
        return False  # pod IPs are not listed here
    ns_ok = _matches(peer["namespaceSelector"], src_ns) if "namespaceSelector" in peer else same_ns
    return ns_ok and _matches(peer.get("podSelector", {}), src)


def admits(
    policies: list[dict], target: dict, target_ports: dict[str, int], port: int, src: dict, src_ns: dict
) -> bool:
    """Whether ingress from a pod (labels `src`, namespace labels `src_ns`) to a pod (labels
    `target`, in NAMESPACE) on TCP `port` is allowed: not isolated, or allowed by some rule of some
    policy selecting the target (NetworkPolicy semantics)."""
    same_ns = src_ns == NAMESPACE
    selecting = [
        p
        for p in policies
        if p["kind"] == "NetworkPolicy"
        and _matches(p["spec"]["podSelector"], target)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not selecting:
        return True
    return any(
        _port_allowed(rule, port, target_ports)
        and (not rule.get("from") or any(_peer_allowed(peer, src, src_ns, same_ns) for peer in rule["from"]))
        for policy in selecting
        for rule in policy["spec"].get("ingress", [])
    )


def _ports(c: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}


def test_network_policies_let_the_picker_and_the_gateway_through():
    objects = gateway_objects()
    own = _component_only(objects)
    replicas = _pod_labels(objects, "palmyra-serve")
    service, deployment = _picker(objects)
    picker = deployment["spec"]["template"]["metadata"]["labels"]
    epp = deployment["spec"]["template"]["spec"]["containers"][0]
    sidecar_ports = _ports(container(pod_spec(objects), "sidecar"))
    pool, route = one(objects, "InferencePool"), one(objects, "HTTPRoute")
    scrape_port = sidecar_port(objects)
    gateway = {GATEWAY_NAME_LABEL: route["spec"]["parentRefs"][0]["name"]}
    ext_proc = _container_port(
        epp,
        next(
            p["targetPort"]
            for p in service["spec"]["ports"]
            if p["port"] == pool["spec"]["endpointPickerRef"]["port"]["number"]
        ),
    )
    metrics = int(_args(epp)["metrics-port"])
    for policies in (own, objects):  # the component's own rules suffice; with the base's, still allowed
        assert admits(policies, replicas, sidecar_ports, scrape_port, picker, NAMESPACE), "picker -> sidecar"
        for gateway_ns in (NAMESPACE, {"kubernetes.io/metadata.name": "gateway-system"}):
            assert admits(policies, replicas, sidecar_ports, scrape_port, gateway, gateway_ns), "gateway -> sidecar"
            assert admits(policies, picker, _ports(epp), ext_proc, gateway, gateway_ns), "gateway -> picker"
        assert admits(policies, picker, _ports(epp), metrics, {"app": "prometheus"}, MONITORING), "monitoring -> picker"
    # The picker itself is isolated: other pods reach neither its ext_proc nor its metrics port.
    stranger = {"app.kubernetes.io/name": "something-else"}
    assert not admits(objects, picker, _ports(epp), ext_proc, stranger, NAMESPACE)
    assert not admits(objects, picker, _ports(epp), metrics, stranger, NAMESPACE)


def test_network_policy_check_sees_a_closed_path():
    objects = gateway_objects()
    own = _component_only(objects)
    replicas = _pod_labels(objects, "palmyra-serve")
    picker = _pod_labels(objects, "palmyra-serve-epp")
    ports = _ports(container(pod_spec(objects), "sidecar"))
    assert admits(own, replicas, ports, 8080, picker, NAMESPACE)
    wrong_port = copy.deepcopy(own)
    for policy in wrong_port:
        for rule in policy["spec"].get("ingress", []) if policy["kind"] == "NetworkPolicy" else []:
            for spec in rule.get("ports", []):
                if spec["port"] == 8080:
                    spec["port"] = 8000
    assert not admits(wrong_port, replicas, ports, 8080, picker, NAMESPACE)
    assert not admits(own, replicas, ports, 8080, {"app.kubernetes.io/name": "palmyra-serve-epp"}, NAMESPACE)


# --- the picker pod --------------------------------------------------------------------------


def test_picker_pod_is_locked_down_and_pinned():
    _, deployment = _picker(gateway_objects())
    spec = deployment["spec"]["template"]["spec"]
    epp = spec["containers"][0]
    image, _, tag = epp["image"].rpartition(":")
    assert image == "ghcr.io/llm-d/llm-d-router-endpoint-picker" and tag == "v0.10.0"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert epp["securityContext"]["readOnlyRootFilesystem"] is True
    assert epp["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    args = _args(epp)
    # Unauthenticated metrics only together with pprof off (it would share that port).
    assert args["metrics-endpoint-auth"] == "false" and args["enable-pprof"] == "false"
    # One active picker: its prefix-cache index is per process.
    assert deployment["spec"]["replicas"] == 1 and "ha-enable-leader-election" not in args
    # The drain after SIGTERM (--drain-timeout, default 30 s) fits in the grace period.
    assert spec["terminationGracePeriodSeconds"] > int(args.get("drain-timeout", "30s").rstrip("s"))


# --- the documentation -----------------------------------------------------------------------

# Kinds the documentation shows whose schema is not vendored (an implementation's own CRD).
UNVALIDATED_DOC_KINDS = {("networking.istio.io/v1", "DestinationRule")}


def test_documented_examples_validate(crd_validators):
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    objects = [doc for block in blocks for doc in yaml.safe_load_all(block) if isinstance(doc, dict) and "kind" in doc]
    assert {o["kind"] for o in objects} >= {"Gateway", "InferenceObjective"}
    checked = [o for o in objects if (o["apiVersion"], o["kind"]) not in UNVALIDATED_DOC_KINDS]
    assert_valid(checked, crd_validators)
    for obj in checked:
        if obj["kind"] == "InferenceObjective":
            # It names the component's pool.
            assert obj["spec"]["poolRef"]["name"] == one(gateway_objects(), "InferencePool")["metadata"]["name"]
        if obj["kind"] == "Gateway":
            route = one(gateway_objects(), "HTTPRoute")
            assert obj["metadata"]["name"] == route["spec"]["parentRefs"][0]["name"]
