"""docker-compose.yml and compose/*: the real linters, the Compose spec schema, then the file
parsed with PyYAML and held against vllm-ascend's own `docker run`, the sidecar's HTTP surface, the
Dockerfile (same command, paths and env names) and the Prometheus scrape targets; the network
layout (engine on the loopback of a namespace only the sidecar shares) also as podman-compose
itself merges and resolves it.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from palmyra_serve.sidecar.core.routes import PROBE_PATHS
from tests.helpers import deployed
from tests.helpers.compose_files import (
    COMPOSE,
    COMPOSE_DIR,
    HOLDER,
    REPO,
    TEST_ENGINE_KEY,
    TEST_GRAFANA_PASSWORD,
    ComposeLoader,
    env_of,
    load,
    podman_compose_config,
    podman_compose_run,
    tool,
    volume_targets,
)
from tests.helpers.deployed import flag_value, loopback
from tests.helpers.dockerfile import ENGINE_CMD, parse_dockerfile

OVERRIDES = sorted(COMPOSE_DIR.glob("*.yml"))
SIDECAR_PATHS = PROBE_PATHS  # what the sidecar's probe port serves
ASCEND_DEVICES = ["/dev/davinci${PALMYRA_NPU_DEVICES:-0}", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
ASCEND_DRIVER = [  # vllm-ascend's `docker run` mounts but npu-smi (test_ascend_deploy.py says why)
    "/usr/local/dcmi",
    "/usr/local/Ascend/driver/lib64/",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
]
PROBE = "/opt/palmyra/healthchecks/http_probe.py"
IN_POD = ("engine", "engine-cpu", "sidecar")  # the services that join it
ENGINE_PORT, SIDECAR_PORT = 8000, 8080
# The engine's launcher command as the image runs it, bound to the namespace's loopback.
LOOPBACK_ENGINE_CMD = [
    *ENGINE_CMD[: ENGINE_CMD.index("--host") + 1],
    "127.0.0.1",
    *ENGINE_CMD[ENGINE_CMD.index("--host") + 2 :],
]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load(COMPOSE)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def probe_url(service: dict[str, Any]) -> str | None:
    test = service.get("healthcheck", {}).get("test")
    if not test or PROBE not in test:
        return None
    return test[test.index(PROBE) + 1]


def url_path(url: str) -> str:
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


# --- linters and schema --------------------------------------------------------------------------


def test_yamllint_strict() -> None:
    result = subprocess.run(
        [tool("yamllint"), "--strict", "-c", str(COMPOSE_DIR / "yamllint.yaml"), str(COMPOSE), str(COMPOSE_DIR)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", [COMPOSE, *OVERRIDES], ids=lambda p: p.name)
def test_compose_spec_schema(path: Path, tmp_path: Path) -> None:
    # check-jsonschema's YAML loader does not know Compose's !reset/!override: validate the
    # loaded document (as JSON, resets applied) so override files are checked too.
    doc = tmp_path / f"{path.stem}.json"
    doc.write_text(json.dumps(load(path)))
    result = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(doc)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"services": {"x": {"image": "a", "restart": "sometimes", "shm_size": []}}}))
    result = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0


# --- the one switch: profiles ---------------------------------------------------------------------


def test_profiles_pick_exactly_one_engine(services: dict[str, Any]) -> None:
    assert services["engine"]["profiles"] == ["ascend"]
    assert services["engine-cpu"]["profiles"] == ["cpu"]
    # Services without a profile run in both setups and must not need a profile-bound one.
    for name, service in services.items():
        if not service.get("profiles"):
            for dep in service.get("depends_on", {}):
                assert not services[dep].get("profiles"), f"{name} depends on profile-bound {dep}"


@pytest.mark.parametrize(("env_file", "profile"), [("ascend.env", "ascend"), ("cpu.env", "cpu")])
def test_env_examples_set_the_switch(env_file: str, profile: str) -> None:
    lines = (COMPOSE_DIR / env_file).read_text().splitlines()
    values = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert values["COMPOSE_PROFILES"] == profile
    # No usable placeholder shipped: the engine key and Grafana's password are empty and Compose
    # requires them (below).
    assert values["PALMYRA_ENGINE_API_KEY"] == "" and values["GRAFANA_ADMIN_PASSWORD"] == ""
    assert values["PALMYRA_BIND"] == "127.0.0.1"
    # The sidecar sizes admission's ceiling by the platform: the env file tells it, as the engine.
    assert values["PALMYRA_PLATFORM"] == profile


@pytest.mark.parametrize(("engine", "init"), [("engine", "model-init"), ("engine-cpu", "model-init-cpu")])
def test_model_init_fills_the_volume_first(services: dict[str, Any], engine: str, init: str) -> None:
    assert services[engine]["depends_on"][init] == {"condition": "service_completed_successfully"}
    init_service = services[init]
    assert init_service["image"] == services[engine]["image"]
    assert init_service["profiles"] == services[engine]["profiles"]
    assert init_service["restart"] == "no"
    command = init_service["command"]
    assert command[:2] == ["palmyra-serve", "fetch-model"]
    assert command[command.index("--dest") + 1] == "/models/palmyra-mini"
    assert volume_targets(init_service)["/models"] == "models"


# --- Ascend facts -----------------------------------------------------------------------------------


def test_ascend_engine_devices_driver_and_shm(services: dict[str, Any]) -> None:
    engine = services["engine"]
    assert engine["image"].endswith("palmyra-serve-engine:ascend}")
    assert engine["devices"] == ASCEND_DEVICES
    mounts = volume_targets(engine)
    for path in ASCEND_DRIVER:
        assert mounts.get(path) == f"{path}:ro", f"driver path {path} not mounted read-only"
    assert not [target for target in mounts if target.endswith("/npu-smi")]
    size = re.fullmatch(r"(\d+)([kmg])", str(engine["shm_size"]).lower())
    assert size and int(size.group(1)) * {"k": 1 / 1024 / 1024, "m": 1 / 1024, "g": 1}[size.group(2)] >= 1
    env = env_of(engine)
    assert "PYTORCH_NPU_ALLOC_CONF" not in env  # vllm-ascend 0.18.0 sets it itself
    # The one device passed in is device 0 inside the container, whatever its host index.
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0" and env["PALMYRA_NPU_DEVICES"] == "0"
    assert env["PALMYRA_PLATFORM"] == "ascend"


def test_npu_check_comes_first_in_the_ascend_profile_and_touches_nothing(services: dict[str, Any]) -> None:
    # Before the weights are fetched: model-init waits for it, the engine for model-init.
    check = services["npu-check"]
    assert check["profiles"] == ["ascend"]
    assert services["model-init"]["depends_on"]["npu-check"] == {"condition": "service_completed_successfully"}
    assert services["engine"]["depends_on"]["model-init"] == {"condition": "service_completed_successfully"}
    # The driver check only, from the small sidecar image, which has no NPU, no network, nothing
    # writable, and the host's paths read-only (both exist on every Linux host: no bind mount
    # creates a directory on the host).
    assert check["image"] == services["sidecar"]["image"]
    assert check["entrypoint"][:2] == ["palmyra-serve", "doctor"] and check["entrypoint"][-2:] == ["--only", "driver"]
    assert "devices" not in check and check["network_mode"] == "none" and check["read_only"] is True
    assert check["volumes"] == ["/dev:/host/dev:ro", "/usr/local:/host/usr/local:ro"]
    assert check["restart"] == "no" and check["healthcheck"] == {"disable": True}


def test_npu_exporter_only_with_ascend(services: dict[str, Any]) -> None:
    exporter = services["npu-exporter"]
    assert exporter["profiles"] == ["ascend"]
    # Never the engine's NPU; how it runs is held against upstream in test_ascend_deploy.py.
    assert "devices" not in exporter
    assert any("-port=8082" in arg for arg in exporter["command"])


def test_cpu_engine(services: dict[str, Any]) -> None:
    engine = services["engine-cpu"]
    assert engine["image"].endswith("palmyra-serve-engine:cpu}")
    assert env_of(engine)["PALMYRA_PLATFORM"] == "cpu"
    assert "devices" not in engine


# --- what the sidecar serves, what the images run -------------------------------------------------------


def _published_container_ports(service: dict[str, Any]) -> list[int]:
    out = []
    for spec in service.get("ports", []):
        if isinstance(spec, dict):
            out.append(int(spec["target"]))
        else:
            out.append(int(str(spec).rsplit(":", 1)[-1].split("/")[0]))
    return out


def assert_engine_reachable_only_by_its_sidecar(services: dict[str, Any]) -> None:
    """The engine listens on the loopback of the holder's namespace, which only the sidecar
    shares; the holder publishes the sidecar's port and nothing else; nobody publishes the engine's."""
    holder = services[HOLDER]
    assert "network_mode" not in holder, "the holder owns a namespace of its own"
    assert not holder.get("profiles"), "the holder runs with every engine"
    assert holder["restart"] == "always"  # never gone from under the engine and the sidecar
    assert set(_published_container_ports(holder)) == {SIDECAR_PORT}
    joined = sorted(name for name, s in services.items() if s.get("network_mode") == f"service:{HOLDER}")
    assert joined == sorted(IN_POD), f"the holder's namespace is shared by {joined}"
    for name in IN_POD:
        service = services[name]
        assert "networks" not in service and not service.get("ports"), name
        # podman-compose starts the holder only through this dependency.
        assert HOLDER in service.get("depends_on", {}), f"{name} does not wait for {HOLDER}"
    for name in ("engine", "engine-cpu"):
        command = services[name]["command"]
        assert loopback(flag_value(command, "--host")), f"{name} listens beyond the loopback: {command}"
        assert int(flag_value(command, "--port")) == ENGINE_PORT
    url = urlparse(env_of(services["sidecar"])["PALMYRA_ENGINE_URL"])
    assert loopback(url.hostname) and url.port == ENGINE_PORT, url.geturl()
    for name, service in services.items():
        ports = _published_container_ports(service) + [int(p) for p in service.get("expose", [])]
        assert ENGINE_PORT not in ports, f"{name} publishes the engine's port"


def test_engine_reachable_only_by_its_sidecar(services: dict[str, Any]) -> None:
    assert_engine_reachable_only_by_its_sidecar(services)
    (port,) = services[HOLDER]["ports"]
    assert port == "${PALMYRA_BIND:-127.0.0.1}:${PALMYRA_PORT:-8080}:8080"


def test_engine_isolation_check_can_fail(services: dict[str, Any]) -> None:
    def engine_host(s: dict[str, Any], host: str) -> None:
        s["engine-cpu"]["command"][s["engine-cpu"]["command"].index("--host") + 1] = host

    faults = {
        "engine on every address": lambda s: engine_host(s, "0.0.0.0"),
        "engine port published": lambda s: s[HOLDER]["ports"].append("127.0.0.1:8000:8000"),
        "engine port published by itself": lambda s: s["engine-cpu"].__setitem__("ports", ["8000:8000"]),
        "engine on the project network": lambda s: (
            s["engine"].pop("network_mode"),
            s["engine"].__setitem__("networks", {"default": None}),
        ),
        "another service joins the namespace": lambda s: s["prometheus"].__setitem__(
            "network_mode", f"service:{HOLDER}"
        ),
        "sidecar aims at a name": lambda s: s["sidecar"]["environment"].__setitem__(
            "PALMYRA_ENGINE_URL", "http://engine:8000"
        ),
        "holder restarts on its own terms": lambda s: s[HOLDER].__setitem__("restart", "unless-stopped"),
    }
    for what, fault in faults.items():
        broken = copy.deepcopy(services)
        fault(broken)
        with pytest.raises(AssertionError):
            assert_engine_reachable_only_by_its_sidecar(broken)
        print(f"caught: {what}")


def test_podman_compose_resolves_the_shared_namespace() -> None:
    merged = {}
    for profile in ("ascend", "cpu"):  # one engine each
        merged.update(podman_compose_config(COMPOSE, profile=profile)["services"])
    assert_engine_reachable_only_by_its_sidecar(merged)
    assert merged[HOLDER]["ports"] == ["127.0.0.1:8080:8080"]


def test_healthchecks_probe_paths_the_sidecar_serves(services: dict[str, Any]) -> None:
    urls = {name: url for name, s in services.items() if (url := probe_url(s))}
    assert set(urls) == {"engine", "engine-cpu", "sidecar"}
    # The sidecar's probe port, as its environment sets it: apart from the client port, and
    # published nowhere (busy clients cannot fail the healthchecks; only the probes and the full
    # /metrics, which Prometheus reads on the project network, are there).
    probe_port = int(env_of(services["sidecar"])["PALMYRA_PROBE_PORT"])
    assert probe_port != SIDECAR_PORT
    assert not any(str(probe_port) in str(p) for s in services.values() for p in s.get("ports", []))
    for name, url in urls.items():
        # Engine and sidecar share the holder's namespace: the sidecar answers on 127.0.0.1.
        assert re.match(rf"http://127\.0\.0\.1:{probe_port}/", url), f"{name} probes {url}"
        assert url_path(url) in SIDECAR_PATHS
    # Engine liveness = the sidecar's judgement of the engine; sidecar liveness = itself only.
    assert url_path(urls["engine"]) == url_path(urls["engine-cpu"]) == "/health"
    assert url_path(urls["sidecar"]) == "/health/sidecar"


def test_engine_probe_outlasts_a_sidecar_restart(services: dict[str, Any]) -> None:
    def seconds(text: str) -> float:
        return sum(float(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in re.findall(r"(\d+)([smh])", text))

    for name in ("engine", "engine-cpu"):
        check = services[name]["healthcheck"]
        assert seconds(check["interval"]) * check["retries"] >= 120, name
        assert seconds(check["start_period"]) >= 600, name


def test_restart_policies_and_drain_order(services: dict[str, Any]) -> None:
    for name in ("engine", "engine-cpu", "sidecar", "prometheus", "grafana", "alertmanager"):
        assert services[name]["restart"] == "unless-stopped", name
    # The namespace holder waits for a signal and nothing else; `always` brings it back even
    # after a daemon restart, before the containers that join it.
    assert services[HOLDER]["restart"] == "always"
    env = env_of(services["sidecar"])
    # Passed through from the env file; left out, it arrives empty and the setting's default applies.
    assert env["PALMYRA_DRAIN_TIMEOUT_S"] == "${PALMYRA_DRAIN_TIMEOUT_S:-}"
    from palmyra_serve.settings import Settings

    drain = Settings.model_fields["drain_timeout_s"].default
    # Compose stops the engine together with the sidecar (no preStop to hold it back) and nothing
    # routes by the sidecar's /ready: serving on after SIGTERM would only meet a stopping engine.
    assert float(env["PALMYRA_DRAIN_PROPAGATION_S"].split(":-")[-1].rstrip("}")) == 0
    sidecar_grace = int(services["sidecar"]["stop_grace_period"].rstrip("s"))
    assert sidecar_grace > drain
    for name in ("engine", "engine-cpu"):
        assert int(services[name]["stop_grace_period"].rstrip("s")) > sidecar_grace, name


def test_engine_commands_match_the_image(services: dict[str, Any]) -> None:
    df = parse_dockerfile((REPO / "Dockerfile").read_text())
    # The image's own command up to the listen address: Compose binds it to the shared loopback.
    image_cmd = df.stages["engine-cpu"].last("CMD").exec_form()
    host = image_cmd.index("--host") + 1
    assert image_cmd[:host] + image_cmd[host + 1 :] == LOOPBACK_ENGINE_CMD[:host] + LOOPBACK_ENGINE_CMD[host + 1 :]
    for name in ("engine", "engine-cpu"):
        assert services[name]["command"] == LOOPBACK_ENGINE_CMD


def test_the_engine_container_runs_the_launcher_as_pid_1(services: dict[str, Any]) -> None:
    """The image's entrypoint and its exec'd launcher are PID 1 of a PID namespace of the engine's
    own (only the network namespace is shared with `pod`): no init (`init: true` would put
    docker-init first), no entrypoint override, no shared `pid:` namespace. The launcher ends a
    dead engine's leftovers before it exits, and its exit ends the namespace."""
    for name in ("engine", "engine-cpu"):
        service = services[name]
        assert not service.get("init"), name
        assert "entrypoint" not in service and "pid" not in service, name
        assert service["command"][:2] == ["palmyra-serve", "engine"], name


