"""Tenants and quotas as the deployments wire them (docs/tenants.md is the file format).

Compose: the tenants file's directory mounted read-only into the sidecar; the opt-in `quota-redis`
service (profile `tenants`) with its password from a Compose secret file the operator creates,
written into a config file at start (its entrypoint script is run here, against stand-ins for
redis-server and chown) and never on a command line or in an environment variable, no published
port; compose/quota-redis.override.yml pointing the sidecar at it, as podman-compose (the pinned
tool the container tier runs) merges and resolves the two files.

Kubernetes: k8s/components/tenants (and its tls/ sub-component) rendered with the real kustomize
on top of an overlay, as an operator's own overlay stacks them, validated like every other
target, and checked for what the sidecar then needs: the tenants ConfigMap and the Redis password
Secret mounted as files (never environment variables), the settings as the real Settings class
reads them, PALMYRA_QUOTA_REPLICAS equal to the autoscaler's maximum, and the NetworkPolicy egress
to Redis on TCP 6379, to the Redis pods only.
"""

from __future__ import annotations

import copy
import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from palmyra_serve.sidecar.tenants import config as tenants_config
from tests.helpers import deployed, kustomize
from tests.helpers.compose_files import (
    COMPOSE,
    COMPOSE_DIR,
    TEST_ENGINE_KEY,
    env_of,
    load,
    podman_compose_run,
    volume_targets,
)
from tests.helpers.k8s_manifests import (
    CORE_API_GROUPS,
    DNS_EGRESS,
    DOWNLOAD_EGRESS,
    K8S,
    REDIS_EGRESS,
    REDIS_PORT,
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

OVERRIDE = COMPOSE_DIR / "quota-redis.override.yml"
EXAMPLE = COMPOSE_DIR / "tenants" / "tenants.example.yaml"
REDIS = "quota-redis"
SECRET = "quota-redis-password"
TENANTS_DIR = "/etc/palmyra/tenants"  # where the sidecar sees compose/tenants/

COMPONENT = "components/tenants"
TLS = "components/tenants/tls"
COMPONENT_DIR = K8S / COMPONENT
PASSWORD_SECRET = "palmyra-serve-quota-redis"
CA_SECRET = "palmyra-serve-quota-redis-ca"
TENANTS_CONFIGMAP = "palmyra-serve-tenants"


# --- Compose ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return load(COMPOSE)["services"]


def test_the_sidecar_sees_the_tenants_directory_read_only(services: dict[str, Any]) -> None:
    # The directory, not the file: an editor that replaces the file gives it a new inode, which a
    # bind mount of the file itself would never show. Unused until PALMYRA_TENANTS_FILE names it.
    assert volume_targets(services["sidecar"])[TENANTS_DIR] == "./compose/tenants:ro"
    assert (REPO / "compose" / "tenants").is_dir()
    assert env_of(services["sidecar"])["PALMYRA_TENANTS_FILE"] == "${PALMYRA_TENANTS_FILE:-}"
    # Nobody else gets it.
    others = [name for name, s in services.items() if name != "sidecar" and TENANTS_DIR in volume_targets(s)]
    assert others == []


def test_the_example_tenants_file_parses_and_holds_only_placeholder_digests() -> None:
    tenants = tenants_config.read(EXAMPLE)
    assert {"default", "search"} <= set(tenants.by_name)
    assert tenants.by_digest, "an example with keys, so the format shows"
    # Placeholders no key hashes to (a digest of a known word would be a key everyone knows).
    for digest in tenants.by_digest:
        assert int.from_bytes(digest, "big") < 2**16, f"not an obvious placeholder: {digest.hex()}"
    # The file the Kubernetes component ships names no tenant: nothing changes until the
    # operator's own file replaces it.
    shipped = tenants_config.read(COMPONENT_DIR / "tenants.yaml")
    assert set(shipped.by_name) == {"default"} and not shipped.by_digest
    assert shipped.spec("default").tokens_per_minute is None


def test_quota_redis_is_opt_in_unpublished_and_pinned(services: dict[str, Any]) -> None:
    redis = services[REDIS]
    assert redis["profiles"] == ["tenants"]
    assert not redis.get("ports") and not redis.get("expose"), "no port leaves the project network"
    assert "network_mode" not in redis and "networks" not in redis
    image = redis["image"]
    name, _, tag = image.rpartition(":")
    assert name == "redis" and re.fullmatch(r"\d+\.\d+\.\d+-alpine", tag), image
    assert redis["read_only"] is True and {"/tmp", "/data"} <= set(redis["tmpfs"])
    assert "no-new-privileges:true" in redis["security_opt"]
    assert "volumes" not in redis, "no persistence: the windows last a minute"
    # Nothing of the default stack depends on it.
    for name, service in services.items():
        assert REDIS not in service.get("depends_on", {}), name


def test_the_redis_password_is_a_compose_secret_file_the_operator_creates(services: dict[str, Any]) -> None:
    compose = load(COMPOSE)
    path = compose["secrets"][SECRET]["file"]  # beside the other operator-created files (Alertmanager's URL)
    assert path == f"./compose/secrets/{SECRET}"
    # Never shipped: not in the repository, and Git ignores the directory it goes in.
    tracked = subprocess.run(
        ["git", "ls-files", "compose/secrets"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert tracked == ""
    ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, check=False)
    assert ignored.returncode == 0, f"{path} is not ignored by Git"
    redis = services[REDIS]
    assert redis["secrets"] == [SECRET]
    # Never in an environment variable or on a command line: no service carries it but by the file.
    for name, service in services.items():
        for key in env_of(service):
            assert "REDIS_PASSWORD" not in key or key.endswith("_FILE"), (name, key)
    script = redis["command"][0]
    assert redis["entrypoint"] == ["/bin/sh", "-ec"]
    assert "--requirepass" not in script and "REDIS_PASSWORD" not in script
    assert f"/run/secrets/{SECRET}" in script


def _entrypoint(services: dict[str, Any], tmp_path: Path, password: str | None) -> subprocess.CompletedProcess[str]:
    """quota-redis's entrypoint script as the container's shell runs it (Compose's `$$` already
    `$`), its absolute paths moved under tmp_path and redis-server and chown replaced by stand-ins
    that record what they were given."""
    script = services[REDIS]["command"][0].replace("$$", "$")
    secret = tmp_path / "secret"
    if password is not None:
        secret.write_text(password)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool, body in {
        "docker-entrypoint.sh": f'printf "%s\\n" "$@" > {tmp_path}/argv\n',
        "chown": f'printf "%s\\n" "$@" > {tmp_path}/chown\n',
    }.items():
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}")
        (bin_dir / tool).chmod(0o755)
    script = script.replace(f"/run/secrets/{SECRET}", str(secret)).replace("/tmp/redis.conf", str(tmp_path / "conf"))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(["/bin/sh", "-ec", script], capture_output=True, text=True, env=env, timeout=30, check=False)


def test_the_entrypoint_writes_the_password_into_a_private_config_file(
    services: dict[str, Any], tmp_path: Path
) -> None:
    password = "0123456789abcdef" * 4
    run = _entrypoint(services, tmp_path, password + "\n")
    assert run.returncode == 0, run.stderr
    # redis-server, through the image's own entrypoint (it drops to the redis user), with the
    # config file as its one argument: the password is on no command line.
    assert (tmp_path / "argv").read_text().split() == ["redis-server", str(tmp_path / "conf")]
    conf = tmp_path / "conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    lines = conf.read_text().splitlines()
    assert f"requirepass {password}" in lines
    # No persistence; a bounded memory that refuses writes instead of evicting a window.
    assert {'save ""', "appendonly no", "maxmemory-policy noeviction"} <= set(lines)
    assert not [line for line in lines if line.split()[0] in ("port", "bind", "protected-mode")]
    assert (tmp_path / "chown").read_text().split() == ["redis:redis", str(conf)]
    assert password not in run.stdout + run.stderr


@pytest.mark.parametrize(
    "password",
    [None, "", "\n", "short-but-ok", 'has"quote-and-is-long-enough', "has space and is long enough", "a\nb" * 8],
    ids=["no-file", "empty", "newline", "short", "quote", "space", "two-lines"],
)
def test_the_entrypoint_refuses_a_missing_or_unusable_password(
    services: dict[str, Any], tmp_path: Path, password: str | None
) -> None:
    run = _entrypoint(services, tmp_path, password)
    assert run.returncode != 0
    assert not (tmp_path / "argv").exists(), "redis-server started anyway"
    assert not (tmp_path / "conf").exists()


def test_the_healthcheck_authenticates_from_the_file(services: dict[str, Any]) -> None:
    test = services[REDIS]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    # redis-cli reads REDISCLI_AUTH: no -a PASSWORD on its command line.
    assert "REDISCLI_AUTH=" in test[1] and f"/run/secrets/{SECRET}" in test[1] and " -a " not in test[1]


def _resolved(*files: Path, profiles: str) -> dict[str, Any]:
    # As the docs run it: COMPOSE_PROFILES from the shell (with the engine's profile, cpu).
    result = podman_compose_run(
        *files, profile="cpu", COMPOSE_PROFILES=profiles, PALMYRA_ENGINE_API_KEY=TEST_ENGINE_KEY
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return yaml.safe_load(result.stdout)


def test_without_the_profile_the_stack_is_unchanged() -> None:
    services = _resolved(COMPOSE, profiles="cpu")["services"]
    assert REDIS not in services
    sidecar = services["sidecar"]
    assert not sidecar.get("secrets")
    assert sidecar["environment"]["PALMYRA_QUOTA_REDIS_URL"] == ""
    assert set(sidecar["depends_on"]) == {"pod"}


def test_the_override_points_the_sidecar_at_quota_redis() -> None:
    project = _resolved(COMPOSE, OVERRIDE, profiles="cpu,tenants")
    services = project["services"]
    sidecar, redis = services["sidecar"], services[REDIS]
    env = sidecar["environment"]
    url = urlparse(env["PALMYRA_QUOTA_REDIS_URL"])
    # The service's name on the project network (the sidecar is in `pod`'s namespace, which is on
    # it), Redis's own port, no password in the URL.
    assert (url.scheme, url.hostname, url.port) == ("redis", REDIS, REDIS_PORT)
    assert url.password is None and url.username is None
    # The same Compose secret as quota-redis's, as a file where Compose puts it.
    assert SECRET in sidecar["secrets"] and SECRET in redis["secrets"]
    assert env["PALMYRA_QUOTA_REDIS_PASSWORD_FILE"] == f"/run/secrets/{SECRET}"
    assert project["secrets"][SECRET]["file"].endswith(f"compose/secrets/{SECRET}")
    assert sidecar["depends_on"][REDIS] == {"condition": "service_started"}
    assert not redis.get("ports")
    # The settings reach the sidecar as the real Settings class reads them; the engine gets no secret.
    settings = deployed.sidecar_settings({k: str(v) for k, v in env.items()}, {"command": ["palmyra-serve", "sidecar"]})
    assert settings.quota_redis_url == env["PALMYRA_QUOTA_REDIS_URL"]
    assert str(settings.quota_redis_password_file) == f"/run/secrets/{SECRET}"
    assert not services["engine-cpu"].get("secrets")


def test_the_override_names_only_settings_and_declared_secrets() -> None:
    override = load(OVERRIDE)
    assert set(override["services"]) == {"sidecar"}
    declared = set(load(COMPOSE)["secrets"])
    assert set(override["services"]["sidecar"]["secrets"]) <= declared


# --- Kubernetes -------------------------------------------------------------------------------------

# The component alone, with TLS, with KEDA instead of the HPA, and beside the egress-narrowing one.
K8S_TARGETS = [
    ("cpu", (COMPONENT,)),
    ("cpu", (COMPONENT, TLS)),
    ("cpu", ("components/autoscaling-keda", COMPONENT)),
    ("cpu", ("components/shared-model-volume", "components/no-download-egress", COMPONENT)),
    ("nvidia", ("monitoring", "components/autoscaling-keda", COMPONENT, TLS)),
    ("ascend-mindcluster", (COMPONENT,)),
]
K8S_IDS = [name + "".join("+" + c.removeprefix("components/") for c in comps) for name, comps in K8S_TARGETS]


@pytest.mark.parametrize(("overlay", "components"), K8S_TARGETS, ids=K8S_IDS)
def test_the_component_renders_and_validates(overlay, components, crd_validators):
    objects = render(overlay, components)
    assert_valid(objects, crd_validators)
    if "monitoring" not in components and "components/autoscaling-keda" not in components:
        groups = {o["apiVersion"].rpartition("/")[0] or "v1" for o in objects}
        assert groups <= CORE_API_GROUPS, groups - CORE_API_GROUPS


def _mount_of(spec: dict, container_name: str, path: str) -> tuple[dict, dict]:
    """The read-only, non-subPath mount of `container_name` that holds the file `path`, and its volume."""
    c = container(spec, container_name)
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(Path(path).parent)]
    assert mount.get("readOnly") is True
    assert "subPath" not in mount and "subPathExpr" not in mount, "a subPath mount is never updated"
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    users = [
        x["name"]
        for x in spec["containers"] + spec.get("initContainers", [])
        if any(m["name"] == mount["name"] for m in x.get("volumeMounts", []))
    ]
    assert users == [container_name], f"{mount['name']} is the {container_name}'s alone, not {users}'s"
    return mount, volume


def _no_env_reads(spec: dict, secret: str) -> None:
    for c in spec["containers"] + spec.get("initContainers", []):
        for e in c.get("env", []):
            assert e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") != secret, (c["name"], e["name"])
        for ref in c.get("envFrom", []):
            assert ref.get("secretRef", {}).get("name") != secret, c["name"]


def _autoscaler_max(objects: list[dict]) -> int:
    scaled = [o for o in objects if o["kind"] == "ScaledObject"]
    if scaled:
        return int(scaled[0]["spec"]["maxReplicaCount"])
    return int(one(objects, "HorizontalPodAutoscaler")["spec"]["maxReplicas"])


@pytest.mark.parametrize(("overlay", "components"), K8S_TARGETS, ids=K8S_IDS)
def test_the_sidecar_gets_the_tenants_file_and_the_redis_password_as_files(overlay, components):
    objects = render(overlay, components)
    spec, data = pod_spec(objects), config_data(objects)
    sidecar = container(spec, "sidecar")
    env = {k: v["value"] for k, v in env_by_name(sidecar).items() if "value" in v}

    # The tenants file: the ConfigMap, no hash suffix (an edit is re-read in place, no rollout).
    tenants_file = env["PALMYRA_TENANTS_FILE"]
    _, volume = _mount_of(spec, "sidecar", tenants_file)
    assert volume["configMap"]["name"] == TENANTS_CONFIGMAP
    configmap = one(objects, "ConfigMap", TENANTS_CONFIGMAP)
    shipped = tenants_config.parse(configmap["data"][Path(tenants_file).name], "the ConfigMap")
    assert not shipped.by_digest

    # The Redis password: a required Secret, mounted as a file, in no environment variable.
    password_file = env["PALMYRA_QUOTA_REDIS_PASSWORD_FILE"]
    _, volume = _mount_of(spec, "sidecar", password_file)
    assert volume["secret"]["secretName"] == PASSWORD_SECRET and not volume["secret"].get("optional", False)
    assert {"key": "password", "path": Path(password_file).name} in volume["secret"]["items"]
    _no_env_reads(spec, PASSWORD_SECRET)

    # The URL names no password; its scheme says TLS exactly when the CA bundle is given.
    url = urlparse(data["PALMYRA_QUOTA_REDIS_URL"])
    assert url.password is None and url.hostname and url.port == REDIS_PORT
    if TLS in components:
        assert components.index(TLS) > components.index(COMPONENT)
        assert url.scheme == "rediss"
        ca_file = env["PALMYRA_QUOTA_REDIS_CA_FILE"]
        _, volume = _mount_of(spec, "sidecar", ca_file)
        assert volume["secret"]["secretName"] == CA_SECRET
        assert {"key": "ca.crt", "path": Path(ca_file).name} in volume["secret"]["items"]
        _no_env_reads(spec, CA_SECRET)
    else:
        assert url.scheme == "redis" and "PALMYRA_QUOTA_REDIS_CA_FILE" not in env

    # While Redis is away each replica enforces 1/replicas: never more replicas than that.
    assert int(data["PALMYRA_QUOTA_REPLICAS"]) == _autoscaler_max(objects)

    # As the sidecar reads them: the real Settings class, from the ConfigMap and its env.
    settings = deployed.sidecar_settings(data, sidecar)
    assert str(settings.tenants_file) == tenants_file
    assert str(settings.quota_redis_password_file) == password_file
    assert settings.quota_redis_url == data["PALMYRA_QUOTA_REDIS_URL"]
    assert settings.quota_replicas == _autoscaler_max(objects)
    # File paths belong to the sidecar, whose mounts they name: not in the ConfigMap every
    # container reads.
    assert not {"PALMYRA_TENANTS_FILE", "PALMYRA_QUOTA_REDIS_PASSWORD_FILE"} & set(data)


def assert_redis_egress_only(objects: list[dict], others: set[tuple[int, str]]) -> None:
    egress = egress_of_the_replicas(objects)
    assert set(egress) == others | REDIS_EGRESS, f"egress admits {set(egress)}"
    # 6379 to the Redis pods only: a namespace and a pod selector, no address range.
    for peers in egress[(REDIS_PORT, "TCP")]:
        assert peers, "6379 to anywhere"
        for peer in peers:
            assert "ipBlock" not in peer, peer
            assert peer.get("namespaceSelector", {}).get("matchLabels"), peer
            assert peer.get("podSelector", {}).get("matchLabels"), peer


@pytest.mark.parametrize(("overlay", "components"), K8S_TARGETS, ids=K8S_IDS)
def test_the_network_policy_lets_the_replicas_reach_redis_and_nothing_more(overlay, components):
    objects = render(overlay, components)
    others = DNS_EGRESS if "components/no-download-egress" in components else DNS_EGRESS | DOWNLOAD_EGRESS
    assert_redis_egress_only(objects, others)
    # The base policy itself is unchanged: ingress to the sidecar's port only, its own egress.
    base = [o for o in objects if o["kind"] != "NetworkPolicy" or o["metadata"]["name"] == "palmyra-serve"]
    assert_policy_admits_only_the_sidecar(base, others)


def test_the_redis_egress_check_can_fail():
    good = render("cpu", (COMPONENT,))
    assert_redis_egress_only(good, DNS_EGRESS | DOWNLOAD_EGRESS)
    faults = {
        "no 6379": lambda p: p["egress"][0]["ports"][0].__setitem__("port", 6380),
        "6379 to anywhere": lambda p: p["egress"][0].pop("to"),
        "to an address range": lambda p: p["egress"][0].__setitem__("to", [{"ipBlock": {"cidr": "0.0.0.0/0"}}]),
        "every port": lambda p: p["egress"][0].pop("ports"),
        "ingress only": lambda p: p.__setitem__("policyTypes", ["Ingress"]),
    }
    for what, fault in faults.items():
        objects = copy.deepcopy(good)
        fault(one(objects, "NetworkPolicy", "palmyra-serve-quota-redis")["spec"])
        with pytest.raises(AssertionError):
            assert_redis_egress_only(objects, DNS_EGRESS | DOWNLOAD_EGRESS)
        print(f"caught: {what}")


def test_an_operator_overlay_replaces_the_tenants_file_and_the_redis_address(crd_validators):
    """What k8s/README.md tells operators to write: patches in their own overlay (an overlay's own
    configMapGenerator runs before its components, so a merge there would lose to the component's)."""
    mine = "tenants:\n  - name: default\n    tokens_per_minute: 1000\n"
    url = "rediss://valkey-primary.cache.svc:6379/0"
    patches = [
        {"patch": yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})}
        for name, data in (
            (TENANTS_CONFIGMAP, {"tenants.yaml": mine}),
            ("palmyra-serve-config", {"PALMYRA_QUOTA_REDIS_URL": url}),
        )
    ]
    with tempfile.TemporaryDirectory(prefix="palmyra-tenants-") as tmp:
        stack = kustomize.write_stack(Path(tmp), K8S / "overlays" / "cpu", [K8S / COMPONENT, K8S / TLS])
        doc = yaml.safe_load((stack / "kustomization.yaml").read_text())
        doc["patches"] = patches
        (stack / "kustomization.yaml").write_text(yaml.safe_dump(doc))
        objects = list(kustomize_build(stack))
    assert_valid(objects, crd_validators)
    assert one(objects, "ConfigMap", TENANTS_CONFIGMAP)["data"]["tenants.yaml"] == mine
    assert config_data(objects)["PALMYRA_QUOTA_REDIS_URL"] == url
    # The ConfigMap name the pod reads is the one patched (no hash suffix to miss).
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    assert any(v.get("configMap", {}).get("name") == TENANTS_CONFIGMAP for v in volumes.values())


