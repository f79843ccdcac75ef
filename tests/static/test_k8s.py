"""Kubernetes manifests (k8s/): every overlay renders with plain `kubectl kustomize` (no
load-restrictor flag, so `kubectl apply -k` and GitOps tools work), validates against the
Kubernetes schemas (built-in kinds) and the published CRDs (KEDA, Prometheus operator; vendored in
tests/data/schemas/crds), passes yamllint, and the rendered pod spec says what the health
and shutdown semantics of k8s/README.md need.

Monitoring and autoscaling objects are checked in test_k8s_monitoring.py, which reuses render().
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml

from palmyra_serve.sidecar.core.routes import PROBE_PATHS
from tests.helpers import deployed
from tests.helpers.deployed import loopback
from tests.helpers.k8s_manifests import (
    ASCEND,
    DNS_EGRESS,
    DOWNLOAD_EGRESS,
    EXAMPLES,
    K8S,
    K8S_VERSIONS,
    KUSTOMIZE,
    OVERLAYS,
    REMOTE,
    REPO,
    TARGET_IDS,
    TARGETS,
    assert_policy_admits_only_the_sidecar,
    assert_valid,
    config_data,
    container,
    discovered_overlays,
    engine_listener,
    env_by_name,
    need_kubectl,
    one,
    pod_spec,
    render,
    render_example,
    sidecar_listens,
    sidecar_ports,
)

ENGINE_TAG = {
    "ascend-mindcluster": "ascend",
    "ascend-mindcluster-a3": "ascend-a3",
    "ascend-mindcluster-volcano": "ascend",
    "ascend-hami": "ascend",
    "ascend-cce": "ascend",
    "nvidia": "cuda",
    "cpu": "cpu",
}
# Resource names that are not accelerators.
PLAIN_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
# What the sidecar serves on 8080 (contract: /health engine liveness, /health/sidecar its own
# liveness, /ready readiness).
SIDECAR_PORT = 8080
# The host driver's files the Ascend overlays mount beside Ascend Docker Runtime's own
# (test_ascend_deploy.py derives the set from upstream's docker run and the runtime's base.list).
ASCEND_HOST_PATHS = {"/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info"}
RESTART_OF_SIDECAR_S = 20  # upper end of a sidecar restart the engine must survive
SECRET_ENV = {  # container -> env name -> (secret key, optional)
    # vLLM reads VLLM_API_KEY itself: the key never appears on the engine's command line.
    "engine": {"VLLM_API_KEY": ("engine-api-key", False)},
    "sidecar": {"PALMYRA_ENGINE_API_KEY": ("engine-api-key", False)},  # client keys: a file, below
    "fetch-model": {"HF_TOKEN": ("hf-token", True)},
}


@pytest.mark.parametrize(("overlay", "components"), TARGETS, ids=TARGET_IDS)
def test_objects_validate_against_kubernetes_and_crd_schemas(overlay, components, crd_validators):
    assert_valid(render(overlay, components), crd_validators)


@pytest.mark.parametrize("overlay", discovered_overlays())
def test_every_overlay_renders_with_plain_kubectl_kustomize(overlay, crd_validators):
    """Exactly what a user, `kubectl apply -k` and Argo CD/Flux run: `kubectl kustomize DIR`
    with kustomize's default load restrictor, from the repository root. A file loaded from
    outside a kustomization root (the dashboards once were) fails here."""
    need_kubectl()
    command = ["kubectl", "kustomize", f"k8s/overlays/{overlay}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stderr}"
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert one(objects, "Deployment", "palmyra-serve")
    assert_valid(objects, crd_validators)


def test_every_overlay_is_covered_by_the_per_overlay_checks():
    """The per-overlay tables above (accelerator resources, engine image) list every overlay
    on disk, so a new overlay cannot skip the pod checks."""
    assert discovered_overlays() == sorted(OVERLAYS)


def test_crd_validation_rejects_a_misspelled_field(crd_validators):
    """The strict CRD check can fail: a typo the API server would silently prune is an error."""
    scaled = one(render("cpu", ("components/autoscaling-keda",)), "ScaledObject")
    validator = crd_validators[(scaled["apiVersion"], "ScaledObject")]
    assert not list(validator.iter_errors(scaled))
    scaled["spec"]["maxReplicas"] = scaled["spec"].pop("maxReplicaCount")
    assert list(validator.iter_errors(scaled))


def test_kubernetes_validation_rejects_a_misspelled_field():
    deployment = one(render("cpu"), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


def test_yamllint_passes_on_k8s():
    result = subprocess.run(
        [sys.executable, "-m", "yamllint", "--strict", "-c", str(K8S / ".yamllint.yaml"), str(K8S)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- the pod ---------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_two_regular_containers_and_the_launcher_commands(overlay):
    spec = pod_spec(render(overlay))
    assert [c["name"] for c in spec["containers"]] == ["engine", "sidecar"]
    assert [c["name"] for c in spec["initContainers"]] == ["fetch-model"]
    # No native sidecar: it would stop after the engine, the wrong order for draining.
    assert all("restartPolicy" not in c for c in spec["initContainers"])
    engine, sidecar, fetch = (container(spec, n) for n in ("engine", "sidecar", "fetch-model"))
    # Engine and fetch-model keep the image's ENTRYPOINT (CANN env): the launcher goes in args.
    assert "command" not in engine and "command" not in fetch
    assert engine["args"] == ["palmyra-serve", "engine", "--host", "127.0.0.1", "--port", "8000"]
    assert fetch["args"][:2] == ["palmyra-serve", "fetch-model"]
    assert fetch["args"][fetch["args"].index("--dest") + 1] == config_data(render(overlay))["PALMYRA_MODEL_DIR"]
    assert sidecar["command"][:2] == ["palmyra-serve", "sidecar"]
    listens = sidecar_listens(spec)
    assert listens.host == "0.0.0.0" and listens.port == SIDECAR_PORT
    # Both listeners declared, the probe port apart from the client port.
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {
        "http": SIDECAR_PORT,
        "probes": listens.probe_port,
    }
    assert listens.probe_port not in (0, SIDECAR_PORT)
    assert fetch["image"] == engine["image"]
    assert engine["image"].rsplit(":", 1)[1] == ENGINE_TAG[overlay]
    assert sidecar["image"].split("/")[-1] == "palmyra-serve-sidecar:latest"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_launcher_is_pid_1_of_the_engine_container(overlay):
    """Each container its own PID namespace: the engine image's entrypoint execs the launcher as
    its PID 1 (the image's ENTRYPOINT kept: `args`, not `command`), which ends a dead engine's
    leftovers and reaps orphans; a shared process namespace would make the pause process PID 1
    and let the sidecar see the engine's processes."""
    spec = pod_spec(render(overlay))
    assert not spec.get("shareProcessNamespace")
    engine = container(spec, "engine")
    assert "command" not in engine and engine["args"][:2] == ["palmyra-serve", "engine"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_settings_and_secrets_reach_the_right_containers(overlay):
    objects = render(overlay)
    spec, data = pod_spec(objects), config_data(objects)
    config_name = next(
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("palmyra-serve-config")
    )
    assert all(key.startswith("PALMYRA_") for key in data)
    assert data["PALMYRA_MODEL_DIR"] == "/models/palmyra-mini"
    assert data["PALMYRA_SERVED_MODEL_NAME"] == "palmyra-mini"
    for name, wanted in SECRET_ENV.items():
        c = container(spec, name)
        assert [ref["configMapRef"]["name"] for ref in c["envFrom"]] == [config_name]
        secrets = {
            k: v["valueFrom"]["secretKeyRef"]
            for k, v in env_by_name(c).items()
            if "secretKeyRef" in v.get("valueFrom", {})
        }
        assert {k: (v["key"], v.get("optional", False)) for k, v in secrets.items()} == wanted
        assert {v["name"] for v in secrets.values()} == {"palmyra-serve-secrets"}
    assert env_by_name(container(spec, "sidecar"))["PALMYRA_ENGINE_URL"]["value"] == "http://127.0.0.1:8000"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_sidecar_worst_case_memory_fits_its_limit(overlay):
    """The budget (sidecar/memory_budget.py) for the settings this overlay deploys: its ConfigMap
    (PALMYRA_PLATFORM sets the adaptive ceiling), the sidecar's env and flags, and its limit."""
    from palmyra_serve.sidecar import memory_budget

    objects = render(overlay)
    sidecar = container(pod_spec(objects), "sidecar")
    settings = deployed.sidecar_settings(config_data(objects), sidecar)
    limit = memory_budget.quantity_bytes(str(sidecar["resources"]["limits"]["memory"]))
    worst = memory_budget.worst_case(settings)
    assert worst <= limit, f"{overlay}: worst case {worst / 2**20:.0f} MiB > sidecar limit {limit / 2**20:.0f} MiB"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_client_keys_are_a_required_secret_file_that_follows_rotation(overlay):
    """An env var from a Secret is fixed at container start; a Secret volume without subPath is
    updated in place, and the sidecar re-reads the file (sidecar/tenants/keys.py). Not optional: a Secret
    without api-keys keeps the pod from starting (auth fails closed)."""
    spec = pod_spec(render(overlay))
    sidecar = container(spec, "sidecar")
    env = env_by_name(sidecar)
    assert "PALMYRA_API_KEYS" not in env, "client keys as an env var: a rotated Secret would need a restart"
    path = Path(env["PALMYRA_API_KEYS_FILE"]["value"])
    (mount,) = [m for m in sidecar["volumeMounts"] if m["mountPath"] == str(path.parent)]
    assert "subPath" not in mount and "subPathExpr" not in mount, "a subPath mount is never updated"
    assert mount.get("readOnly") is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    assert secret["secretName"] == "palmyra-serve-secrets" and not secret.get("optional", False)
    assert {"key": "api-keys", "path": path.name} in secret["items"]
    others = [
        c["name"]
        for c in spec["containers"] + spec.get("initContainers", [])
        if any(m["name"] == mount["name"] for m in c.get("volumeMounts", [])) and c is not sidecar
    ]
    assert others == [], f"the client keys are the sidecar's alone, not {others}'"


PROBE_KINDS = ("startupProbe", "livenessProbe", "readinessProbe")


def _http(probe: dict) -> tuple[str, int]:
    return probe["httpGet"]["path"], probe["httpGet"]["port"]


def _window(probe: dict) -> int:
    return probe.get("failureThreshold", 3) * probe.get("periodSeconds", 10)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_use_the_sidecar_routes_and_survive_a_sidecar_restart(overlay):
    spec = pod_spec(render(overlay))
    engine, sidecar = container(spec, "engine"), container(spec, "sidecar")
    # Every probe on the sidecar's probe port (as its command line sets it, read by the real CLI
    # parser), which serves exactly these paths: busy clients on 8080 cannot fail them.
    probe_port = sidecar_listens(spec).probe_port
    assert probe_port
    # The engine is judged by the sidecar (a hung engine still answers its own /health).
    assert _http(engine["startupProbe"]) == ("/health", probe_port)
    assert _http(engine["livenessProbe"]) == ("/health", probe_port)
    assert _http(sidecar["livenessProbe"]) == ("/health/sidecar", probe_port)
    assert _http(sidecar["readinessProbe"]) == ("/ready", probe_port)
    assert {_http(c[k])[0] for c in (engine, sidecar) for k in PROBE_KINDS if k in c} <= PROBE_PATHS
    assert "readinessProbe" not in engine  # readiness is the sidecar's /ready alone
    # The startup probe's budget is sized from the measured time to ready: test_warm_start.py.
    # A restarting sidecar refuses the engine's liveness probe: that must not restart the engine.
    assert _window(engine["livenessProbe"]) >= 3 * RESTART_OF_SIDECAR_S
    assert _window(sidecar["livenessProbe"]) < _window(engine["livenessProbe"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_engine_outlives_the_sidecar_drain(overlay):
    objects = render(overlay)
    spec, data = pod_spec(objects), config_data(objects)
    pre_stop = container(spec, "engine")["lifecycle"]["preStop"]
    if "sleep" in pre_stop:
        wait = int(pre_stop["sleep"]["seconds"])
    else:
        command = pre_stop["exec"]["command"]
        assert command[0] == "sleep" and len(command) == 2
        wait = int(command[1])
    drain = float(data["PALMYRA_DRAIN_TIMEOUT_S"])
    # Explicit in the ConfigMap: the preStop below is computed from it.
    propagation = float(data["PALMYRA_DRAIN_PROPAGATION_S"])
    assert propagation > 0  # endpoints and proxies take seconds to stop routing to a deleted pod
    # vLLM refuses new requests once it has SIGTERM: it must not get it while the sidecar still
    # serves (propagation) or drains; then it has its own --shutdown-timeout (= drain) to finish.
    assert wait >= propagation + drain
    assert spec["terminationGracePeriodSeconds"] > wait + drain
    assert "lifecycle" not in container(spec, "sidecar")  # the sidecar drains on SIGTERM itself


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_contexts(overlay):
    spec = pod_spec(render(overlay))
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert (pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]) == (1000, 1000, 1000)
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec.get("hostNetwork", False) is False and spec.get("hostPID", False) is False
    for c in spec["containers"] + spec["initContainers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
        assert not sc.get("privileged", False), c["name"]
        # A read-only root needs a writable /tmp.
        assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, c["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_volumes(overlay):
    spec = pod_spec(render(overlay))
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["model"]  # base: per-pod copy filled by fetch-model
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    assert "emptyDir" in volumes["cache"]
    mounts = {
        c["name"]: {m["mountPath"]: m for m in c["volumeMounts"]} for c in spec["containers"] + spec["initContainers"]
    }
    assert mounts["engine"]["/dev/shm"]["name"] == "shm"
    assert mounts["engine"]["/cache"]["name"] == "cache"
    assert mounts["fetch-model"]["/models"].get("readOnly", False) is False
    for name in ("engine", "sidecar"):
        assert mounts[name]["/models"]["name"] == "model"
        assert mounts[name]["/models"]["readOnly"] is True
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    # CCE's plugin brings the driver (test_ascend_deploy.py holds both sets against upstream).
    assert host_paths == (ASCEND_HOST_PATHS if overlay in ASCEND and overlay != "ascend-cce" else set())
    for m in mounts["engine"].values():
        if volumes[m["name"]].get("hostPath"):
            assert m["readOnly"] is True and m["mountPath"] == volumes[m["name"]]["hostPath"]["path"]


def _accelerators(c: dict) -> dict:
    res = c.get("resources", {})
    names = set(res.get("limits", {})) | set(res.get("requests", {}))
    return {n: res.get("limits", {}).get(n, res.get("requests", {}).get(n)) for n in names - PLAIN_RESOURCES}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_requests_exactly_its_accelerator(overlay):
    spec = pod_spec(render(overlay))
    assert _accelerators(container(spec, "engine")) == OVERLAYS[overlay]
    for name in ("sidecar", "fetch-model"):
        assert _accelerators(container(spec, name)) == {}
    # Extended resources are not overcommitted: they belong in limits.
    assert set(OVERLAYS[overlay]) <= set(container(spec, "engine")["resources"].get("limits", {}))


def _strip_accelerator(spec: dict) -> dict:
    """The pod without its device-plugin bits: scheduling fields, accelerator limits, the engine
    image tag (A2/A3) and the host driver mounts (absent on CCE)."""
    spec = copy.deepcopy(spec)
    for key in ("nodeSelector", "runtimeClassName", "schedulerName"):
        spec.pop(key, None)
    limits = container(spec, "engine")["resources"]["limits"]
    for name in set(limits) - PLAIN_RESOURCES:
        del limits[name]
    host = {v["name"] for v in spec["volumes"] if "hostPath" in v}
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in host]
    for c in spec["containers"] + spec["initContainers"]:
        c["image"] = c["image"].rsplit(":", 1)[0]
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] not in host]
    return spec


def test_ascend_overlays_differ_only_in_the_device_plugin_bits():
    specs = {name: pod_spec(render(name)) for name in ASCEND}
    assert specs["ascend-mindcluster"]["nodeSelector"] == {"workerselector": "dls-worker-node"}
    stripped = [_strip_accelerator(s) for s in specs.values()]
    assert all(s == stripped[0] for s in stripped[1:])
    ascend = specs["ascend-cce"]
    assert 1000 in ascend["securityContext"]["supplementalGroups"]  # HwHiAiUser owns the device nodes
    # vllm-ascend 0.18.0 sets it itself (and appends to an operator's value).
    assert "PYTORCH_NPU_ALLOC_CONF" not in env_by_name(container(ascend, "engine"))
    assert config_data(render("ascend-cce"))["PALMYRA_PLATFORM"] == "ascend"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_spread_and_disruption_budget(overlay):
    objects = render(overlay)
    spec = pod_spec(objects)
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    terms = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [t["podAffinityTerm"]["topologyKey"] for t in terms] == ["kubernetes.io/hostname"]
    assert terms[0]["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    pdb = one(objects, "PodDisruptionBudget")["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb.get("maxUnavailable") == 1 or pdb.get("minAvailable") is not None
    assert "replicas" not in one(objects, "Deployment")["spec"]  # the autoscaler owns it


# --- the engine is reachable only by its own sidecar ------------------------------------------


def _probe_ports(c: dict) -> list[int | str]:
    return [
        probe[kind]["port"]
        for probe in (c.get(k) for k in ("startupProbe", "livenessProbe", "readinessProbe"))
        if probe
        for kind in ("httpGet", "tcpSocket", "grpc")
        if kind in probe
    ]


def assert_engine_only_inside_the_pod(spec: dict) -> None:
    host, port = engine_listener(spec)
    assert loopback(host), f"the engine listens on {host}, not on the pod's loopback"
    engine = container(spec, "engine")
    # A containerPort would advertise a port nothing outside the pod can (or may) connect to.
    assert not engine.get("ports"), f"engine declares ports {engine['ports']}"
    assert not spec.get("hostNetwork", False)  # loopback would be the node's
    for c in spec["containers"] + spec.get("initContainers", []):
        declared = {p["containerPort"] for p in c.get("ports", [])} | {p.get("hostPort") for p in c.get("ports", [])}
        assert port not in declared, f"{c['name']} exposes the engine's port {port}"
        assert not any(p.get("hostPort") for p in c.get("ports", [])), f"{c['name']} has a hostPort"
        # The kubelet probes the pod IP: a probe on the engine's port would never pass.
        named = sidecar_ports(spec)
        for probe_port in _probe_ports(c):
            number = named.get(probe_port, probe_port) if isinstance(probe_port, str) else probe_port
            assert number != port, f"{c['name']} probes the engine's port directly"
        # The engine key travels by environment only (argv is readable in /proc by everyone).
        assert not any("api-key" in str(a) for a in c.get("args", []) + c.get("command", [])), c["name"]
    # The sidecar reaches the engine over the shared loopback, on the port the engine listens on.
    url = urlparse(env_by_name(container(spec, "sidecar"))["PALMYRA_ENGINE_URL"]["value"])
    assert loopback(url.hostname) and url.port == port, url.geturl()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_engine_listens_on_the_pod_loopback_and_declares_no_port(overlay):
    assert_engine_only_inside_the_pod(pod_spec(render(overlay)))


def test_engine_isolation_check_can_fail():
    """Each way the engine could leak out of the pod fails the check above."""
    good = pod_spec(render("cpu"))
    assert_engine_only_inside_the_pod(good)
    faults = {
        "listens on every address": lambda s: container(s, "engine")["args"].__setitem__(3, "0.0.0.0"),
        "declares its port": lambda s: container(s, "engine").__setitem__(
            "ports", [{"name": "engine-metrics", "containerPort": 8000}]
        ),
        "probed on its port": lambda s: container(s, "engine")["livenessProbe"]["httpGet"].__setitem__("port", 8000),
        "key on argv": lambda s: container(s, "engine")["args"].extend(["--api-key", "k"]),
        "sidecar aims elsewhere": lambda s: env_by_name(container(s, "sidecar"))["PALMYRA_ENGINE_URL"].__setitem__(
            "value", "http://engine:8000"
        ),
        "host network": lambda s: s.__setitem__("hostNetwork", True),
    }
    for what, fault in faults.items():
        spec = copy.deepcopy(good)
        fault(spec)
        with pytest.raises(AssertionError):
            assert_engine_only_inside_the_pod(spec)
        print(f"caught: {what}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_and_network_policy_admit_only_the_sidecar(overlay):
    assert_policy_admits_only_the_sidecar(render(overlay), DNS_EGRESS | DOWNLOAD_EGRESS)


def test_no_download_egress_component_leaves_dns_only():
    objects = render("cpu", ("components/shared-model-volume", "components/no-download-egress"))
    assert_policy_admits_only_the_sidecar(objects, DNS_EGRESS)


def test_network_policy_check_can_fail():
    good = render("cpu")
    assert_policy_admits_only_the_sidecar(good, DNS_EGRESS | DOWNLOAD_EGRESS)
    faults = {
        "engine port from monitoring": lambda p: p["ingress"].append(
            {"from": [{"namespaceSelector": {}}], "ports": [{"port": 8000, "protocol": "TCP"}]}
        ),
        "a rule for every port": lambda p: p["ingress"].append({"from": [{"podSelector": {}}]}),
        "egress not restricted": lambda p: p.__setitem__("policyTypes", ["Ingress"]),
        "egress to any port": lambda p: p["egress"].append({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}),
    }
    for what, fault in faults.items():
        objects = copy.deepcopy(good)
        fault(one(objects, "NetworkPolicy")["spec"])
        with pytest.raises(AssertionError):
            assert_policy_admits_only_the_sidecar(objects, DNS_EGRESS | DOWNLOAD_EGRESS)
        print(f"caught: {what}")


def test_shared_model_volume_component_swaps_in_a_multi_node_claim():
    objects = render("cpu", ("components/shared-model-volume",))
    model = next(v for v in pod_spec(objects)["volumes"] if v["name"] == "model")
    assert set(model) == {"name", "persistentVolumeClaim"}
    claim = one(objects, "PersistentVolumeClaim", model["persistentVolumeClaim"]["claimName"])
    # ReadWriteOnce cannot back replicas on several nodes.
    assert set(claim["spec"]["accessModes"]) <= {"ReadOnlyMany", "ReadWriteMany"}


def test_readme_documents_the_load_restrictor_flag():
    readme = (K8S / "README.md").read_text(encoding="utf-8")
    assert " ".join(KUSTOMIZE) in readme
    for overlay in OVERLAYS:
        assert f"k8s/overlays/{overlay}" in readme


@pytest.mark.parametrize("name", sorted(p.parent.name for p in EXAMPLES.glob("*/kustomization.yaml")))
def test_an_example_overlay_customises_the_remote_base_without_editing_it(name, crd_validators):
    kustomization = yaml.safe_load((EXAMPLES / name / "kustomization.yaml").read_text(encoding="utf-8"))
    # Everything of this repository comes from the remote URL: no path into the checkout.
    for entry in kustomization.get("resources", []) + kustomization.get("components", []):
        assert REMOTE.fullmatch(entry), f"{entry}: not this repository as a remote base"
    objects = render_example(name)
    assert_valid(objects, crd_validators)
    spec = pod_spec(objects)
    # Its own images, HwHiAiUser's ids and Prometheus, none of them the repository's defaults.
    for c in spec["containers"] + spec.get("initContainers", []):
        assert c["image"].startswith("registry.example.com/"), c["image"]
    context = spec["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (1001, 1001, 1001)
    assert context["supplementalGroups"] == [1001]
    scaled = one(objects, "ScaledObject")
    assert scaled["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://prometheus-k8s.monitoring.svc:9090"
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    assert {"PodMonitor", "PrometheusRule"} <= {o["kind"] for o in objects}


def test_the_remote_base_substitution_is_what_is_rendered() -> None:
    text = (EXAMPLES / "ascend-mindcluster" / "kustomization.yaml").read_text(encoding="utf-8")
    assert len(REMOTE.findall(text)) == 3
    assert REMOTE.sub("", text).count("palmyra-serve//") == 0  # no URL the substitution would miss
