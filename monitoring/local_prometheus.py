#!/usr/bin/env python3
"""Run a throwaway Prometheus on loopback with this repository's config and alert rules.

For a local `palmyra-serve up` (no Compose, no Grafana) and for the tests that check the
dashboards' queries and the alert rules against a real Prometheus:

    python3 monitoring/local_prometheus.py --sidecar 127.0.0.1:8080 [--probe 127.0.0.1:8081] \
        [--alertmanager 127.0.0.1:9093]
    # prints the URL it listens on (a free loopback port); Ctrl-C stops it and deletes its storage

The config is monitoring/prometheus/prometheus.yml with only the targets swapped (jobs without
a target are dropped; the Alertmanager is the one given, or none) and the rule files made
absolute, so the jobs, metric paths and rules exercised are the ones deployed. Each sidecar is
the target of two jobs, as in Compose and Kubernetes: `palmyra-sidecar` (its /metrics, from its
probe port when `--probe` gives it, as deployed: the client port's page leaves out the
per-tenant series) and `palmyra-engine` (the engine's own page, relayed unchanged at
/engine/metrics on the client port; the engine itself listens on loopback and is never scraped
directly). Standard library only; needs a `prometheus` binary on PATH.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Self

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "prometheus" / "prometheus.yml"
RULES_DIR = HERE / "prometheus" / "rules"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A scrape target: its host:port, or (host:port, instance) where the series must carry another
# `instance` than the address scraped.
Target = str | tuple[str, str]


def scrape_targets(
    sidecars: list[str], npu_exporters: list[str] | None = None, probes: list[str] | None = None
) -> dict[str, list[Target]]:
    """Job name -> targets for sidecars at host:port (their client port), which relay their engine's
    page. `probes` (host:port, one per sidecar, in the same order) are the same sidecars' probe
    ports (PALMYRA_PROBE_PORT), where their full /metrics is; its series keep the sidecar's client
    address as `instance`, as deployed (prometheus.yml), so both jobs name a replica alike. Without
    them the sidecar job reads the client ports' page, every series but the per-tenant ones."""
    if probes and len(probes) != len(sidecars):
        raise ValueError(f"one probe port per sidecar: {len(sidecars)} sidecars, {len(probes)} probe ports")
    own: list[Target] = list(zip(probes, sidecars, strict=True)) if probes else list(sidecars)
    targets: dict[str, list[Target]] = {
        "palmyra-sidecar": own,
        "palmyra-engine": list(sidecars),
        "npu-exporter": list(npu_exporters or []),
    }
    return {job: t for job, t in targets.items() if t}


def static_configs(targets: list[Target]) -> list[dict]:
    """Prometheus' static_configs for these targets: plain addresses together, each one with an
    instance of its own in a config of its own (its `labels` set the instance)."""
    plain = [t for t in targets if isinstance(t, str)]
    configs: list[dict] = [{"targets": plain}] if plain else []
    configs += [{"targets": [t[0]], "labels": {"instance": t[1]}} for t in targets if not isinstance(t, str)]
    return configs


def render_config(
    base: dict,
    targets: dict[str, list[Target]],
    *,
    scrape_interval: str = "1s",
    extra_jobs: list[dict] | None = None,
    external_labels: dict | None = None,
    alertmanagers: list[str] | None = None,
    rule_files: list[Path] | None = None,
) -> dict:
    """The deployed config with `targets` (job name -> host:port list; an entry may be (host:port,
    instance)) instead of Compose names.

    `alertmanagers` (host:port list) replace the Compose service the deployed `alerting` block
    names; without them the block is dropped, since that name resolves nowhere here and Prometheus
    would log a failed send for every active alert. `rule_files` replace the deployed rules (a test
    that shortens a rule's `for:` passes its own copy)."""
    cfg = copy.deepcopy(base)
    cfg["global"]["scrape_interval"] = scrape_interval
    cfg["global"]["evaluation_interval"] = scrape_interval
    if external_labels:
        cfg["global"].setdefault("external_labels", {}).update(external_labels)
    if alertmanagers:
        [deployed] = cfg["alerting"]["alertmanagers"]
        cfg["alerting"]["alertmanagers"] = [dict(deployed, static_configs=[{"targets": list(alertmanagers)}])]
    else:
        cfg.pop("alerting", None)
    jobs = []
    for job in cfg["scrape_configs"] + list(extra_jobs or []):
        if job["job_name"] in targets:
            job = dict(job, scrape_interval=scrape_interval, static_configs=static_configs(targets[job["job_name"]]))
            jobs.append(job)
    cfg["scrape_configs"] = jobs
    cfg["rule_files"] = [str(p) for p in (rule_files or sorted(RULES_DIR.glob("*.yml")))]
    return cfg


