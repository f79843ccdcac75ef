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
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "monitoring" / "alertmanager" / "alertmanager.yml"
URL_FILE_SINCE = (0, 26, 0)  # Alertmanager's CHANGELOG: 0.26.0 added the webhook's url_file


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class LocalAlertmanager:
    """An Alertmanager on 127.0.0.1:<free port>, one instance (no HA gossip), storage in a
    temporary directory."""

    def __init__(self, config: dict[str, Any], exe: str | None = None) -> None:
        self.config, self.exe = config, exe or binary("alertmanager")
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> LocalAlertmanager:
        self.workdir = Path(tempfile.mkdtemp(prefix="palmyra-am-"))
        config_path = self.workdir / "alertmanager.yml"
        config_path.write_text(json.dumps(self.config, indent=2), encoding="utf-8")  # JSON is YAML
        self.port = free_port()
        self.log_path = self.workdir / "alertmanager.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.exe,
                    f"--config.file={config_path}",
                    f"--storage.path={self.workdir / 'data'}",
                    f"--web.listen-address={self.address}",
                    "--cluster.listen-address=",  # as Compose runs it: no gossip, ready at once
                    "--log.level=info",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"alertmanager exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"alertmanager not ready after {timeout_s}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except (OSError, AttributeError):
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> LocalAlertmanager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alerts(self) -> list[dict[str, Any]]:
        """What it holds now (API v2, the only one Prometheus 3 speaks)."""
        with urllib.request.urlopen(self.url + "/api/v2/alerts", timeout=5) as r:
            return json.load(r)
