"""Adaptive admission attacked, end to end: the real sidecar over real sockets in front of a FAKE
engine that misbehaves on purpose. One regression test per attack that once broke it:

- a fast engine (a whole stream in one read) crashed the limiter for good, and every later stream
  was cut after its 200 head while /ready stayed green;
- engine 5xx answers, or requests that outlast the read timeout, at 8/s halved the limit every
  window (64 -> 2 in 6.9 s; then 18 of 20 normal requests got 429);
- slow readers' gaps counted as engine latency (their own pace, not the engine's).

Bounds are asserted with a wide margin; the figures are printed (pytest -s) for the record.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx

from tests.helpers.api import completion
from tests.helpers.api import metric_value as sample
from tests.helpers.load import ClosedLoop
from tests.helpers.waiting import wait_until

LIMIT = "palmyra_concurrency_limit"
FAULTS = "palmyra_admission_faults_total"


def control(client: httpx.Client, engine_url: str, **state: object) -> None:
    client.post(f"{engine_url}/fake/control", json=state).raise_for_status()


def test_a_whole_stream_in_one_read_neither_breaks_nor_collapses_the_limit(engine, sidecar_factory, client):
    env = {
        "PALMYRA_ADMISSION_MAX_LIMIT": "8",
        "PALMYRA_ADMISSION_INITIAL_LIMIT": "2",
        "PALMYRA_ADMISSION_WINDOW_S": "0.2",
    }
    with sidecar_factory(engine.url, **env) as sc:
        # A batching engine that is fast per token: 0.2 s to a first token whatever the batch, then
        # the whole 64-token stream in one write (as a coalescing network delivers it too).
        control(client, engine.url, one_write=True, first_delay_s=0.2)
        body = completion("load", max_tokens=64, stream=True)
        with ClosedLoop(sc.url, 12, body, pause_after_429_s=0.05) as load:
            # Every stream's 64 events share one timestamp: no gap of 0 may reach the limiter, and
            # the stream's whole time still says the engine is fast and a larger batch pays: the
            # limit grows to the ceiling and stays there.
            wait_until(lambda: sample(client, sc.url, LIMIT) == 8, 30, "the limit to reach the ceiling")
            settled = []
            for _ in range(15):
                time.sleep(0.2)
                settled.append(sample(client, sc.url, LIMIT))
        assert settled == [8.0] * 15, f"it settles at the ceiling: {settled}"
        assert load.errors == [], f"streams cut: {load.errors[:3]}"
        assert set(load.statuses) <= {200, 429} and load.statuses.count(200) > 30
        assert sample(client, sc.url, FAULTS) == 0
        assert client.get(f"{sc.url}/ready").status_code == 200
        assert "Traceback" not in sc.log()
    print(
        f"one-read streams: {load.statuses.count(200)} served, {load.statuses.count(429)} refused, "
        f"0 cut, limit 2 -> 8 (the ceiling) and held for 3 s, 0 faults"
    )


def _attacked(engine, sidecar_factory, client, attack, extra_env: dict[str, str] | None = None):
    """The limit under normal load, then with `attack` running beside it: (lowest limit during the
    attack, the normal requests' statuses during it)."""
    env = {
        "PALMYRA_ADMISSION_MAX_LIMIT": "64",
        "PALMYRA_ADMISSION_INITIAL_LIMIT": "64",
        "PALMYRA_ADMISSION_WINDOW_S": "0.2",
        **(extra_env or {}),
    }
    with sidecar_factory(engine.url, **env) as sc:
        control(client, engine.url, token_delay_s=0.01)
        normal = completion("normal", max_tokens=10, stream=True)
        with ClosedLoop(sc.url, 4, normal) as warm:
            wait_until(lambda: len(warm.statuses) >= 40, 30, "undisturbed load")
            undisturbed = sample(client, sc.url, LIMIT)
        stop = threading.Event()
        attacker = threading.Thread(target=attack, args=(sc.url, stop), daemon=True)
        with ClosedLoop(sc.url, 4, normal) as load:
            attacker.start()
            lowest = undisturbed
            stop_at, give_up = time.monotonic() + 5.0, time.monotonic() + 30.0
            while (time.monotonic() < stop_at or attacker.is_alive()) and time.monotonic() < give_up:
                lowest = min(lowest, sample(client, sc.url, LIMIT))
                if time.monotonic() >= stop_at:
                    stop.set()  # the attack winds down; the limit is watched until it has
                time.sleep(0.1)
        assert not attacker.is_alive()
        return undisturbed, lowest, load.statuses, sc


def _at_8_per_s(body: dict):
    def attack(url: str, stop: threading.Event) -> None:
        threads = []
        while not stop.wait(0.125):  # 8 requests a second, each on its own connection
            t = threading.Thread(target=lambda: httpx.post(f"{url}/v1/completions", json=body, timeout=10), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(timeout=10)

    return attack


def _assert_held(undisturbed: float, lowest: float, statuses: list[int], what: str) -> None:
    refused = statuses.count(429) / max(1, len(statuses))
    print(
        f"{what}: limit {undisturbed:g} undisturbed, lowest {lowest:g} under attack; "
        f"normal requests {len(statuses)}, refused {refused:.1%}"
    )
    assert lowest >= 0.75 * undisturbed, f"{what} pulled the limit from {undisturbed} to {lowest}"
    assert refused <= 0.05 and len(statuses) > 20


def test_engine_errors_at_8_per_s_leave_the_limit_and_normal_requests_alone(engine, sidecar_factory, client):
    attack = _at_8_per_s(completion("fake:leaky-500", stream=True))
    undisturbed, lowest, statuses, _ = _attacked(engine, sidecar_factory, client, attack)
    _assert_held(undisturbed, lowest, statuses, "engine 500s at 8/s")


def test_read_timeouts_at_8_per_s_leave_the_limit_and_normal_requests_alone(engine, sidecar_factory, client):
    # Non-streamed requests that the engine never answers: 504 after the read timeout (2 s here).
    attack = _at_8_per_s(completion("fake:hang"))
    undisturbed, lowest, statuses, sc = _attacked(engine, sidecar_factory, client, attack)
    _assert_held(undisturbed, lowest, statuses, "504s at 8/s")
    assert '"upstream_error":"engine_timeout"' in sc.log(), "the attack did reach the read timeout"


def _slow_reader(url: str, bytes_per_read: int = 8192, every_s: float = 0.25) -> None:
    """A client whose receive buffer is 4 KiB and who reads 8 KiB every quarter second, of a stream
    of 10 tokens of 16 KiB: far more than the kernel's and the transport's buffers hold. It reads
    to the end (about 5 s): the old relay took that time as the engine's."""
    host, port = url.removeprefix("http://").split(":")
    body = httpx.Request("POST", url, json=completion("fake:fat-tokens", max_tokens=10, stream=True)).content
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    sock.settimeout(30)
    try:
        while True:
            data = sock.recv(bytes_per_read)
            if not data or data.endswith(b"0\r\n\r\n"):
                return
            time.sleep(every_s)
    finally:
        sock.close()


def test_slow_readers_are_not_engine_latency(engine, sidecar_factory, client):
    def attack(url: str, stop: threading.Event) -> None:
        readers = [threading.Thread(target=_slow_reader, args=(url,), daemon=True) for _ in range(6)]
        for r in readers:
            r.start()
            time.sleep(0.3)
        for r in readers:
            r.join(timeout=30)

    undisturbed, lowest, statuses, sc = _attacked(engine, sidecar_factory, client, attack)
    _assert_held(undisturbed, lowest, statuses, "6 slow readers")
    paced = sc.log().count('"client_paced":true')
    assert paced >= 1, "the slow readers' streams were recognised as paced by their client"
    print(f"streams paced by their client, their gaps ignored: {paced}")