class LoopbackServer:
    """A server of the Prometheus family (Prometheus, Alertmanager) as a process on
    127.0.0.1:<free port>, its config (written as JSON, which is YAML) and storage in a temporary
    directory, started once /-/ready answers 200. Subclasses say how to run it (`argv`)."""

    name = "server"

    def __init__(self, config: dict, binary: str) -> None:
        self.config, self.binary = config, binary
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.workdir: Path | None = None
        self.log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self, config_path: Path, data_dir: Path) -> list[str]:
        raise NotImplementedError

    def start(self, timeout_s: float = 30.0, poll_s: float = 0.2) -> Self:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"palmyra-{self.name}-"))
        config_path = self.workdir / f"{self.name}.yml"
        config_path.write_text(json.dumps(self.config, indent=2), encoding="utf-8")
        self.port = free_port()
        self.log_path = self.workdir / f"{self.name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv(config_path, self.workdir / "data"), stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(poll_s)
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {timeout_s}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            assert self.log_path is not None
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except (OSError, AssertionError):
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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalPrometheus(LoopbackServer):
    """Prometheus, its TSDB in the temporary directory."""

    name = "prometheus"

    def __init__(self, config: dict, binary: str = "prometheus") -> None:
        super().__init__(config, binary)

    def argv(self, config_path: Path, data_dir: Path) -> list[str]:
        return [
            self.binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]

    # --- HTTP API -----------------------------------------------------------------------------
    def api(self, path: str, **params: str) -> dict:
        """GET /api/v1/<path>; returns the JSON body (status "success" or "error") even on HTTP 4xx."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as err:  # 400/422 carry the PromQL error as JSON
            return json.load(err)

    def query(self, expr: str) -> dict:
        return self.api("query", query=expr)

    def targets_up(self) -> dict[str, bool]:
        active = self.api("targets", state="active")["data"]["activeTargets"]
        return {t["scrapePool"]: t["health"] == "up" for t in active}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sidecar",
        action="append",
        default=[],
        help="host:port of a sidecar (repeatable); its engine is scraped through it",
    )
    ap.add_argument(
        "--probe",
        action="append",
        default=[],
        help="host:port of a sidecar's probe port (repeatable, one per --sidecar, same order): its /metrics there, "
        "with the per-tenant series, replaces the client port's",
    )
    ap.add_argument("--npu-exporter", action="append", default=[], help="host:port of an npu-exporter")
    ap.add_argument(
        "--alertmanager",
        action="append",
        default=[],
        help="host:port of an Alertmanager to send alerts to (repeatable; none: alerts stay in Prometheus)",
    )
    ap.add_argument("--scrape-interval", default="5s")
    args = ap.parse_args()
    import yaml  # only the CLI needs it (PyYAML, in the test extras); the tests pass a parsed dict

    base = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    prom = LocalPrometheus(
        render_config(
            base,
            scrape_targets(args.sidecar, args.npu_exporter, args.probe),
            scrape_interval=args.scrape_interval,
            alertmanagers=args.alertmanager,
        )
    )
    with prom:
        proc = prom.proc
        assert proc is not None, "started on entering the with block"
        print(f"prometheus on {prom.url} (Ctrl-C stops it)", flush=True)
        try:
            while proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
