"""docker-compose.yml and compose/* as objects: loaded with Compose's merge tags, a service's
environment and volumes read, and the project as podman-compose (the pinned tool the container
tier runs) merges and interpolates it, without podman (`--dry-run`)."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import deployed

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
COMPOSE_DIR = REPO / "compose"
BIN = Path(sys.executable).parent
HOLDER = "pod"  # the service that only holds the replica's network namespace
TEST_ENGINE_KEY = "static-test-engine-key"  # Compose requires one; the env files ship none
TEST_GRAFANA_PASSWORD = "static-test-grafana-password"  # the same


class ComposeLoader(yaml.SafeLoader):
    """PyYAML plus Compose's merge tags: `!override` keeps its plain value, `!reset` removes the key
    (what it means after merging; the loaded override then reads as the merged result would)."""


_RESET = object()


def _plain(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    return loader.construct_scalar(node)


ComposeLoader.add_constructor("!reset", lambda loader, node: _RESET)
ComposeLoader.add_constructor("!override", _plain)


def _drop_resets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_resets(v) for k, v in value.items() if v is not _RESET}
    if isinstance(value, list):
        return [_drop_resets(v) for v in value if v is not _RESET]
    return value


def load(path: Path) -> dict[str, Any]:
    return _drop_resets(yaml.load(path.read_text(), Loader=ComposeLoader))  # a SafeLoader subclass


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} missing from the venv: ./test.sh installs tests/requirements-tools.txt"
    return str(path)


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def volume_targets(service: dict[str, Any]) -> dict[str, str]:
    """target -> 'source[:mode]' for short-syntax volumes."""
    out = {}
    for spec in service.get("volumes", []):
        source, target, *mode = spec.split(":")
        out[target] = ":".join([source, *mode])
    return out


def podman_compose_run(
    *files: Path, profile: str = "cpu", env_file: str = "/dev/null", **env: str
) -> subprocess.CompletedProcess[str]:
    # --env-file /dev/null: a developer's .env (compose/cpu.env copied) must not change the defaults.
    argv = [tool("podman-compose"), "--env-file", env_file, "--dry-run", "-p", "palmyra-static", "--profile", profile]
    for path in files:
        argv += ["-f", str(path)]
    # Grafana's password is required too; a test that wants it unset says "".
    environ = deployed.compose_shell_env(**{"GRAFANA_ADMIN_PASSWORD": TEST_GRAFANA_PASSWORD, **env})
    return subprocess.run(
        [*argv, "config"], capture_output=True, text=True, cwd=REPO, env=environ, timeout=60, check=False
    )


def podman_compose_config(*files: Path, profile: str = "cpu") -> dict[str, Any]:
    """The project as podman-compose (the pinned tool the container tests run) merges and resolves
    it: a fresh copy of one run per files and profile (each run takes seconds)."""
    return copy.deepcopy(_podman_compose_config_once(files, profile))


@functools.cache
def _podman_compose_config_once(files: tuple[Path, ...], profile: str) -> dict[str, Any]:
    result = podman_compose_run(*files, profile=profile, PALMYRA_ENGINE_API_KEY=TEST_ENGINE_KEY)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return yaml.safe_load(result.stdout)


def ascend_compose_config(**env: str) -> dict[str, Any]:
    """docker-compose.yml with compose/ascend.env as podman-compose renders it (interpolated).
    `--dry-run` only skips podman-compose's `podman --version` probe: the static tier has no podman."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PALMYRA_", "HWHIAIUSER_", "COMPOSE_"))}
    result = subprocess.run(
        [
            str(BIN / "podman-compose"),
            "--dry-run",
            "--env-file",
            "compose/ascend.env",
            "-f",
            "docker-compose.yml",
            "config",
        ],
        # Compose requires the engine key and Grafana's password; compose/ascend.env ships neither
        # (the shell gives them).
        cwd=REPO,
        env={
            **environ,
            "PALMYRA_ENGINE_API_KEY": TEST_ENGINE_KEY,
            "GRAFANA_ADMIN_PASSWORD": TEST_GRAFANA_PASSWORD,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]
