"""`palmyra-serve up`: the quick start. Resolve the model, start the engine and the sidecar as
child process groups, show progress until /ready, print how to call it, and on Ctrl-C stop both
cleanly (sidecar drains first, then the engine), leaving no process behind.

A dead engine is restarted with backoff, as the orchestrated deployments do (Kubernetes'
restartPolicy, Compose's `restart:`), and the console says so, once nothing of the old engine's
session is left; the sidecar stays up, loses readiness while the engine is gone and warms the new
one up. An engine that refused its own arguments is not restarted: the same arguments would be
refused again, so `up` stops with the engine's own message. A dead sidecar stops everything.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from palmyra_serve.engine import process_tree
from palmyra_serve.engine.launcher import detect_platform
from palmyra_serve.model.resolve import resolve
from palmyra_serve.settings import Settings

STOP_TIMEOUT_S = 40.0
# Engine restarts: 1 s, 2 s, 4 s ... up to 60 s apart; an engine that ran this long starts over at 1 s.
RESTART_MIN_S = 1.0
RESTART_MAX_S = 60.0
RESTART_RESET_S = 300.0
# The exit status of a refused start: argparse's on a bad argument or value (vLLM's parser is an
# argparse.ArgumentParser), the launcher's when it refuses its engine key, and doctor's preflight
# when it finds the host unfit. A crash is anything else (an uncaught exception exits 1, a signal
# 128+N).
REFUSED_ARGUMENTS = 2


def _say(msg: str) -> None:
    print(f"[palmyra-serve] {msg}", file=sys.stderr, flush=True)


def _ready(url: str) -> tuple[bool, dict]:
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=2) as resp:
            return True, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return False, json.loads(exc.read())
        except ValueError:
            return False, {"phase": f"http {exc.code}"}
    except (OSError, ValueError):
        return False, {"phase": "sidecar starting"}


def _spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    # Own process group each: vLLM forks engine-core workers, and stopping must reach all of them.
    # Logs go to files so the terminal shows progress, not vLLM's start-up chatter.
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)


def _tail(path: Path, lines: int = 25) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _stop(proc: subprocess.Popen, name: str, timeout_s: float) -> None:
    """Stop a child started by _spawn and everything of its session, whether it is running, or
    died and left processes behind (vLLM's engine core and workers outlive a killed API server,
    and stay in the session: they never call setsid). Returns once none of them is left."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the launcher forwards it to vLLM, which drains
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _say(f"{name} did not stop in {timeout_s:.0f} s; killing it")
        except ProcessLookupError:
            pass
    left = process_tree.end_all(lambda: process_tree.members(proc.pid))
    proc.wait()
    if left:
        _say(f"{name}: processes {' '.join(map(str, left))} of its session survived SIGKILL")


def run_up(settings: Settings) -> int:
    model_dir = resolve(settings)
    exe = [sys.executable, "-m", "palmyra_serve.cli"]
    env = {**os.environ}
    # The pod-local engine key: only the sidecar can use the engine's /v1.
    env["PALMYRA_ENGINE_API_KEY"] = settings.engine_api_key or secrets.token_urlsafe(24)
    env["PALMYRA_ENGINE_URL"] = f"http://127.0.0.1:{settings.engine_port}"
    env["PALMYRA_MODEL"] = str(model_dir)
    env["PALMYRA_MODEL_SOURCE"] = "local"
    env["PALMYRA_MAX_MODEL_LEN"] = str(settings.max_model_len)
    env["PALMYRA_DTYPE"] = settings.dtype
    # One local replica: no endpoints or gateways to stop routing to it, so Ctrl-C need not wait.
    env.setdefault("PALMYRA_DRAIN_PROPAGATION_S", "0")
    # Resolved here, not left at auto: the sidecar has no torch to detect it and sizes its admission
    # ceiling by it (vLLM's default max-num-seqs: 128 on CPU, 256 on an accelerator; docs/admission.md).
    env["PALMYRA_PLATFORM"] = detect_platform() if settings.platform == "auto" else settings.platform
    if settings.enforce_eager:
        env["PALMYRA_ENFORCE_EAGER"] = "true"
    # Auth fails closed everywhere else; the local quick start on loopback is the one place that
    # serves without keys, and only when none is configured. It says so on its console line.
    auth_note = "client API keys required"
    if not settings.api_keys and settings.api_keys_file is None:
        env["PALMYRA_AUTH_DISABLED"] = "true"
        auth_note = "no client API key: auth disabled for this local quick start (PALMYRA_AUTH_DISABLED=true)"

    settings.up_log_dir.mkdir(parents=True, exist_ok=True)
    url = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else settings.host}:{settings.port}"
    children = Children(
        engine_argv=[*exe, "engine", "--host", "127.0.0.1", "--port", str(settings.engine_port)],
        sidecar_argv=[*exe, "sidecar", "--host", settings.host, "--port", str(settings.port)],
        env=env,
        log_dir=settings.up_log_dir,
        url=url,
    )
    return supervise(
        children,
        served_model_name=settings.served_model_name,
        intro=f"model {model_dir}; logs in {settings.up_log_dir}/; {auth_note}",
    )


