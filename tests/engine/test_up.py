"""`palmyra-serve up` end to end: real engine + sidecar, a real completion, a killed engine restarted
while the sidecar stays up, Ctrl-C leaves nothing."""

from __future__ import annotations

import os
import signal

import psutil

from tests.helpers import procs
from tests.helpers.api import HTTP
from tests.helpers.waiting import wait_until


def test_up_serves_restarts_a_dead_engine_then_sigint_leaves_no_process(tiny_model_dir, log_dir):
    with procs.up(tiny_model_dir, log_dir) as u:
        proc, port, engine_port, log_path = u.proc, u.port, u.engine_port, u.log_path
        out = log_path.read_text()
        assert f"http://127.0.0.1:{port}" in out and "curl " in out
        # No key configured: the quick start, and only it, serves without auth, and says so.
        assert "auth disabled for this local quick start (PALMYRA_AUTH_DISABLED=true)" in out
        resp = HTTP.post(
            f"http://127.0.0.1:{port}/v1/completions",
            timeout=60,
            json={"model": "palmyra-mini", "prompt": "Hello", "max_tokens": 5},
        )
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 5
        # The engine's /v1 is guarded by the generated pod-local key: only the sidecar gets in.
        assert HTTP.get(f"http://127.0.0.1:{engine_port}/v1/models", timeout=5).status_code == 401
        # The terminal shows progress, not vLLM's start-up chatter (the engine's log has it).
        assert "Application startup complete" not in log_path.read_text(errors="replace")

        # The engine dies: `up` says so, restarts it with backoff, and the same sidecar serves again.
        # The launcher's group holds the launcher alone (vLLM's API server has a group of its own),
        # so what is left of vLLM is up's to end (tests/engine/test_up_engine_death.py checks that).
        sidecar_pid = next(c.pid for c in psutil.Process(proc.pid).children() if "sidecar" in " ".join(c.cmdline()))
        dead = u.engine_launcher()
        os.killpg(dead.pid, signal.SIGKILL)

        console = u.console
        wait_until(lambda: "restarting the engine in" in console(), 30, "up to notice the dead engine")
        wait_until(lambda: "engine restarted (restart 1)" in console(), 30, "the engine restarted")
        wait_until(lambda: "ready again in " in console(), 420, "ready again after the restart", interval_s=1)
        assert u.engine_launcher().pid != dead.pid
        assert psutil.Process(sidecar_pid).is_running()  # the sidecar stayed up throughout
        # Readiness may dip again while the fresh engine settles on a busy machine (a slow /health
        # is a not-ready): wait for it rather than sample it once.
        wait_until(
            lambda: HTTP.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code == 200,
            120,
            "/ready true after the restart",
            interval_s=0.5,
        )
        resp = HTTP.post(
            f"http://127.0.0.1:{port}/v1/completions",
            timeout=60,
            json={"model": "palmyra-mini", "prompt": "Hello", "max_tokens": 3},
        )
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3
        family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        family += [
            p.pid for p in psutil.process_iter(["cmdline"]) if str(engine_port) in " ".join(p.info["cmdline"] or [])
        ]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0

        def alive() -> list[int]:
            return [
                pid
                for pid in set(family)
                if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            ]

        try:
            wait_until(lambda: not alive(), 5, "every process of up gone")
        except AssertionError:
            raise AssertionError(f"left behind: {alive()}") from None
        assert "stopped" in log_path.read_text()
        # The terminal shows progress; the children's output went to the log files it named.
        assert "Application startup complete" in (log_dir / "up-logs" / "engine.log").read_text(errors="replace")
        assert "sidecar started" in (log_dir / "up-logs" / "sidecar.log").read_text()