def test_paths_and_env_agree_with_the_dockerfile(compose: dict[str, Any], services: dict[str, Any]) -> None:
    df = parse_dockerfile((REPO / "Dockerfile").read_text())
    assert {"models", "cache"} <= set(compose["volumes"])
    for name, target in (("engine", "engine-ascend"), ("engine-cpu", "engine-cpu")):
        image_env = df.stages[target].env()
        env = env_of(services[name])
        for key in ("PALMYRA_MODEL_DIR", "VLLM_CACHE_ROOT", "HF_HOME", "PALMYRA_PLATFORM"):
            assert env[key] == image_env[key], f"{name}: {key}"
        mounts = volume_targets(services[name])
        assert mounts["/models"] == "models" and mounts["/cache"] == "cache"
        assert env["PALMYRA_MODEL_DIR"].startswith("/models/")
        # The engine serves only what model-init fetched into the volume.
        assert env["PALMYRA_MODEL"] == env["PALMYRA_MODEL_DIR"] and env["PALMYRA_MODEL_SOURCE"] == "local"
        assert env["VLLM_CACHE_ROOT"].startswith("/cache/") and env["HF_HOME"].startswith("/cache/")


def test_engine_api_key_is_shared_and_required(services: dict[str, Any]) -> None:
    # The engine gets it as vLLM's own variable (never on argv); the sidecar sends the same value.
    # Required (`:?`, no default): Compose itself stops until the operator sets one.
    (required,) = {env_of(services[name])["VLLM_API_KEY"] for name in ("engine", "engine-cpu")}
    assert required.startswith("${PALMYRA_ENGINE_API_KEY:?") and "openssl rand -hex 32" in required
    for name in ("engine", "engine-cpu"):
        assert not any("api-key" in str(word) for word in services[name]["command"]), name
    assert env_of(services["sidecar"])["PALMYRA_ENGINE_API_KEY"] == required


