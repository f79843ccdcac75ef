"""Alerts reach a person, live: the real sidecar in front of the FAKE engine, scraped by a real
Prometheus (Debian's) with the deployed config and rules, which sends to a real Alertmanager
(Debian's) running the shipped configuration, whose webhook receiver is a small HTTP server here,
its URL given to Alertmanager through a file.

A real condition: the fake engine's process is stopped, so the sidecar's /engine/metrics stops
answering and PalmyraEngineDown's own expression (from the rules file, unchanged) holds; the alert
fires, travels Prometheus -> Alertmanager -> webhook with its runbook link rendered from the
recording rule; the engine is started again on the same port and the resolution arrives the same
way. Waits are on conditions only; the timeline is printed.

Shortened for a test, and only these (the production values make it minutes):
- PalmyraEngineDown's `for:` 2m -> 2s, in a copy of the rules file; every other rule as shipped;
- Prometheus scrapes and evaluates every 1 s (deployed: 5 s scrapes, 15 s evaluation);
- Alertmanager's group_wait 30s -> 1s and group_interval 5m -> 1s.
On Debian 12's Alertmanager 0.25, which predates `url_file`, the file's content goes into `url`
(tests/helpers/alertmanager.py says what that leaves out).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import yaml

from tests.helpers import alertmanager, procs
from tests.helpers.modules import load_module
from tests.helpers.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "prometheus" / "rules" / "palmyra-alerts.yml"
ALERT = "PalmyraEngineDown"
SHORT_FOR = "2s"

local_prometheus = load_module("palmyra_local_prometheus_alerts", REPO / "monitoring" / "local_prometheus.py")


class _Hook(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[float, dict[str, Any]]]] = []  # per server: a subclass each

    def do_POST(self) -> None:  # http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.append((time.monotonic(), json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def webhook_receiver() -> Iterator[tuple[str, list[tuple[float, dict[str, Any]]]]]:
    received: list[tuple[float, dict[str, Any]]] = []
    handler = type("Hook", (_Hook,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/palmyra-alerts", received
    finally:
        server.shutdown()
        server.server_close()


def shortened_rules(directory: Path) -> Path:
    """The rules file with only the alert's `for:` shortened (its expression untouched)."""
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    [rule] = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    assert rule["for"] == "2m", "the shipped wait this test shortens"
    rule["for"] = SHORT_FOR
    path = directory / "palmyra-alerts.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    return path


def runbook_base() -> str:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    [rule] = [r for g in rules["groups"] for r in g["rules"] if r.get("record") == "palmyra:runbook_base_url"]
    return rule["labels"]["url"]


def notifications(received: list[tuple[float, dict[str, Any]]], status: str) -> list[tuple[float, dict[str, Any]]]:
    """(arrival, alert) for each alert of ours with that status in what the webhook received."""
    return [
        (at, alert)
        for at, body in list(received)
        for alert in body["alerts"]
        if alert["labels"].get("alertname") == ALERT and alert["status"] == status
    ]


def test_engine_down_reaches_a_person_with_its_runbook_and_resolves(tmp_path: Path, sidecar_factory) -> None:
    am_exe = alertmanager.binary("alertmanager")
    am_version = alertmanager.version(am_exe)
    engine_port = procs.free_port()
    with contextlib.ExitStack() as stack, webhook_receiver() as (hook_url, received):
        # The operator's file: one line, the URL (a trailing newline, as `echo` writes it).
        url_file = tmp_path / "alertmanager-webhook-url"
        url_file.write_text(hook_url + "\n", encoding="utf-8")
        config = alertmanager.for_version(alertmanager.shipped(), url_file, am_version)
        config["route"].update(group_wait="1s", group_interval="1s")
        am = stack.enter_context(alertmanager.LocalAlertmanager(config, am_exe))

        engine = stack.enter_context(procs.fake_engine(tmp_path, port=engine_port))
        sidecar = stack.enter_context(sidecar_factory(engine.url, probe=True))
        addr = f"127.0.0.1:{sidecar.port}"
        base = yaml.safe_load((REPO / "monitoring" / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
        cfg = local_prometheus.render_config(
            base,
            # As deployed: the sidecar's page from its probe port, under the client address.
            local_prometheus.scrape_targets([addr], probes=[f"127.0.0.1:{sidecar.probe_port}"]),
            scrape_interval="1s",
            alertmanagers=[am.address],
            rule_files=[shortened_rules(tmp_path)],
        )
        prom = stack.enter_context(local_prometheus.LocalPrometheus(cfg))
        wait_until(
            lambda: prom.targets_up() == {"palmyra-sidecar": True, "palmyra-engine": True},
            20,
            "the sidecar and its engine's page scraped",
        )
        wait_until(
            lambda: prom.api("alertmanagers")["data"]["activeAlertmanagers"], 20, "Prometheus sees the Alertmanager"
        )

        def firing() -> list[dict[str, Any]]:
            """The alert's series in ALERTS, the state Prometheus records at each evaluation."""
            body = prom.query(f'ALERTS{{alertname="{ALERT}", alertstate="firing"}}')
            assert body["status"] == "success", body
            return [{"labels": s["metric"]} for s in body["data"]["result"]]

        # The condition: the engine's process is gone (SIGTERM to its group); to the sidecar, as after a crash.
        assert not firing() and not received
        wall0, t0 = datetime.datetime.now(datetime.UTC), time.monotonic()
        procs.stop(engine.proc, timeout_s=5)
        [fired] = wait_until(firing, 20, f"{ALERT} firing in Prometheus' ALERTS")
        t_firing = time.monotonic()
        assert fired["labels"]["job"] == "palmyra-engine" and fired["labels"]["instance"] == addr, fired
        [(t_received, sent)] = wait_until(lambda: notifications(received, "firing"), 20, "the webhook's notification")
        assert sent["labels"]["severity"] == "critical" and sent["labels"]["instance"] == addr
        assert sent["annotations"]["runbook_url"] == runbook_base() + "#palmyraenginedown"
        assert sent["annotations"]["summary"] == f"palmyra engine behind {addr} is down"

        # Back: an engine on the same port; the sidecar finds it, its page answers again.
        t_restart = time.monotonic()
        stack.enter_context(procs.fake_engine(tmp_path, port=engine_port))
        [(t_resolved, resolved)] = wait_until(lambda: notifications(received, "resolved"), 30, "the resolution")
        assert resolved["fingerprint"] == sent["fingerprint"] and resolved["endsAt"] > resolved["startsAt"]
        assert not firing()
        # One group: every message the webhook got was about this alert of this replica.
        bodies = [body for _, body in received]
        assert all(b["groupLabels"] == {"alertname": ALERT, "job": "palmyra-engine", "instance": addr} for b in bodies)
        held = [a for a in am.alerts() if a["labels"]["alertname"] == ALERT and a["status"]["state"] == "active"]
        assert not held, held

    print(
        f"alerts timeline (Prometheus {local_prometheus_version()}, Alertmanager {'.'.join(map(str, am_version))}): "
        f"engine stopped at {wall0:%H:%M:%S.%f} UTC = 0.0 s; {ALERT} firing in Prometheus +{t_firing - t0:.1f} s; "
        f"received by the webhook +{t_received - t0:.1f} s; engine restarted +{t_restart - t0:.1f} s; "
        f"resolution received +{t_resolved - t0:.1f} s ({t_resolved - t_restart:.1f} s after the restart)"
    )


def local_prometheus_version() -> str:
    out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True, timeout=10, check=False)
    return out.stdout.split()[2] if out.stdout.startswith("prometheus, version") else "?"