@dataclass(frozen=True)
class Children:
    """What `up` starts: the engine and the sidecar commands, their environment, where their logs
    go, and the sidecar's URL it polls for /ready."""

    engine_argv: list[str]
    sidecar_argv: list[str]
    env: dict[str, str]
    log_dir: Path
    url: str


def refusal_message(log_text: str) -> str:
    """The engine's own words when it refused to start: argparse prints its usage, then one
    `PROG: error: ...` line; the launcher logs `refusing to start: ...`. The last such line, else
    the log's last non-empty line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    said = [line for line in lines if ": error: " in line or "refusing to start" in line]
    return said[-1] if said else (lines[-1] if lines else "(the engine printed nothing)")


def supervise(children: Children, served_model_name: str = "palmyra-mini", intro: str = "") -> int:
    """Start both children and watch them until Ctrl-C (SIGINT or SIGTERM), a dead sidecar, or an
    engine that refused to start (its arguments, or the host doctor judged); restart an engine that
    crashed. Returns up's exit status: 0 after Ctrl-C, 1 when the sidecar died, 2 when the engine
    refused to start."""
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    logs = {"engine": children.log_dir / "engine.log", "sidecar": children.log_dir / "sidecar.log"}
    engine_argv, env, url = children.engine_argv, children.env, children.url
    engine_log_start = _size(logs["engine"])  # where this engine's lines begin (the log is appended to)
    engine = _spawn(engine_argv, env, logs["engine"])
    sidecar = _spawn(children.sidecar_argv, env, logs["sidecar"])
    t0 = engine_started = time.monotonic()
    code = 0
    restarts = 0
    backoff = RESTART_MIN_S
    restart_at: float | None = None
    announced = was_ready = ready_since_start = False
    try:
        _say(f"engine (vLLM) and sidecar starting; {intro}")
        last = ""
        while not stopping:
            now = time.monotonic()
            if sidecar.poll() is not None:
                _say(f"sidecar exited unexpectedly; the end of {logs['sidecar']}:\n{_tail(logs['sidecar'])}")
                code = 1
                break
            if restart_at is None and engine.poll() is not None:
                ran = now - engine_started
                _say(
                    f"engine exited with code {engine.returncode} after {ran:.0f} s; the end of "
                    f"{logs['engine']}:\n{_tail(logs['engine'])}"
                )
                if engine.returncode == REFUSED_ARGUMENTS and not ready_since_start:
                    # A configuration error, not a crash: the same command would be refused again.
                    said = refusal_message(_read_from(logs["engine"], engine_log_start))
                    _say(
                        f"the engine refused to start: {said}\n"
                        "not restarting it: fix what it names (PALMYRA_ENGINE_EXTRA_ARGS, the PALMYRA_ "
                        "setting behind a flag: docs/configuration.md; a host problem doctor found: "
                        "docs/ascend-troubleshooting.md) and run up again"
                    )
                    code = REFUSED_ARGUMENTS
                    break
                if ran >= RESTART_RESET_S:
                    backoff = RESTART_MIN_S
                _say(f"restarting the engine in {backoff:.0f} s (restart {restarts + 1}); the sidecar stays up")
                # What is left of its session (engine core, workers), before the next one starts.
                _stop(engine, "engine", STOP_TIMEOUT_S)
                restart_at = now + backoff
                backoff = min(backoff * 2, RESTART_MAX_S)
            if restart_at is not None and now >= restart_at:
                restarts += 1
                restart_at = None
                engine_log_start = _size(logs["engine"])
                engine = _spawn(engine_argv, env, logs["engine"])
                engine_started = t0 = now
                ready_since_start = False
                _say(f"engine restarted (restart {restarts}); waiting for it to be ready again")
            ok, body = _ready(url)
            if ok and not was_ready:
                was_ready = ready_since_start = True
                if announced:
                    _say(f"ready again in {now - t0:.0f} s after the engine restart")
                    continue
                announced = True
                _say(f"ready in {now - t0:.0f} s (weights: {body.get('weights')})")
                print(
                    f"\npalmyra-mini is being served at {url}\n"
                    f"  curl {url}/v1/completions -H 'Content-Type: application/json' \\\n"
                    f'       -d \'{{"model": "{served_model_name}", "prompt": "Hello", "max_tokens": 16}}\'\n'
                    f"  health {url}/health  ready {url}/ready  metrics {url}/metrics\n"
                    f"Ctrl-C stops both.\n",
                    flush=True,
                )
            elif not ok:
                if was_ready:
                    was_ready = False
                    _say(f"not ready (phase {body.get('phase')}, engine {body.get('engine_health')})")
                progress = body.get("progress") or {}
                line = f"{body.get('phase')} {progress.get('done', 0)}/{progress.get('total', 0)}"
                if line != last:
                    _say(f"{now - t0:5.0f} s  {line}")
                    last = line
            time.sleep(0.5)
    finally:
        _say("stopping: sidecar drains, then the engine")
        _stop(sidecar, "sidecar", STOP_TIMEOUT_S)
        _stop(engine, "engine", STOP_TIMEOUT_S)
        _say("stopped")
    return code
