"""The Kubernetes manifests (k8s/) as objects: each overlay rendered with plain `kubectl kustomize`
(optionally with opt-in components on top), the objects validated against the Kubernetes schemas
and the vendored CRDs, and the pod, Service and NetworkPolicy read the way the static and container
tiers check them. The CRD validators themselves are a fixture of the static tier
(tests/static/conftest.py)."""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from palmyra_serve.settings import Settings
from tests.helpers import kustomize
from tests.helpers.deployed import flag_value

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
# Exactly the command the READMEs give users, with kustomize's default load restrictor: no
# overlay or component may read a file outside its own kustomization root.
KUSTOMIZE = ["kubectl", "kustomize"]

# overlay -> the accelerator resources its engine asks for (limits), and nothing else.
OVERLAYS: dict[str, dict[str, int]] = {
    "ascend-mindcluster": {"huawei.com/Ascend910": 1},
    "ascend-mindcluster-a3": {"huawei.com/Ascend910": 1},
    "ascend-mindcluster-volcano": {"huawei.com/Ascend910": 1},
    # Names checked against HAMi's own device-configmap in test_ascend_deploy.py.
    "ascend-hami": {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 65536},
    "ascend-cce": {"huawei.com/ascend-1980": 1},
    "nvidia": {"nvidia.com/gpu": 1},
    "cpu": {},
}
ASCEND = [name for name in OVERLAYS if name.startswith("ascend-")]
# Oldest and newest Kubernetes the manifests claim (kubernetes-validate ships both offline).
K8S_VERSIONS = ("1.27.0", "1.37.0")
# --- rendering -------------------------------------------------------------------------------


def need_kubectl() -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not installed (its built-in kustomize renders the manifests)")


def kustomize_build(path: Path) -> tuple[dict, ...]:
    result = subprocess.run([*KUSTOMIZE, str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {path} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


@functools.cache
def _render(overlay: str, components: tuple[str, ...]) -> tuple[dict, ...]:
    target = K8S / "overlays" / overlay
    if not components:
        return kustomize_build(target)
    with tempfile.TemporaryDirectory(prefix="palmyra-k8s-") as tmp:
        return kustomize_build(kustomize.write_stack(Path(tmp), target, [K8S / c for c in components]))


def render(overlay: str, components: tuple[str, ...] = ()) -> list[dict]:
    """Rendered objects of an overlay (a fresh copy), optionally with opt-in components on top."""
    need_kubectl()
    return copy.deepcopy(list(_render(overlay, components)))


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(objects: list[dict]) -> dict:
    return one(objects, "Deployment", "palmyra-serve")["spec"]["template"]["spec"]


def container(spec: dict, name: str) -> dict:
    matches = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name]
    assert len(matches) == 1, f"container {name}"
    return matches[0]


def config_data(objects: list[dict]) -> dict:
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("palmyra-serve-config")]
    assert len(maps) == 1
    return maps[0]["data"]


# The opt-in components whose kinds need CRDs: the Prometheus operator's and KEDA's.
OPT_IN = ("monitoring", "components/autoscaling-keda")
# API groups every cluster has: an overlay alone uses only these.
CORE_API_GROUPS = {"v1", "apps", "policy", "autoscaling", "networking.k8s.io"}

# Every overlay, alone and with the CRD-backed opt-ins, plus the other components on the CPU overlay.
TARGETS = (
    [(name, ()) for name in OVERLAYS]
    + [(name, OPT_IN) for name in OVERLAYS if name != "cpu"]
    + [
        ("cpu", ("components/shared-model-volume",)),
        ("cpu", ("components/autoscaling-keda",)),
        ("cpu", ("components/shared-model-volume", "components/no-download-egress")),
        ("cpu", ("monitoring",)),
        # Tenants' quotas through a Redis (core APIs only; test_tenants_deploy.py checks the rest).
        ("cpu", ("components/tenants",)),
        ("cpu", ("components/tenants", "components/tenants/tls")),
        # Traces to a collector (core APIs only; test_tracing_deploy.py checks the rest).
        ("cpu", ("components/tracing",)),
    ]
)
TARGET_IDS = [name + "".join("+" + Path(c).name for c in comps) for name, comps in TARGETS]


# --- schemas ---------------------------------------------------------------------------------


def strict_schema(schema: object) -> object:
    """A CRD schema with additionalProperties: false wherever it lists properties and does not
    preserve unknown fields: the API server prunes (drops) unknown fields silently, which is
    exactly the typo this test is for."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: strict_schema(v) if k in ("items", "additionalProperties", "allOf", "anyOf", "oneOf", "not") else v
        for k, v in schema.items()
    }
    if "properties" in schema:
        out["properties"] = {k: strict_schema(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


class CrdLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a bare `=` is the string "=": YAML 1.1's `value` tag,
    which PyYAML resolves it to, is a string to Kubernetes' YAML parser (the AlertmanagerConfig
    CRD lists `=` among its matchers' operators)."""


CrdLoader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_yaml_str)


def load_crd(path: Path) -> dict:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=CrdLoader)  # a SafeLoader subclass


def _is_builtin(obj: dict) -> bool:
    try:
        kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)
    except kubernetes_validate.utils.SchemaNotFoundError:
        return False
    except kubernetes_validate.ValidationError:
        pass
    return True


