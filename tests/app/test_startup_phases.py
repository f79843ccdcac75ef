"""Time to ready per start-up phase (palmyra_startup_phase_seconds), against a FAKE engine whose
start delay (it listens only after S seconds, as vLLM while it loads and compiles) and generation
delay (every warmup request waits, as a cold engine's first requests do) the test injects."""

from __future__ import annotations

import re
import time

import httpx

from tests.helpers import procs
from tests.helpers.api import body_when_ready
from tests.helpers.procs import fake_engine
from tests.helpers.waiting import wait_until

# The warmup plan's sequential steps at max_model_len 2048 (3 completion lengths, one streamed long
# completion, chat, chat streamed) plus the concurrent burst: at least 7 generation delays.
SEQUENTIAL_WARMUP_REQUESTS = 7
METRIC = re.compile(r'^palmyra_startup_phase_seconds\{phase="(\w+)"\} (\S+)$', re.M)


def phases(client: httpx.Client, url: str) -> dict[str, float]:
    return {name: float(value) for name, value in METRIC.findall(client.get(f"{url}/metrics").text)}


def test_phases_follow_the_engines_start_and_warmup_delays(sidecar_factory, log_dir, client):
    port = procs.free_port()
    start_delay, generate_delay = 4.0, 0.3
    t0 = time.monotonic()
    with sidecar_factory(f"http://127.0.0.1:{port}", wait_ready=False) as sc:
        # No start-up has finished: no figure (an empty panel, not 0 s).
        assert phases(client, sc.url) == {}
        assert "palmyra_startup_phase_seconds" in client.get(f"{sc.url}/metrics").text  # HELP/TYPE only
        spawned = time.monotonic()
        with fake_engine(log_dir, start_delay=start_delay, port=port, generate_delay=generate_delay):
            body = wait_until(lambda: body_when_ready(client, sc.url), 30, "ready")
            observed = time.monotonic() - t0
            got = phases(client, sc.url)
            assert set(got) == {"engine_up", "warmup"}
            # engine_up covers the time before the fake even started plus its start delay, and no
            # warmup; warmup covers every delayed warmup generation, and not the start delay.
            assert got["engine_up"] >= start_delay, got
            assert got["warmup"] >= SEQUENTIAL_WARMUP_REQUESTS * generate_delay, got
            # ...and not the start delay: a leak would add all of it (slack for a loaded machine).
            assert got["warmup"] < SEQUENTIAL_WARMUP_REQUESTS * generate_delay + start_delay, got
            # Their sum is the time to ready the test itself saw (the sidecar started after t0).
            assert got["engine_up"] + got["warmup"] <= observed
            assert got["engine_up"] + got["warmup"] >= observed - (spawned - t0) - 3
            assert body["startup_seconds"] == {k: round(v, 3) for k, v in got.items()}
            assert body["warmup_seconds"] <= got["warmup"] + 0.001  # the last attempt, rounded to ms


def test_a_restarted_engine_is_a_new_start_up_measured_from_the_loss(sidecar_factory, log_dir, client):
    port = procs.free_port()
    with sidecar_factory(f"http://127.0.0.1:{port}", wait_ready=False) as sc:
        with fake_engine(log_dir, port=port, generate_delay=0.3):
            wait_until(lambda: body_when_ready(client, sc.url), 30, "first ready")
            first = phases(client, sc.url)
        assert first["warmup"] >= SEQUENTIAL_WARMUP_REQUESTS * 0.3
        # The engine is gone (as a crashed engine container): readiness goes, the figures of the
        # last start-up stay until the next one finishes.
        wait_until(lambda: body_when_ready(client, sc.url) is None, 10, "not ready once the engine is gone")
        assert phases(client, sc.url) == first
        lost = time.monotonic()
        with fake_engine(log_dir, start_delay=1.5, port=port):
            wait_until(lambda: body_when_ready(client, sc.url), 30, "ready again")
            again = time.monotonic() - lost
            second = phases(client, sc.url)
        # A new start-up: measured from the loss (the sidecar noticed it before `lost`), with this
        # engine's start delay and its undelayed warmup.
        assert second["engine_up"] >= 1.5, second
        assert second["warmup"] < SEQUENTIAL_WARMUP_REQUESTS * 0.3, second
        # (the supervisor notices the loss up to a watch tick after /ready does; slack for load)
        assert second["engine_up"] + second["warmup"] >= again - 2, (second, again)
