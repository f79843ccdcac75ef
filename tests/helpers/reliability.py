"""Shared plumbing for the reliability suite (tests/engine/test_reliability_*.py).

Streams read on threads with timestamps, the engine's Prometheus gauges, the processes and sockets
counted with psutil, and `figure()`, which prints each scenario's measured outcome (visible with
`pytest -s`) and, when PALMYRA_RELIABILITY_FIGURES names a file, appends it there as a JSON line
(docs/reliability.md is written from those lines).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from tests.helpers.api import HTTP, completion, plain_client
from tests.helpers.waiting import wait_until

# Short intervals so transitions happen in seconds (the production defaults are minutes). The
# warmup timeout stays generous: the real engine compiles shapes on its first requests.
FAST = {
    "PALMYRA_HEALTH_POLL_INTERVAL_S": "0.2",
    "PALMYRA_CANARY_INTERVAL_S": "0.5",
    "PALMYRA_CANARY_TIMEOUT_S": "1",
    "PALMYRA_LIVENESS_BUDGET_S": "3",
    "PALMYRA_WARMUP_MAX_BACKOFF_S": "1",
    "PALMYRA_READ_TIMEOUT_S": "3",
    "PALMYRA_WARMUP_REQUEST_TIMEOUT_S": "60",
    "PALMYRA_CONNECT_TIMEOUT_S": "1",
    "PALMYRA_DRAIN_TIMEOUT_S": "20",
    "PALMYRA_LOG_LEVEL": "info",
}


def figure(scenario: str, **values: object) -> None:
    """Print one scenario's measured outcome, and keep it when PALMYRA_RELIABILITY_FIGURES is set."""
    print(f"\n{scenario}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    out = os.environ.get("PALMYRA_RELIABILITY_FIGURES")
    if out:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"scenario": scenario, "at": time.strftime("%Y-%m-%dT%H:%M:%S"), **values}) + "\n")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); no interpolation, so p99 of 10 values is the maximum."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def long_stream(max_tokens: int = 1500) -> dict:
    """A stream that keeps the engine busy for a while (random weights: ignore EOS to be sure)."""
    return completion("Once upon a time", max_tokens=max_tokens, stream=True, ignore_eos=True, temperature=0.0)


def engine_gauge(engine_url: str, name: str) -> float:
    text = HTTP.get(f"{engine_url}/metrics", timeout=5).text
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)]
    assert values, f"{name} missing from the engine's /metrics"
    return sum(values)


def wait_engine_idle(engine_url: str, within_s: float) -> None:
    """Nothing running or waiting in the engine: what an earlier test left (a stream its client
    cut is aborted only once the engine notices) no longer shares its steps."""
    wait_until(
        lambda: (
            engine_gauge(engine_url, "vllm:num_requests_running")
            + engine_gauge(engine_url, "vllm:num_requests_waiting")
            == 0
        ),
        within_s,
        "the engine running nothing",
    )


