"""What a deployment gives the sidecar, read from the manifests rather than restated in tests."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

import yaml

from palmyra_serve.settings import Settings

REPO = Path(__file__).resolve().parents[2]
# What Compose would interpolate from the shell that runs it, overriding the env file's values.
COMPOSE_SHELL_PREFIXES = ("PALMYRA_", "COMPOSE_", "GRAFANA_")


def compose_shell_env(**extra: str) -> dict[str, str]:
    """This process's environment as the shell of a Compose run: without the variables the
    docker-compose.yml interpolates (the env file, or `extra`, speaks for them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(COMPOSE_SHELL_PREFIXES)}
    return {**env, **extra}


K8S_BASE = REPO / "k8s" / "base"


def sidecar_settings(config: dict[str, str], sidecar: dict) -> Settings:
    """The sidecar's settings as its pod sets them: the ConfigMap's PALMYRA_*, its container's
    literal env (secrets are not read), then its command's flags through the real CLI parser."""
    from palmyra_serve.cli import build_parser

    env = {**config, **{e["name"]: e["value"] for e in sidecar.get("env", []) if "value" in e}}
    fields = {k.removeprefix("PALMYRA_").lower(): v for k, v in env.items() if k.startswith("PALMYRA_")}
    command = sidecar["command"]
    assert command[0] == "palmyra-serve", command
    flags = {k: v for k, v in vars(build_parser().parse_args(command[1:])).items() if k in Settings.model_fields}
    # An empty value is no value, as Settings reads the environment (env_ignore_empty).
    known = {k: v for k, v in fields.items() if k in Settings.model_fields and v != ""}
    return Settings(_env_file=None, **{**known, **flags})


def compose_sidecar_settings(service: dict, image_env: dict[str, str], entrypoint: list[str]) -> Settings:
    """The sidecar's settings as Compose runs it: the image's ENV overridden by the service's
    environment (as podman-compose resolves it), then ENTRYPOINT plus the service's command
    through the real CLI parser."""
    env = {**image_env, **{k: str(v) for k, v in service.get("environment", {}).items()}}
    return sidecar_settings(env, {"command": [*entrypoint, *service.get("command", [])]})


_COMPOSE_BYTES = re.compile(r"(\d+(?:\.\d+)?)([bkmg]?)b?")
_COMPOSE_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def compose_bytes(value: str | int) -> int:
    """A Compose byte value ("1g", "512m", "2048k", "1gb", plain bytes) in bytes: binary units,
    as Docker and podman read them (unlike Kubernetes' "1G", which is 10**9)."""
    match = _COMPOSE_BYTES.fullmatch(str(value).strip().lower())
    assert match, f"not a Compose byte value: {value!r}"
    return int(float(match.group(1)) * _COMPOSE_UNITS[match.group(2)])


def base_deployment() -> dict:
    manifest = (K8S_BASE / "deployment.yaml").read_text(encoding="utf-8")
    return next(d for d in yaml.safe_load_all(manifest) if d and d.get("kind") == "Deployment")


def base_config() -> dict[str, str]:
    """k8s/base's configMapGenerator literals (what `kubectl kustomize k8s/base` puts in the ConfigMap)."""
    kustomization = yaml.safe_load((K8S_BASE / "kustomization.yaml").read_text(encoding="utf-8"))
    (generator,) = [g for g in kustomization["configMapGenerator"] if g["name"] == "palmyra-serve-config"]
    return dict(literal.split("=", 1) for literal in generator["literals"])


def containers(deployment: dict) -> dict[str, dict]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def loopback(host: str | None) -> bool:
    """An address on the loopback: reachable only from inside the pod (or Compose namespace).
    A name is not: it resolves outside, to another pod or service."""
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def flag_value(args: list[str], flag: str) -> str:
    """The value after `flag` in a command, which must carry it exactly once."""
    assert args.count(flag) == 1, f"{flag} in {args}"
    return args[args.index(flag) + 1]