def assert_valid(objects: list[dict], crd_validators: dict) -> None:
    """Every object is valid for the oldest and newest Kubernetes claimed (built-in kinds) or
    for its CRD (custom kinds); a custom kind without a vendored CRD is an error."""
    for obj in objects:
        label = f"{obj['kind']}/{obj['metadata']['name']}"
        if _is_builtin(obj):
            for version in K8S_VERSIONS:
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except kubernetes_validate.ValidationError as err:
                    pytest.fail(f"{label} invalid for Kubernetes {version}: {err.message} at {list(err.path)}")
        else:
            key = (obj["apiVersion"], obj["kind"])
            assert key in crd_validators, f"{label}: no schema to validate {key} against"
            errors = [f"{e.message} at {list(e.path)}" for e in crd_validators[key].iter_errors(obj)]
            assert not errors, f"{label} violates its CRD: {errors}"


def discovered_overlays() -> list[str]:
    return sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))


def env_by_name(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


# What the pod may reach: name resolution, and HTTPS for fetch-model's download.
DNS_EGRESS = {(53, "UDP"), (53, "TCP")}
DOWNLOAD_EGRESS = {(443, "TCP")}


def engine_listener(spec: dict) -> tuple[str, int]:
    """(host, port) the engine's vLLM listens on, from its launcher args."""
    args = container(spec, "engine")["args"]
    return flag_value(args, "--host"), int(flag_value(args, "--port"))


def sidecar_ports(spec: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container(spec, "sidecar")["ports"]}


def sidecar_listens(spec: dict) -> Settings:
    """The sidecar's settings as its container command sets them, through the real CLI parser
    (the ConfigMap's PALMYRA_* apply too, but set no listener)."""
    from palmyra_serve.cli import _settings, build_parser

    command = container(spec, "sidecar")["command"]
    assert command[0] == "palmyra-serve"
    return _settings(build_parser().parse_args(command[1:]))


def rule_ports(rule: dict) -> set[tuple[int | str, str]]:
    # A rule without `ports` admits every port: never allowed here.
    assert rule.get("ports"), f"a rule without ports opens every port: {rule}"
    return {(p["port"], p.get("protocol", "TCP")) for p in rule["ports"]}


def assert_policy_admits_only_the_sidecar(objects: list[dict], egress_allowed: set[tuple[int, str]]) -> None:
    spec = pod_spec(objects)
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    sidecar = sidecar_ports(spec)
    service = one(objects, "Service", "palmyra-serve")["spec"]
    assert service["selector"].items() <= labels.items()
    # The Service forwards to the sidecar's ports only (by name or number).
    assert {sidecar.get(p["targetPort"], p["targetPort"]) for p in service["ports"]} == {8080}
    # ... and never to the probe port, which the kubelet reaches from the node (NetworkPolicy
    # always admits a node's traffic to its own pods) and no client needs.
    assert set(sidecar.values()) == {8080, sidecar_listens(spec).probe_port}
    policy = one(objects, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    ingress = set().union(*(rule_ports(r) for r in policy["ingress"]))
    assert ingress == {(8080, "TCP")}, f"ingress admits {ingress}"
    egress = set().union(*(rule_ports(r) for r in policy.get("egress", [])))
    assert egress == egress_allowed, f"egress admits {egress}"


# --- an operator's own overlay on this repository as a remote base --------------------------------

EXAMPLES = K8S / "examples"
# How the examples name this repository: a kustomize remote URL to a directory under k8s/.
REMOTE = re.compile(r"https://github\.com/[\w.-]+/palmyra-serve//(k8s/[^?\s]+)\?ref=[\w.-]+")


def render_example(name: str) -> list[dict]:
    """The example as kustomize renders it, its remote URLs replaced by this checkout's directories
    (nothing remote can be fetched here; kustomize takes relative paths only)."""
    need_kubectl()
    with tempfile.TemporaryDirectory(prefix="palmyra-example-") as tmp:
        copy_dir = Path(tmp) / name
        shutil.copytree(EXAMPLES / name, copy_dir)
        text = (copy_dir / "kustomization.yaml").read_text(encoding="utf-8")
        local = REMOTE.sub(lambda m: os.path.relpath(REPO / m.group(1), copy_dir), text)
        (copy_dir / "kustomization.yaml").write_text(local, encoding="utf-8")
        return copy.deepcopy(list(kustomize_build(copy_dir)))


# --- autoscaling -----------------------------------------------------------------------------

# The CPU overlay with KEDA's ScaledObject in place of the HorizontalPodAutoscaler.
KEDA = ("cpu", ("components/autoscaling-keda",))


def scaledobject() -> dict:
    return one(render(*KEDA), "ScaledObject")


def hpa() -> dict:
    return one(render("cpu"), "HorizontalPodAutoscaler")


# --- egress of the replicas -------------------------------------------------------------------

REDIS_PORT = 6379
REDIS_EGRESS = {(REDIS_PORT, "TCP")}


def _selects(policy: dict, labels: dict) -> bool:
    return policy["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()


def egress_of_the_replicas(objects: list[dict]) -> dict[tuple[int | str, str], list[dict]]:
    """(port, protocol) -> the peers of each rule that lets the replicas' pods connect there, over
    every NetworkPolicy that selects them and restricts their egress (policies add up)."""
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    out: dict[tuple[int | str, str], list[dict]] = {}
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        if not _selects(policy, labels) or "Egress" not in policy["spec"]["policyTypes"]:
            continue
        for rule in policy["spec"].get("egress", []):
            assert rule.get("ports"), f"{policy['metadata']['name']}: a rule without ports opens every port"
            for port in rule["ports"]:
                out.setdefault((port["port"], port.get("protocol", "TCP")), []).append(rule.get("to", []))
    return out
