"""Tenants against the real engine (and, as an engine contract, against vLLM 0.18.0, the Ascend
image's): a tenant with a tokens limit streams without asking for usage and gets exactly the
stream it asked for, while its tokens are the engine's own count; and requests waiting in the
sidecar's queue appear in the engine's vllm:num_requests_waiting, as the endpoint picker reads it."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from tests.helpers import procs
from tests.helpers.api import HTTP, MODEL
from tests.helpers.reliability import FAST, long_stream, sidecar_metric
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.engine_contract

KEY = "tenant-engine-key-0123456789"


def test_a_tenants_stream_without_usage_is_unchanged_and_counted_exactly(engine_server, log_dir: Path, tmp_path):
    from palmyra_serve.sidecar.tenants.config import key_digest

    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(f"tenants:\n  - name: search\n    keys: ['{key_digest(KEY)}']\n    tokens_per_minute: 100000\n")
    env = {"PALMYRA_TENANTS_FILE": str(tenants)}
    with procs.sidecar(
        engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env, probe=True
    ) as sc:
        headers = {"Authorization": f"Bearer {KEY}"}
        plain = {"model": MODEL, "prompt": "Once upon", "max_tokens": 9, "temperature": 0}
        counted = HTTP.post(f"{sc.url}/v1/completions", json=plain, headers=headers, timeout=60)
        assert counted.status_code == 200, counted.text
        usage = counted.json()["usage"]
        with HTTP.stream(
            "POST", f"{sc.url}/v1/completions", json={**plain, "stream": True}, headers=headers, timeout=60
        ) as resp:
            assert resp.status_code == 200 and resp.headers["x-ratelimit-limit-tokens"] == "100000"
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks and all(c["choices"] and "usage" not in c for c in chunks), events[-3:]
        tokens = 'palmyra_tenant_tokens_total{kind="%s",tenant="search"}'
        # Per-tenant series: the probe port's page only.
        assert sidecar_metric(sc.probe_url, tokens % "completion") == 2 * usage["completion_tokens"] == 18
        assert sidecar_metric(sc.probe_url, tokens % "prompt") == 2 * usage["prompt_tokens"]


WAITING = re.compile(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", re.M)


def test_requests_waiting_in_the_sidecar_show_in_the_engines_waiting_gauge(engine_server, log_dir: Path):
    env = {**FAST, "PALMYRA_ADMISSION_MODE": "fixed", "PALMYRA_MAX_IN_FLIGHT": "1", "PALMYRA_READ_TIMEOUT_S": "60"}
    with procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env) as sc:

        def waiting() -> float:
            match = WAITING.search(HTTP.get(f"{sc.url}/engine/metrics", timeout=10).text)
            assert match
            return float(match.group(1))

        def ask() -> None:
            HTTP.post(f"{sc.url}/v1/completions", json={**long_stream(150), "stream": False}, timeout=300)

        threads = [threading.Thread(target=ask) for _ in range(3)]
        for t in threads:
            t.start()
        wait_until(lambda: waiting() >= 2.0, 60, "the sidecar's two waiting requests on the engine's page", 0.1)
        for t in threads:
            t.join(300)
        wait_until(lambda: waiting() == 0.0, 30, "nothing waiting once they are done", 0.2)
