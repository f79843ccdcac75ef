"""healthchecks/http_probe.py against a real HTTP server over a real socket.

The probe runs as a subprocess, exactly as Docker, Compose and Kubernetes run it, under
`python3 -I -S` (no site-packages) to prove it needs nothing beyond the standard library.
The server is the `probe_endpoints` fixture: a stdlib http.server in a thread whose routes play
healthy, not ready, slow and trickling. To aim the same checks at the real sidecar, give a
fixture of that name the sidecar's URLs (`/health/sidecar` for healthy, `/ready` before warmup
for not ready).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.helpers import procs

PROBE = Path(__file__).resolve().parents[2] / "healthchecks" / "http_probe.py"
SLOW_S = 6.0  # how long the slow routes stall: well past every timeout used below


@dataclass(frozen=True)
class Endpoints:
    healthy: str  # 200, JSON {"status": "ok", ...}
    not_ready: str  # 503, JSON {"ready": false, ...}
    slow: str  # answers only after SLOW_S
    trickle: str  # 200 headers at once, then the body a byte per second
    down: str  # nothing listens here


class _Handler(BaseHTTPRequestHandler):
    stop: threading.Event  # set by the fixture at teardown so stalled handlers end early

    def log_message(self, format: str, *args: object) -> None:  # `format` as the stdlib names it
        pass  # keep pytest's output clean

    def _json(self, status: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # http.server's name
        if self.path == "/health":
            self._json(200, {"status": "ok", "detail": None, "ready": True})
        elif self.path == "/ready":
            self._json(503, {"ready": False, "phase": "warming_up"})
        elif self.path == "/slow":
            self.stop.wait(SLOW_S)
            self._json(200, {"status": "ok"})
        elif self.path == "/trickle":
            self.send_response(200)
            self.send_header("Content-Length", "64")
            self.end_headers()
            for _ in range(64):
                if self.stop.wait(1.0):
                    return
                self.wfile.write(b" ")
                self.wfile.flush()
        else:
            self._json(404, {"error": "no such route"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the probe hangs up on slow routes on purpose: broken pipes are expected


@pytest.fixture(scope="module")
def probe_endpoints() -> Iterator[Endpoints]:
    stop = threading.Event()
    handler = type("Handler", (_Handler,), {"stop": stop})
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="probe-test-server", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield Endpoints(
            healthy=f"{base}/health",
            not_ready=f"{base}/ready",
            slow=f"{base}/slow",
            trickle=f"{base}/trickle",
            down=f"http://127.0.0.1:{procs.free_port()}/health",
        )
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str
    seconds: float


def run_probe(*args: str, limit: float = 20.0) -> Result:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(PROBE), *args],
        capture_output=True,
        text=True,
        timeout=limit,
        check=False,
    )
    return Result(proc.returncode, proc.stdout.strip(), proc.stderr.strip(), time.monotonic() - started)


def test_healthy_endpoint_exits_zero_with_one_line(probe_endpoints: Endpoints) -> None:
    result = run_probe(probe_endpoints.healthy, "--timeout", "3")
    assert result.code == 0, result
    assert result.out.startswith("healthy: HTTP 200")
    assert len(result.out.splitlines()) == 1


def test_not_ready_503_exits_one(probe_endpoints: Endpoints) -> None:
    result = run_probe(probe_endpoints.not_ready, "--timeout", "3")
    assert result.code == 1, result
    assert "503" in result.out


def test_connection_refused_exits_one(probe_endpoints: Endpoints) -> None:
    result = run_probe(probe_endpoints.down, "--timeout", "3")
    assert result.code == 1, result
    assert "refused" in result.out.lower()


def test_slow_server_exits_one_within_timeout(probe_endpoints: Endpoints) -> None:
    timeout = 1.0
    result = run_probe(probe_endpoints.slow, "--timeout", str(timeout))
    assert result.code == 1, result
    assert "timeout" in result.out
    assert result.seconds < timeout + 1.0, result


def test_trickling_body_is_bounded_by_total_timeout(probe_endpoints: Endpoints) -> None:
    # Each byte arrives well inside the per-read socket timeout: only a total deadline stops it.
    timeout = 2.5
    result = run_probe(probe_endpoints.trickle, "--timeout", str(timeout))
    assert result.code == 1, result
    assert result.seconds < timeout + 1.0, result


@pytest.mark.parametrize(
    ("expectation", "code"),
    [("status=ok", 0), ("ready=true", 0), ("status=engine_dead", 1), ("phase=ready", 1)],
)
def test_expect_json_key(probe_endpoints: Endpoints, expectation: str, code: int) -> None:
    result = run_probe(probe_endpoints.healthy, "--expect-json-key", expectation)
    assert result.code == code, result


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["ftp://127.0.0.1/health"],
        ["http://127.0.0.1:1/", "--timeout", "0"],
        ["http://127.0.0.1:1/", "--timeout", "soon"],
        ["http://127.0.0.1:1/", "--expect-json-key", "no-equals-sign"],
    ],
)
def test_usage_errors_exit_two(args: list[str]) -> None:
    result = run_probe(*args)
    assert result.code == 2, result
    assert result.err.startswith("usage error:")
