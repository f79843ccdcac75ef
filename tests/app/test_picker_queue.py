"""The queue the fleet sees: requests waiting in the sidecar's admission queue count in the
engine's vllm:num_requests_waiting on /engine/metrics, the page and the metric the endpoint picker
scores replicas on, so a replica whose queue is in the sidecar does not look idle to it."""

from __future__ import annotations

import re
import threading

import httpx

from tests.helpers.waiting import wait_until

WAITING = re.compile(r'^vllm:num_requests_waiting\{engine="0",model_name="palmyra-mini"\} (\S+)$', re.M)


def test_requests_queued_in_the_sidecar_show_in_the_engines_waiting_gauge(engine, sidecar_factory, client):
    env = {"PALMYRA_ADMISSION_MODE": "fixed", "PALMYRA_MAX_IN_FLIGHT": "1", "PALMYRA_READ_TIMEOUT_S": "10"}
    with sidecar_factory(engine.url, **env) as sc:

        def waiting() -> float:
            page = client.get(f"{sc.url}/engine/metrics").text
            match = WAITING.search(page)
            assert match, page
            return float(match.group(1))

        assert waiting() == 0.0
        client.post(f"{engine.url}/fake/control", json={"generate_delay": 3}).raise_for_status()  # once ready
        threads = [
            threading.Thread(
                target=lambda: httpx.post(
                    f"{sc.url}/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}, timeout=30
                )
            )
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        wait_until(lambda: waiting() == 2.0, 10, "two requests waiting in the sidecar on the picker's page", 0.1)
        for t in threads:
            t.join(30)
        wait_until(lambda: waiting() == 0.0, 10, "the queue empty again", 0.1)
