"""Soak: mixed traffic through the real sidecar to the real engine for a bounded time (45 s here;
PALMYRA_LONG=1 runs the 30-minute variant), with the sidecar's RSS, open descriptors,
threads and engine connections sampled every few seconds. After a warm-up, the mean of the last
third of the samples may not exceed the mean of the first third by more than noise."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers import procs
from tests.helpers.api import MODEL, completion, plain_client
from tests.helpers.reliability import FAST, StreamThread, Usage, figure, generate_ok, long_stream, usage

SAMPLE_EVERY_S = 3.0
WORKERS = 4
# Allowed growth of the last third over the first third (after warm-up): noise, not a leak.
RSS_SLACK_MB, FD_SLACK, THREAD_SLACK, CONN_SLACK = 6.0, 4, 2, 4


@pytest.fixture(scope="module")
def sidecar(engine_server, log_dir) -> Iterator[procs.Server]:
    env = {
        **FAST,
        "PALMYRA_MAX_IN_FLIGHT": "6",
        "PALMYRA_MAX_QUEUE": "2",
        "PALMYRA_READ_TIMEOUT_S": "30",
        "PALMYRA_LOG_LEVEL": "warning",
    }  # the access log would only grow the captured file
    with procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env) as server:
        yield server


def traffic(url: str, stop: threading.Event, seen: Counter, seed: int) -> None:
    """One worker: a random mix of the request shapes clients send, including rude ones."""
    rnd = random.Random(seed)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 12}
    with plain_client(timeout=60) as client:
        while not stop.is_set():
            kind = rnd.choice(["completion", "stream", "chat", "chat-stream", "models", "cut", "bad", "tokenize"])
            try:
                if kind == "completion":
                    r = client.post(f"{url}/v1/completions", json=completion(max_tokens=rnd.randint(1, 24)))
                elif kind == "stream":
                    r = client.post(f"{url}/v1/completions", json=completion(max_tokens=16, stream=True))
                elif kind == "chat":
                    r = client.post(f"{url}/v1/chat/completions", json=chat)
                elif kind == "chat-stream":
                    r = client.post(f"{url}/v1/chat/completions", json={**chat, "stream": True})
                elif kind == "models":
                    r = client.get(f"{url}/v1/models")
                elif kind == "tokenize":
                    r = client.post(f"{url}/tokenize", json={"model": MODEL, "prompt": "hello there"})
                elif kind == "bad":
                    r = client.post(f"{url}/v1/completions", json=completion(max_tokens=-1))
                else:
                    t = StreamThread(url, long_stream(400), cut_after=rnd.randint(1, 8))
                    t.run()  # on this thread: hang up after a few events
                    seen[f"cut:{t.result.status}"] += 1
                    continue
                seen[f"{kind}:{r.status_code}"] += 1
            except httpx.HTTPError as exc:
                seen[f"{kind}:{type(exc).__name__}"] += 1


def soak(sidecar: procs.Server, engine_server: procs.Server, samples_wanted: int, warmup_s: float) -> None:
    """Traffic for the warm-up, then until `samples_wanted` samples are taken, one every
    SAMPLE_EVERY_S. Counted, not timed: on a busy 2-core runner a sample (and the sleep before
    it) runs late, and a fixed time window then held too few samples to compare thirds."""
    stop = threading.Event()
    seen: Counter = Counter()
    workers = [threading.Thread(target=traffic, args=(sidecar.url, stop, seen, i), daemon=True) for i in range(WORKERS)]
    for w in workers:
        w.start()
    samples: list[Usage] = []
    t0 = time.monotonic()
    # A ceiling only against a sampler that stopped: three times the planned duration.
    deadline = t0 + 3 * (warmup_s + samples_wanted * SAMPLE_EVERY_S)
    try:
        time.sleep(warmup_s)
        next_at = time.monotonic()
        while len(samples) < samples_wanted and time.monotonic() < deadline:
            samples.append(usage(sidecar.proc.pid, engine_server.port))
            next_at += SAMPLE_EVERY_S
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=90)
    third = max(1, len(samples) // 3)
    first, last = samples[:third], samples[-third:]

    def mean(rows, attr):
        return statistics.fmean(getattr(u, attr) for u in rows)

    growth = {
        attr: round(mean(last, attr) - mean(first, attr), 2) for attr in ("rss_mb", "fds", "threads", "engine_conns")
    }
    requests = sum(seen.values())
    unexpected = {k: v for k, v in seen.items() if not k.endswith((":200", ":400", ":429")) and k not in ("cut:200",)}
    figure(
        f"soak ({time.monotonic() - t0:.0f} s)",
        requests=requests,
        samples=len(samples),
        rss_mb_first_last=(round(mean(first, "rss_mb"), 1), round(mean(last, "rss_mb"), 1)),
        fds_first_last=(round(mean(first, "fds"), 1), round(mean(last, "fds"), 1)),
        threads_first_last=(round(mean(first, "threads"), 1), round(mean(last, "threads"), 1)),
        engine_conns_max=max(u.engine_conns for u in samples),
        growth=growth,
        outcomes=dict(sorted(seen.items())),
    )
    assert len(samples) == samples_wanted, f"{len(samples)} of {samples_wanted} samples before the ceiling"
    assert not unexpected, unexpected
    assert seen.get("bad:400", 0) > 0 and sum(v for k, v in seen.items() if k.startswith("cut:")) > 0
    assert growth["rss_mb"] <= RSS_SLACK_MB, growth
    assert growth["fds"] <= FD_SLACK, growth
    assert growth["threads"] <= THREAD_SLACK, growth
    assert growth["engine_conns"] <= CONN_SLACK, growth
    assert sidecar.proc.poll() is None
    assert generate_ok(sidecar.url)


def test_soak_mixed_traffic_without_growth(sidecar, engine_server):
    soak(sidecar, engine_server, samples_wanted=11, warmup_s=12)  # about 45 s


@pytest.mark.long
def test_soak_mixed_traffic_without_growth_long(sidecar, engine_server):
    soak(sidecar, engine_server, samples_wanted=560, warmup_s=120)  # about 30 minutes
