"""Liveness and readiness transitions, end to end over real sockets, against a FAKE engine."""

from __future__ import annotations

import time

from tests.helpers import procs
from tests.helpers.api import body_when_ready, ready_body
from tests.helpers.procs import fake_engine
from tests.helpers.waiting import wait_until


def test_slow_starting_engine_then_ready_after_warmup(sidecar_factory, log_dir, client):
    port = procs.free_port()
    with sidecar_factory(f"http://127.0.0.1:{port}", wait_ready=False) as sc:
        status, body = ready_body(client, sc.url)
        assert status == 503 and body["phase"] == "waiting_for_engine" and body["ready"] is False
        assert client.get(f"{sc.url}/health/sidecar").status_code == 200
        with fake_engine(log_dir, start_delay=1.5, port=port):
            body = wait_until(lambda: body_when_ready(client, sc.url), 20, "ready")
            assert body["phase"] == "ready"
            assert body["progress"]["done"] == body["progress"]["total"] >= 5
            assert body["weights"] == "unknown"  # the fake's model root does not exist here
            assert client.get(f"{sc.url}/health").json()["status"] == "ok"
            metrics = client.get(f"{sc.url}/metrics").text
            assert "palmyra_ready 1.0" in metrics and "palmyra_engine_live 1.0" in metrics
            assert 'palmyra_warmup_phase{phase="ready"} 1.0' in metrics
            assert 'palmyra_warmup_runs_total{outcome="success"} 1.0' in metrics


def test_warmup_failure_keeps_not_ready_and_retries(engine, sidecar_factory, client):
    client.post(f"{engine.url}/fake/control", json={"generate": "fail"})
    with sidecar_factory(engine.url, wait_ready=False) as sc:
        body = wait_until(lambda: ready_body(client, sc.url)[1].get("last_error"), 10, "a warmup error")
        assert body.startswith("warmup step") and "engine core died" not in body  # the engine's words: the log
        assert ready_body(client, sc.url)[0] == 503
        client.post(f"{engine.url}/fake/control", json={"generate": "ok"})
        wait_until(lambda: ready_body(client, sc.url)[0] == 200, 15, "ready after the engine recovers")
        metrics = client.get(f"{sc.url}/metrics").text
        assert 'palmyra_warmup_runs_total{outcome="failure"}' in metrics
        assert 'palmyra_warmup_runs_total{outcome="failure"} 0.0' not in metrics


def test_dead_engine_fails_liveness_and_readiness(engine, sidecar, client):
    assert client.get(f"{sidecar.url}/health").status_code == 200
    client.post(f"{engine.url}/fake/control", json={"health": "fail"})
    wait_until(lambda: client.get(f"{sidecar.url}/health").status_code == 503, 5, "liveness failure")
    live = client.get(f"{sidecar.url}/health").json()
    assert live["status"] == "engine_dead" and live["engine_health"] == "http_503"
    assert ready_body(client, sidecar.url)[0] == 503
    # Recovery: warmup runs again and readiness returns without restarting the sidecar.
    client.post(f"{engine.url}/fake/control", json={"health": "ok"})
    wait_until(lambda: ready_body(client, sidecar.url)[0] == 200, 15, "ready again")
    assert client.get(f"{sidecar.url}/health").status_code == 200


def test_hung_generations_flip_readiness_then_liveness(engine, sidecar, client):
    # /health keeps answering (vLLM's does while its engine core hangs); only generations hang.
    client.post(f"{engine.url}/fake/control", json={"generate": "hang"})
    t0 = time.monotonic()
    wait_until(lambda: ready_body(client, sidecar.url)[0] == 503, 10, "not ready from canary failures")
    assert client.get(f"{sidecar.url}/health").status_code == 200, "liveness must outlast readiness"
    wait_until(lambda: client.get(f"{sidecar.url}/health").status_code == 503, 10, "liveness failure")
    took = time.monotonic() - t0
    assert took >= 3, f"liveness failed after {took:.1f} s, before its 3 s budget"
    assert client.get(f"{sidecar.url}/health").json()["status"] == "engine_hung"
    assert "palmyra_canary_failures_total 0.0" not in client.get(f"{sidecar.url}/metrics").text
    client.post(f"{engine.url}/fake/control", json={"generate": "ok"})
    wait_until(lambda: ready_body(client, sidecar.url)[0] == 200, 20, "ready after recovery")


def test_hung_health_endpoint_is_judged_hung_after_budget(engine, sidecar, client):
    client.post(f"{engine.url}/fake/control", json={"health": "hang"})
    wait_until(lambda: ready_body(client, sidecar.url)[0] == 503, 5, "not ready")
    wait_until(lambda: client.get(f"{sidecar.url}/health").status_code == 503, 10, "liveness failure")
    assert client.get(f"{sidecar.url}/health").json()["status"] == "engine_hung"
