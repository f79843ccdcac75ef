"""`palmyra-serve up` end to end: real engine + sidecar, a real completion, a killed engine restarted
while the sidecar stays up, Ctrl-C leaves nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil

from helpers import procs
from helpers.api import HTTP
from helpers.waiting import wait_until


def engine_launcher(engine_port: int) -> psutil.Process:
    """The `palmyra-serve engine` process `up` started (the head of the engine's process group)."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "engine" in cmd and "--port" in cmd and str(engine_port) in cmd and "palmyra_serve.cli" in cmd:
            return p
    raise AssertionError(f"no engine process on port {engine_port}")


def test_up_serves_restarts_a_dead_engine_then_sigint_leaves_no_process(tiny_model_dir, log_dir):
    port, engine_port = procs.free_port(), procs.free_port()
    log_path = log_dir / "up.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([procs.PALMYRA, "up", "--port", str(port), "--engine-port", str(engine_port),
                                 "--model", str(tiny_model_dir), "--max-model-len", "2048"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "PALMYRA_CPU_KVCACHE_GIB": "1",
                                     "PALMYRA_UP_LOG_DIR": str(log_dir / "up-logs")})
    try:
        deadline = time.monotonic() + 420
        while "is being served at" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "up never became ready"
            time.sleep(1)
        out = log_path.read_text()
        assert f"http://127.0.0.1:{port}" in out and "curl " in out
        # No key configured: the quick start, and only it, serves without auth, and says so.
        assert "auth disabled for this local quick start (PALMYRA_AUTH_DISABLED=true)" in out
        resp = HTTP.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                          json={"model": "palmyra-mini", "prompt": "Hello", "max_tokens": 5})
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 5
        # The engine's /v1 is guarded by the generated pod-local key: only the sidecar gets in.
        assert HTTP.get(f"http://127.0.0.1:{engine_port}/v1/models", timeout=5).status_code == 401
        # The terminal shows progress, not vLLM's start-up chatter (the engine's log has it).
        assert "Application startup complete" not in log_path.read_text(errors="replace")

        # The engine dies: `up` says so, restarts it with backoff, and the same sidecar serves again.
        sidecar_pid = next(c.pid for c in psutil.Process(proc.pid).children()
                           if "sidecar" in " ".join(c.cmdline()))
        dead = engine_launcher(engine_port)
        os.killpg(dead.pid, signal.SIGKILL)

        def console() -> str:
            return log_path.read_text(errors="replace")
        wait_until(lambda: "restarting the engine in" in console(), 30, "up to notice the dead engine")
        wait_until(lambda: "engine restarted (restart 1)" in console(), 30, "the engine restarted")
        wait_until(lambda: "ready again in " in console(), 420, "ready again after the restart", interval_s=1)
        assert engine_launcher(engine_port).pid != dead.pid
        assert psutil.Process(sidecar_pid).is_running()  # the sidecar stayed up throughout
        # Readiness may dip again while the fresh engine settles on a busy machine (a slow /health
        # is a not-ready): wait for it rather than sample it once.
        wait_until(lambda: HTTP.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200, 120,
                   "/ready true after the restart", interval_s=0.5)
        resp = HTTP.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                         json={"model": "palmyra-mini", "prompt": "Hello", "max_tokens": 3})
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
        family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        family += [p.pid for p in psutil.process_iter(["cmdline"])
                   if str(engine_port) in " ".join(p.info["cmdline"] or [])]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0

        def alive() -> list[int]:
            return [pid for pid in set(family) if psutil.pid_exists(pid) and
                    psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        try:
            wait_until(lambda: not alive(), 5, "every process of up gone")
        except AssertionError:
            raise AssertionError(f"left behind: {alive()}") from None
        assert "stopped" in log_path.read_text()
        # The terminal shows progress; the children's output went to the log files it named.
        assert "Application startup complete" in (log_dir / "up-logs" / "engine.log").read_text(errors="replace")
        assert "sidecar started" in (log_dir / "up-logs" / "sidecar.log").read_text()
    finally:
        procs.stop(proc, signal.SIGKILL, 5)
