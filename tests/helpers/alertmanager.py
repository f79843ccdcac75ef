"""The shipped Alertmanager configuration (monitoring/alertmanager/alertmanager.yml) on this
machine's Alertmanager (Debian's `prometheus-alertmanager`), and a throwaway Alertmanager process.

The webhook's URL is read from a file (`url_file`), which Alertmanager has only since 0.26;
Debian 12 ships 0.25. For an older Alertmanager `for_version` writes the file's content, stripped
as 0.26 and newer strip it, into `url` instead: the destination is the file's, but the reading of
the file at each notification (a changed file needs no restart, a missing one fails the
notification rather than the start) is then not exercised. Every other field is the shipped one.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any, Self

import yaml

from monitoring.local_prometheus import LoopbackServer

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "monitoring" / "alertmanager" / "alertmanager.yml"
URL_FILE_SINCE = (0, 26, 0)  # Alertmanager's CHANGELOG: 0.26.0 added the webhook's url_file


def binary(name: str) -> str:
    """Debian installs the server as prometheus-alertmanager, upstream as alertmanager."""
    names = ("prometheus-alertmanager", "alertmanager") if name == "alertmanager" else (name,)
    for candidate in names:
        if found := shutil.which(candidate):
            return found
    raise AssertionError(f"{name} missing: install Debian's `prometheus-alertmanager` package (./test.sh does)")


def version(exe: str) -> tuple[int, int, int]:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30, check=False)
    match = re.search(r"version (\d+)\.(\d+)\.(\d+)", out.stdout + out.stderr)
    assert match, f"{exe} --version: {out.stdout + out.stderr}"
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def shipped() -> dict[str, Any]:
    return yaml.safe_load(CONFIG.read_text(encoding="utf-8"))


def webhooks(config: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for r in config["receivers"] for w in r.get("webhook_configs", [])]


def for_version(config: dict[str, Any], url_file: Path, alertmanager_version: tuple[int, int, int]) -> dict[str, Any]:
    """`config` with every webhook reading its URL from `url_file` (the deployed path is the
    Compose secret's), or, before 0.26, given that file's content as `url`."""
    out = copy.deepcopy(config)
    for hook in webhooks(out):
        assert "url_file" in hook and "url" not in hook, f"the URL is a secret, read from a file: {hook}"
        if alertmanager_version >= URL_FILE_SINCE:
            hook["url_file"] = str(url_file)
        else:
            del hook["url_file"]
            hook["url"] = url_file.read_text(encoding="utf-8").strip()
    return out


class LocalAlertmanager(LoopbackServer):
    """An Alertmanager on 127.0.0.1:<free port>, one instance (no HA gossip), storage in a
    temporary directory."""

    name = "alertmanager"

    def __init__(self, config: dict[str, Any], exe: str | None = None) -> None:
        super().__init__(config, exe or binary("alertmanager"))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def argv(self, config_path: Path, data_dir: Path) -> list[str]:
        return [
            self.binary,
            f"--config.file={config_path}",
            f"--storage.path={data_dir}",
            f"--web.listen-address={self.address}",
            "--cluster.listen-address=",  # as Compose runs it: no gossip, ready at once
            "--log.level=info",
        ]

    def start(self, timeout_s: float = 20.0, poll_s: float = 0.1) -> Self:
        return super().start(timeout_s, poll_s)

    def alerts(self) -> list[dict[str, Any]]:
        """What it holds now (API v2, the only one Prometheus 3 speaks)."""
        with urllib.request.urlopen(self.url + "/api/v2/alerts", timeout=5) as r:
            return json.load(r)