def sidecar_metric(sidecar_url: str, line_prefix: str) -> float:
    """Sum of the sidecar's samples whose line starts with line_prefix (name plus optional labels)."""
    text = HTTP.get(f"{sidecar_url}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_prefix))


def ready(url: str) -> bool:
    return HTTP.get(f"{url}/ready", timeout=2).status_code == 200


def generate_ok(url: str, headers: dict[str, str] | None = None, attempts: int = 3) -> bool:
    """One real generation through url: the engine still works. A 504 is asked again: the suite's
    short read timeout (FAST) once met a single 2 s step of vLLM 0.18.0 on two loaded cores, a slow
    engine, not a broken one; anything else is the answer."""
    for _ in range(attempts):
        resp = HTTP.post(f"{url}/v1/completions", json=completion(max_tokens=4), headers=headers, timeout=60)
        if resp.status_code != 504:
            break
    return resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1


# --- streams on threads --------------------------------------------------------------------------


@dataclass
class StreamResult:
    status: int | None = None
    events: list[bytes] = field(default_factory=list)  # payloads of `data:` lines, in order
    ended_at: float | None = None  # time.monotonic() when the stream finished or broke
    error: str | None = None  # the client-side exception when the connection broke

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == b"[DONE]"

    @property
    def tokens(self) -> int:
        return sum(1 for e in self.events if e.startswith(b"{") and b'"error"' not in e and b'"text"' in e)

    def error_event(self) -> dict | None:
        """The last event when it is an OpenAI-shaped error object (ours or vLLM's)."""
        for raw in reversed(self.events):
            if raw == b"[DONE]":
                continue
            try:
                payload = json.loads(raw)
            except ValueError:
                return None
            err = payload.get("error") if isinstance(payload, dict) else None
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                return err
            return None
        return None


class StreamThread(threading.Thread):
    """POST a streaming request and record every SSE event; optionally hang up after `cut_after` events."""

    def __init__(
        self,
        url: str,
        payload: dict,
        headers: dict[str, str] | None = None,
        cut_after: int | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.payload, self.headers = url, payload, headers
        self.cut_after, self.timeout_s = cut_after, timeout_s
        self.result = StreamResult()
        self.started_streaming = threading.Event()

    def run(self) -> None:
        r = self.result
        try:
            with (
                plain_client(timeout=self.timeout_s) as client,
                client.stream("POST", f"{self.url}/v1/completions", json=self.payload, headers=self.headers) as resp,
            ):
                r.status = resp.status_code
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        r.events.append(line[6:].encode())
                        self.started_streaming.set()
                        if self.cut_after is not None and len(r.events) >= self.cut_after:
                            break  # leaving the block closes the connection mid-stream
        except httpx.HTTPError as exc:
            r.error = f"{type(exc).__name__}: {exc}"
        finally:
            r.ended_at = time.monotonic()
            self.started_streaming.set()


def start_streams(url: str, n: int, payload: dict, wait_events: bool = True, **kw: Any) -> list[StreamThread]:
    threads = [StreamThread(url, payload, **kw) for _ in range(n)]
    for t in threads:
        t.start()
    if wait_events:
        for t in threads:
            assert t.started_streaming.wait(60), "a stream never produced its first event"
    return threads


# --- processes and sockets ---------------------------------------------------------------------


def engine_core(launcher_pid: int) -> psutil.Process:
    """vLLM's engine-core child (it sets its proctitle to VLLM::EngineCore)."""
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no EngineCore process under pid {launcher_pid}")


def connections_to(pid: int, port: int) -> int:
    """ESTABLISHED TCP connections from process pid to 127.0.0.1:port."""
    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def sockets_to(pid: int, port: int) -> set[tuple[str, int]]:
    """Local addresses of the TCP sockets process pid holds to port, in any state (one the engine
    closed stays in CLOSE_WAIT, and holds a descriptor, until the process closes it too)."""
    return {tuple(c.laddr) for c in psutil.Process(pid).net_connections(kind="tcp") if c.raddr and c.raddr.port == port}


@dataclass
class Usage:
    rss_mb: float
    fds: int
    threads: int
    engine_conns: int


def usage(pid: int, engine_port: int) -> Usage:
    proc = psutil.Process(pid)
    return Usage(
        rss_mb=proc.memory_info().rss / 2**20,
        fds=proc.num_fds(),
        threads=proc.num_threads(),
        engine_conns=connections_to(pid, engine_port),
    )


class TransitionWatcher(threading.Thread):
    """Polls /ready and /health every 50 ms and notes when each first failed, for exact timings."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.unready_at: float | None = None
        self.unlive_at: float | None = None
        self.unlive_status: str | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        with plain_client(timeout=2) as client:
            while not self._halt.is_set():
                now = time.monotonic()
                try:
                    if self.unready_at is None and client.get(f"{self.url}/ready").status_code != 200:
                        self.unready_at = now
                    if self.unlive_at is None:
                        resp = client.get(f"{self.url}/health")
                        if resp.status_code != 200:
                            self.unlive_at, self.unlive_status = now, resp.json().get("status")
                except httpx.HTTPError:
                    pass
                if self.unready_at is not None and self.unlive_at is not None:
                    return
                time.sleep(0.05)

    def finish(self) -> None:
        self._halt.set()
        self.join(timeout=5)