@pytest.mark.parametrize("env_file", ["/dev/null", "compose/cpu.env"])
def test_compose_refuses_to_run_without_an_engine_key(env_file: str) -> None:
    # As the quick start runs it: the env file's empty value is no key, and the message says what to do.
    refused = podman_compose_run(COMPOSE, env_file=env_file)
    assert refused.returncode != 0
    assert "required variable PALMYRA_ENGINE_API_KEY is missing a value" in refused.stderr
    assert "openssl rand -hex 32" in refused.stderr
    # A key in the shell that runs Compose wins over the env file's empty one, for both containers.
    services = yaml.safe_load(
        podman_compose_run(COMPOSE, env_file=env_file, PALMYRA_ENGINE_API_KEY=TEST_ENGINE_KEY).stdout
    )["services"]
    assert services["engine-cpu"]["environment"]["VLLM_API_KEY"] == TEST_ENGINE_KEY
    assert services["sidecar"]["environment"]["PALMYRA_ENGINE_API_KEY"] == TEST_ENGINE_KEY


@pytest.mark.parametrize("env_file", ["/dev/null", "compose/cpu.env"])
def test_compose_refuses_to_run_without_a_grafana_password(env_file: str) -> None:
    refused = podman_compose_run(
        COMPOSE, env_file=env_file, PALMYRA_ENGINE_API_KEY=TEST_ENGINE_KEY, GRAFANA_ADMIN_PASSWORD=""
    )
    assert refused.returncode != 0
    assert "required variable GRAFANA_ADMIN_PASSWORD is missing a value" in refused.stderr
    given = yaml.safe_load(
        podman_compose_run(COMPOSE, env_file=env_file, PALMYRA_ENGINE_API_KEY=TEST_ENGINE_KEY).stdout
    )["services"]
    assert given["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == TEST_GRAFANA_PASSWORD


def documented_settings() -> list[str]:
    """The settings docs/configuration.md lists (its generated table), by variable name."""
    doc = (REPO / "docs" / "configuration.md").read_text()
    table = doc.split("<!-- BEGIN GENERATED settings", 1)[1].split("<!-- END GENERATED settings", 1)[0]
    return re.findall(r"^\| `(PALMYRA_[A-Z0-9_]+)` \|", table, flags=re.M)


# What docker-compose.yml sets in the engine or the sidecar itself, whatever the env file says.
SET_BY_COMPOSE = {
    "engine": {
        "PALMYRA_MODEL": "/models/palmyra-mini",
        "PALMYRA_MODEL_DIR": "/models/palmyra-mini",
        "PALMYRA_MODEL_SOURCE": "local",
        "PALMYRA_API_KEYS": "",  # client keys stay with the sidecar
        "PALMYRA_API_KEYS_FILE": "",
    },
    "sidecar": {"PALMYRA_ENGINE_URL": "http://127.0.0.1:8000", "PALMYRA_PROBE_PORT": "8081"},
}
# Never from the env file: the images' commands set host and port as flags (which win over the
# environment; PALMYRA_PORT is the published host port), the engine's address is the layout's,
# and the up-only setting has no use in a container.
LAYOUT_ONLY = {
    "PALMYRA_HOST",
    "PALMYRA_PORT",
    "PALMYRA_PROBE_PORT",
    "PALMYRA_ENGINE_URL",
    "PALMYRA_ENGINE_PORT",
    "PALMYRA_MODEL",
    "PALMYRA_MODEL_DIR",
    "PALMYRA_MODEL_SOURCE",
    "PALMYRA_UP_LOG_DIR",
}


@pytest.mark.parametrize("profile", ["cpu", "ascend"])
def test_every_documented_setting_in_the_env_file_reaches_its_containers(profile: str, tmp_path: Path) -> None:
    # An env file as an operator writes one: every documented setting with a value of its own.
    names = documented_settings()
    assert len(names) > 60 and "PALMYRA_ENFORCE_EAGER" in names and "PALMYRA_MAX_TOKENS_CAP" in names
    values = {name: f"v-{name.lower()}" for name in names}
    values["PALMYRA_ENGINE_API_KEY"] = TEST_ENGINE_KEY
    env_file = tmp_path / "operator.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    result = podman_compose_run(COMPOSE, profile=profile, env_file=str(env_file))
    assert result.returncode == 0, result.stderr[-2000:]
    services = yaml.safe_load(result.stdout)["services"]
    engine = "engine" if profile == "ascend" else "engine-cpu"
    fixed = {
        engine: {
            **SET_BY_COMPOSE["engine"],
            "PALMYRA_PLATFORM": profile,
            # The one NPU it was given is 0 inside; the env file's number picked the node (below).
            **({"PALMYRA_NPU_DEVICES": "0"} if profile == "ascend" else {}),
        },
        "sidecar": SET_BY_COMPOSE["sidecar"],
    }
    for service in (engine, "sidecar"):
        env = services[service]["environment"]
        for name in names:
            if name in fixed[service]:
                assert env[name] == fixed[service][name], (service, name, env.get(name))
            elif name in LAYOUT_ONLY:
                assert env.get(name) != values[name], (service, name)
            elif name == "PALMYRA_ENGINE_API_KEY" and service == engine:
                assert env["VLLM_API_KEY"] == values[name]  # vLLM's own name for it
            else:
                assert env.get(name) == values[name], f"{service}: {name} did not arrive from the env file"
    # The host's NPU number picks the device node; inside, the engine numbers it 0 (above).
    if profile == "ascend":
        assert "/dev/davinciv-palmyra_npu_devices" in services["engine"]["devices"]
    # Left out of the env file, a setting arrives empty, which the settings read as their default.
    bare = yaml.safe_load(podman_compose_run(COMPOSE, profile=profile, PALMYRA_ENGINE_API_KEY="k").stdout)
    assert bare["services"]["sidecar"]["environment"]["PALMYRA_MAX_QUEUE"] == ""
    # Nothing but settings (and the engine's own variables) travels: Grafana's password stays Grafana's.
    for service in (engine, "sidecar"):
        assert "GRAFANA_ADMIN_PASSWORD" not in services[service]["environment"]
        assert TEST_GRAFANA_PASSWORD not in json.dumps(services[service])


def test_the_sidecar_worst_case_memory_fits_its_compose_limit() -> None:
    """The budget (sidecar/memory_budget.py) for the settings the Compose sidecar runs with: its
    image's ENV and ENTRYPOINT, then the service's environment as podman-compose resolves it
    (defaults filled in), against the service's memory limit; as test_k8s.py does per overlay."""
    import podman_compose

    from palmyra_serve.sidecar import memory_budget

    sidecar = podman_compose_config(COMPOSE)["services"]["sidecar"]
    stage = parse_dockerfile((REPO / "Dockerfile").read_text()).stages["sidecar"]
    settings = deployed.compose_sidecar_settings(sidecar, stage.env(), stage.last("ENTRYPOINT").exec_form())
    assert settings.probe_port == 8081 and settings.admission_mode == "adaptive", "what Compose runs"
    limit_value = sidecar["deploy"]["resources"]["limits"]["memory"]
    limit = deployed.compose_bytes(limit_value)
    worst = memory_budget.worst_case(settings)
    print(f"Compose sidecar: worst case {worst / 2**20:.0f} MiB, limit {limit / 2**20:.0f} MiB")
    assert worst <= limit, f"worst case {worst / 2**20:.0f} MiB > sidecar limit {limit / 2**20:.0f} MiB"
    # The check reads the deployed settings: the 4 MiB bodies would not fit.
    assert memory_budget.worst_case(settings.model_copy(update={"max_body_bytes": 4 * 2**20})) > limit
    # One limit for the sidecar wherever it runs: the Kubernetes base gives it the same.
    assert limit == memory_budget.container_limit(deployed.base_deployment(), "sidecar")
    # podman-compose (the pinned tool the container tier runs) hands it to podman as the limit.
    podman_args: list[str] = []
    podman_compose.container_to_cpu_res_args(sidecar, podman_args)
    assert podman_args == ["-m", str(limit_value).lower()]


def test_palmyra_env_names_are_settings() -> None:
    # Every PALMYRA_* variable Compose sets is a field of the one Settings class (no typos that
    # would be silently ignored), except the Compose-only interpolation knobs.
    from palmyra_serve.settings import Settings

    known = {f"PALMYRA_{name.upper()}" for name in Settings.model_fields}
    for path in (COMPOSE, *OVERRIDES):
        for name, service in (load(path).get("services") or {}).items():
            for key in env_of(service):
                if key.startswith("PALMYRA_"):
                    assert key in known, f"{path.name}: {name} sets unknown {key}"


def test_third_party_images_pinned(services: dict[str, Any]) -> None:
    for name in ("prometheus", "grafana", "npu-exporter", "quota-redis", "alertmanager"):
        image = services[name]["image"].split(":-")[-1].rstrip("}")
        tag = image.rsplit(":", 1)[-1]
        assert ":" in image and tag != "latest" and re.search(r"\d", tag), f"{name}: {image}"


# --- monitoring wiring ----------------------------------------------------------------------------------


def test_monitoring_mounts_exist_and_are_read_only(services: dict[str, Any]) -> None:
    prom = volume_targets(services["prometheus"])
    assert prom["/etc/prometheus"] == "./monitoring/prometheus:ro"
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    grafana = volume_targets(services["grafana"])
    assert grafana["/etc/grafana/provisioning"] == "./monitoring/grafana/provisioning:ro"
    assert grafana["/var/lib/grafana/dashboards"] == "./monitoring/grafana/dashboards:ro"
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    for mounts in (prom, grafana):
        for spec in mounts.values():
            if spec.startswith("./"):
                assert (REPO / spec.split(":")[0]).is_dir(), spec


def assert_prometheus_scrapes_through_the_sidecar(services: dict[str, Any], config: dict[str, Any]) -> None:
    names: dict[str, set[str]] = {}
    for name, service in services.items():
        if "network_mode" in service:  # in another's namespace: no name of its own on the network
            continue
        aliases = ((service.get("networks") or {}).get("default") or {}).get("aliases", [])
        for host in (name, *aliases):
            names.setdefault(host, set()).add(name)
    # Who listens where: the sidecar's ports are in the holder's namespace (the client port, and the
    # probe port as the sidecar's environment sets it); the engine has no address.
    probe_port = int(env_of(services["sidecar"])["PALMYRA_PROBE_PORT"])
    ports = {HOLDER: {SIDECAR_PORT, probe_port}, "npu-exporter": {8082}}
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = [(name, t) for name, job in jobs.items() for sc in job.get("static_configs", []) for t in sc["targets"]]
    assert targets
    for job, target in targets:
        host, port = target.rsplit(":", 1)
        assert host in names, f"{target}: no service or alias {host}"
        assert all(int(port) in ports.get(s, set()) for s in names[host]), f"{job}: nothing listens on {target}"
    # The engine's page comes from the sidecar, relayed unchanged at /engine/metrics on the client
    # port; the sidecar's own page, with its per-tenant series, from the probe port, which only the
    # project network reaches (the client port's /metrics leaves those series out).
    assert jobs["palmyra-engine"]["metrics_path"] == "/engine/metrics"
    assert jobs["palmyra-sidecar"].get("metrics_path", "/metrics") == "/metrics"
    for job, port in (("palmyra-engine", SIDECAR_PORT), ("palmyra-sidecar", probe_port)):
        for sc in jobs[job]["static_configs"]:
            assert all(names[t.rsplit(":", 1)[0]] == {HOLDER} for t in sc["targets"]), job
            assert all(int(t.rsplit(":", 1)[1]) == port for t in sc["targets"]), (job, sc["targets"])


def test_prometheus_targets_are_compose_services(services: dict[str, Any]) -> None:
    config = yaml.safe_load((REPO / "monitoring" / "prometheus" / "prometheus.yml").read_text())
    assert_prometheus_scrapes_through_the_sidecar(services, config)
    broken = copy.deepcopy(config)
    engine_job = next(j for j in broken["scrape_configs"] if j["job_name"] == "palmyra-engine")
    engine_job["metrics_path"] = "/metrics"
    with pytest.raises(AssertionError):  # the engine job must read the relayed page
        assert_prometheus_scrapes_through_the_sidecar(services, broken)
    engine_job["metrics_path"], engine_job["static_configs"] = "/engine/metrics", [{"targets": ["engine:8000"]}]
    with pytest.raises(AssertionError):  # no service answers there any more
        assert_prometheus_scrapes_through_the_sidecar(services, broken)
    broken = copy.deepcopy(config)
    sidecar_job = next(j for j in broken["scrape_configs"] if j["job_name"] == "palmyra-sidecar")
    sidecar_job["static_configs"] = [{"targets": [f"sidecar:{SIDECAR_PORT}"]}]
    with pytest.raises(AssertionError):  # the client port's page has no per-tenant series
        assert_prometheus_scrapes_through_the_sidecar(services, broken)
    # Grafana's datasource reaches the prometheus service.
    datasource = yaml.safe_load((REPO / "monitoring/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_alertmanager_is_opt_in_hardened_and_reads_its_webhook_url_from_a_secret_file(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    """The `alerting` profile: the webhook URL is an operator-created file (never shipped, Git
    ignores its directory), handed over as a Compose secret at the path the config's url_file
    names; the service is hardened as quota-redis is; Prometheus sends to its name and port."""
    am = services["alertmanager"]
    # Opt-in: the quick start creates no secret file, and a secret's file must exist for the
    # service that uses it. Nothing in the default stack waits for it.
    assert am["profiles"] == ["alerting"]
    assert not any("alertmanager" in s.get("depends_on", {}) for s in services.values())
    [secret] = am["secrets"]
    source = Path(compose["secrets"][secret]["file"])
    # Where the operator creates it, which Git ignores: a file there is never committed.
    assert source.parent == Path("compose/secrets"), source
    assert "/compose/secrets/" in (REPO / ".gitignore").read_text().splitlines()
    config = yaml.safe_load((REPO / "monitoring" / "alertmanager" / "alertmanager.yml").read_text())
    hooks = [w for r in config["receivers"] for w in r.get("webhook_configs", [])]
    assert hooks and all(w == {"url_file": f"/run/secrets/{secret}", "send_resolved": True} for w in hooks), hooks
    assert volume_targets(am)["/etc/alertmanager"] == "./monitoring/alertmanager:ro"
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in am["command"]
    assert "--cluster.listen-address=" in am["command"], "one instance: no HA gossip to wait for"
    [storage] = [arg.split("=", 1)[1] for arg in am["command"] if arg.startswith("--storage.path=")]
    assert volume_targets(am)[storage] == "alertmanager-data" and "alertmanager-data" in compose["volumes"]
    # Hardened as quota-redis: nothing writable but its volume, no privilege gain, bounded memory,
    # a healthcheck on its readiness, restarted when it exits.
    assert am["read_only"] is True and am["security_opt"] == ["no-new-privileges:true"]
    assert deployed.compose_bytes(am["deploy"]["resources"]["limits"]["memory"]) <= 256 * 2**20
    check = am["healthcheck"]["test"]
    assert check[0] == "CMD" and check[-1] == "http://127.0.0.1:9093/-/ready", check
    assert not am.get("ports"), "internal, as Prometheus and Grafana"
    # Prometheus's alerting target is this service's name and port.
    prometheus = yaml.safe_load((REPO / "monitoring" / "prometheus" / "prometheus.yml").read_text())
    [target] = [
        t
        for am_cfg in prometheus["alerting"]["alertmanagers"]
        for sc in am_cfg["static_configs"]
        for t in sc["targets"]
    ]
    assert target == "alertmanager:9093"
    assert "networks" not in am and "network_mode" not in am, "on the project network, as Prometheus"
    # The version the docs name is the one pinned.
    tag = am["image"].rsplit(":", 1)[1]
    assert f"prom/alertmanager:{tag}" in (COMPOSE_DIR / "README.md").read_text()


# --- the test-only podman override ------------------------------------------------------------------


def test_podman_override_is_host_network_local_images_loopback_only() -> None:
    override = load(COMPOSE_DIR / "podman-test.override.yml")["services"]
    assert set(override) == {HOLDER, "model-init-cpu", "engine-cpu", "sidecar"}
    for name, service in override.items():
        assert service["image"].startswith("localhost/palmyra-serve-"), name
        assert "networks" not in service, name
        assert not service.get("ports"), name
    # Only the namespace holder (and model-init, alone) move to the host: engine and sidecar keep
    # joining the holder, so the test stack runs the shared-namespace layout on the host's loopback.
    assert override[HOLDER]["network_mode"] == override["model-init-cpu"]["network_mode"] == "host"
    assert "network_mode" not in override["engine-cpu"] and "network_mode" not in override["sidecar"]
    merged = podman_compose_config(COMPOSE, COMPOSE_DIR / "podman-test.override.yml")["services"]
    assert merged[HOLDER]["network_mode"] == "host" and not merged[HOLDER].get("ports")
    for name in ("engine-cpu", "sidecar"):
        assert merged[name]["network_mode"] == f"service:{HOLDER}" and "networks" not in merged[name], name
    assert not any(s.get("ports") for s in merged.values() if s.get("network_mode") == "host")
    engine_cmd = override["engine-cpu"]["command"]
    assert engine_cmd[engine_cmd.index("--host") + 1] == "127.0.0.1"
    sidecar_cmd = override["sidecar"]["command"]
    assert sidecar_cmd[sidecar_cmd.index("--host") + 1] == "127.0.0.1"
    probe_port = override["sidecar"]["environment"]["PALMYRA_PROBE_PORT"]
    assert probe_port != sidecar_cmd[sidecar_cmd.index("--port") + 1]
    for name in ("engine-cpu", "sidecar"):
        url = probe_url(override[name])
        assert url is not None and url.startswith(f"http://127.0.0.1:{probe_port}/"), url
        assert url_path(url.replace("${PALMYRA_TEST_SIDECAR_PORT:-18080}", "1")) in SIDECAR_PATHS


def test_override_lists_that_must_replace_say_so() -> None:
    # podman-compose merges lists by appending (even healthcheck.test, unlike the Compose spec):
    # an override's probe command must carry !override or it runs both probes' words as one.
    # A service the base file lacks merges with nothing, and there podman-compose keeps the tag
    # itself (its `config` fails on it): only the base's services carry it.
    base = set(load(COMPOSE)["services"])
    for path in OVERRIDES:
        root = yaml.compose(path.read_text(), Loader=ComposeLoader)
        services = next((v for k, v in root.value if k.value == "services"), None)
        for name, service in services.value if services else []:
            if name.value not in base:
                continue
            for key, value in service.value:
                if key.value != "healthcheck":
                    continue
                test = next(v for k, v in value.value if k.value == "test")
                assert test.tag == "!override", f"{path.name}: healthcheck.test without !override"
                # ...and podman-compose leaves ${...} inside !override values uninterpolated.
                assert not any("${" in item.value for item in test.value), f"{path.name}: variable in !override"