def test_the_component_reads_only_files_inside_its_root():
    # kustomize's default load restrictor, as `kubectl apply -k` and GitOps tools run it.
    for kustomization in (COMPONENT_DIR / "kustomization.yaml", COMPONENT_DIR / "tls" / "kustomization.yaml"):
        doc = yaml.safe_load(kustomization.read_text())
        assert doc["kind"] == "Component"
        named = [p["path"] for p in doc.get("patches", []) if "path" in p] + doc.get("resources", [])
        named += [f for g in doc.get("configMapGenerator", []) for f in g.get("files", [])]
        for name in named:
            assert (kustomization.parent / name).resolve().is_relative_to(kustomization.parent), name


# --- docs --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        (
            REPO / "compose" / "README.md",
            ["quota-redis.override.yml", "COMPOSE_PROFILES=cpu,tenants", "compose/secrets/", SECRET],
        ),
        (REPO / "k8s" / "README.md", ["k8s/components/tenants", PASSWORD_SECRET, CA_SECRET, "PALMYRA_QUOTA_REPLICAS"]),
    ],
    ids=["compose", "k8s"],
)
def test_the_deployment_docs_have_a_tenants_section(doc: Path, names: list[str]) -> None:
    text = doc.read_text(encoding="utf-8")
    assert "## Tenants and quotas" in text
    section = text.split("## Tenants and quotas", 1)[1].split("\n## ", 1)[0]
    assert "docs/tenants.md" in section
    for name in names:
        assert name in section, f"{doc.name}: {name}"
