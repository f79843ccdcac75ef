"""Starting and stopping the real processes tests talk to: engine, sidecar, fakes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from palmyra_serve.engine import process_tree
from tests.helpers import engine_under_test

VENV_BIN = Path(sys.executable).parent
PALMYRA = str(VENV_BIN / "palmyra-serve")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log_path: Path
    api_key: str | None = None
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    probe_port: int = 0  # a sidecar's PALMYRA_PROBE_PORT: probes and the full /metrics; 0: none

    @property
    def probe_url(self) -> str:
        assert self.probe_port, "started without a probe port (procs.sidecar(..., probe=True))"
        return f"http://127.0.0.1:{self.probe_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def http_get(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(
    url: str,
    proc: subprocess.Popen,
    log_path: Path,
    timeout_s: float,
    headers: dict[str, str] | None = None,
    want: int = 200,
) -> dict | None:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"process exited with {proc.returncode} before {url} answered:\n"
                f"{log_path.read_text(errors='replace')[-4000:]}"
            )
        try:
            status, body = http_get(url, timeout=5, headers=headers)
            last = (status, body[:300])
            if status == want:
                try:
                    return json.loads(body)
                except ValueError:
                    return None
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(
        f"{url} not {want} after {timeout_s} s (last {last}):\n{log_path.read_text(errors='replace')[-4000:]}"
    )


def spawn(argv: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True
        )


def signal_session(leader: int, sig: int) -> None:
    """Signal every process of the session `leader` started (spawn() gives each child one). The
    engine launcher runs vLLM in a process group of its own inside that session, so a signal to
    the launcher's group alone reaches the launcher only: the whole engine is its session."""
    for pid in process_tree.members(leader):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 40.0) -> int:
    """Signal the process group (the launcher forwards it), wait, then kill whatever is left of its
    session. Returns the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    signal_session(proc.pid, signal.SIGKILL)
    return proc.wait()


@contextlib.contextmanager
def engine(
    model_dir: Path,
    log_dir: Path,
    dtype: str = "bfloat16",
    api_key: str | None = "engine-test-key",
    extra_env: dict[str, str] | None = None,
    timeout_s: float = 420.0,
    port: int | None = None,
) -> Iterator[Server]:
    """The real vLLM CPU engine through the project's launcher, on `port` (default: a free one);
    which vLLM is tests/helpers/engine_under_test.py's choice."""
    port = port or free_port()
    env = {
        "PALMYRA_MODEL": str(model_dir),
        "PALMYRA_MODEL_SOURCE": "local",
        "PALMYRA_DTYPE": dtype,
        "PALMYRA_MAX_MODEL_LEN": "2048",
        "PALMYRA_CPU_KVCACHE_GIB": "2",
        **engine_under_test.environment(),
        **(extra_env or {}),
    }
    if api_key:
        env["PALMYRA_ENGINE_API_KEY"] = api_key
    log_path = log_dir / f"engine-{port}.log"
    proc = spawn([*engine_under_test.launcher(), "engine", "--host", "127.0.0.1", "--port", str(port)], log_path, env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            f"{url}/v1/models",
            proc,
            log_path,
            timeout_s,
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
        )
        yield Server(url=url, proc=proc, log_path=log_path, api_key=api_key, port=port, env=env)
    finally:
        stop(proc)


class RestartableEngine:
    """procs.engine on a port fixed at construction, so that a sidecar in front of it finds a
    restarted engine where the old one was. `server` is the running engine's Server (None when
    stopped)."""

    def __init__(
        self, model_dir: Path, log_dir: Path, dtype: str = "bfloat16", extra_env: dict[str, str] | None = None
    ) -> None:
        self.model_dir, self.log_dir, self.dtype = model_dir, log_dir, dtype
        self.extra_env = extra_env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._cm: contextlib.AbstractContextManager[Server] | None = None
        self.server: Server | None = None

    def start(self) -> float:
        """Start it and wait until it serves; returns the seconds that took."""
        t0 = time.monotonic()
        self._cm = engine(self.model_dir, self.log_dir, dtype=self.dtype, port=self.port, extra_env=self.extra_env)
        self.server = self._cm.__enter__()
        return time.monotonic() - t0

    def stop(self) -> None:
        """TERM its group, then KILL whatever is left of its session (procs.stop); a stopped
        (SIGSTOP) group is continued first, since it ignores SIGTERM until then."""
        if self.server is not None:
            with contextlib.suppress(ProcessLookupError):
                signal_session(self.server.proc.pid, signal.SIGCONT)
        if self._cm is not None:
            self._cm.__exit__(None, None, None)
            self._cm = None
        self.server = None

    @property
    def pid(self) -> int:
        """The launcher's pid: the leader of the engine's session."""
        assert self.server is not None, "the engine is not running"
        return self.server.proc.pid


@contextlib.contextmanager
def sidecar(
    engine_url: str,
    log_dir: Path,
    engine_api_key: str | None = None,
    extra_env: dict[str, str] | None = None,
    wait_ready: bool = True,
    timeout_s: float = 300.0,
    probe: bool = False,
) -> Iterator[Server]:
    """The real sidecar process (uvicorn, real socket) in front of engine_url; with `probe`, on a
    probe port too, as deployed (Server.probe_port: the probes and the full /metrics page, per-tenant
    series included). A PALMYRA_PROBE_PORT in extra_env does the same on that port."""
    port = free_port()
    # No load balancer follows this sidecar's /ready, so no propagation delay unless a test asks.
    # Auth fails closed: a test sidecar serves without keys only because it says so here; tests
    # that pass PALMYRA_API_KEYS get them enforced (configured keys win over the switch).
    env = {
        "PALMYRA_ENGINE_URL": engine_url,
        "PALMYRA_PORT": str(port),
        "PALMYRA_HOST": "127.0.0.1",
        "PALMYRA_DRAIN_PROPAGATION_S": "0",
        "PALMYRA_AUTH_DISABLED": "true",
        **({"PALMYRA_ENGINE_API_KEY": engine_api_key} if engine_api_key else {}),
        **({"PALMYRA_PROBE_PORT": str(free_port())} if probe else {}),
        **(extra_env or {}),
    }
    probe_port = int(env.get("PALMYRA_PROBE_PORT") or 0)
    log_path = log_dir / f"sidecar-{port}.log"
    proc = spawn([PALMYRA, "sidecar"], log_path, env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{url}/health/sidecar", proc, log_path, 30)
        if wait_ready:
            wait_for(f"{url}/ready", proc, log_path, timeout_s)
        yield Server(url=url, proc=proc, log_path=log_path, port=port, env=env, probe_port=probe_port)
    finally:
        stop(proc)


FAKE_ENGINE = str(Path(__file__).resolve().parent / "fake_engine.py")


@contextlib.contextmanager
def fake_engine(
    log_dir: Path, start_delay: float = 0.0, port: int | None = None, generate_delay: float = 0.0
) -> Iterator[Server]:
    port = port or free_port()
    log_path = log_dir / f"fake-{port}.log"
    argv = [sys.executable, FAKE_ENGINE, str(port)] + (["--start-delay", str(start_delay)] if start_delay else [])
    argv += ["--generate-delay", str(generate_delay)] if generate_delay else []
    proc = spawn(argv, log_path, {})
    url = f"http://127.0.0.1:{port}"
    try:
        if not start_delay:
            wait_for(f"{url}/health", proc, log_path, 20)
        yield Server(url=url, proc=proc, log_path=log_path, port=port)
    finally:
        stop(proc, timeout_s=5)


@dataclass
class Up:
    """A running `palmyra-serve up`: its console log, its ports, the processes it started."""

    proc: subprocess.Popen
    port: int
    engine_port: int
    log_path: Path
    logs: Path  # PALMYRA_UP_LOG_DIR: engine.log, sidecar.log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def console(self) -> str:
        return self.log_path.read_text(errors="replace")

    def engine_launcher(self) -> psutil.Process:
        """The `palmyra-serve engine` process `up` started (the leader of the engine's session)."""
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "engine" in cmd and "--port" in cmd and str(self.engine_port) in cmd and "palmyra_serve.cli" in cmd:
                return p
        raise AssertionError(f"no engine process on port {self.engine_port}")


def _end_sessions(sessions: set[int]) -> None:
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(p.pid) in sessions:
                p.kill()


@contextlib.contextmanager
def up(model_dir: Path, log_dir: Path, name: str = "up", timeout_s: float = 420.0) -> Iterator[Up]:
    """`palmyra-serve up` serving model_dir (keys off, 1 GiB of KV cache), once it says it is served.
    On the way out it is stopped with SIGINT if still running, then anything of its children's
    sessions that is left is killed: a failing test leaks no engine into the next."""
    port, engine_port = free_port(), free_port()
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                PALMYRA,
                "up",
                "--port",
                str(port),
                "--engine-port",
                str(engine_port),
                "--model",
                str(model_dir),
                "--max-model-len",
                "2048",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PALMYRA_CPU_KVCACHE_GIB": "1", "PALMYRA_UP_LOG_DIR": str(log_dir / f"{name}-logs")},
        )
    u = Up(proc=proc, port=port, engine_port=engine_port, log_path=log_path, logs=log_dir / f"{name}-logs")
    sessions: set[int] = set()
    try:
        deadline = time.monotonic() + timeout_s
        while "is being served at" not in u.console():
            assert proc.poll() is None, u.console()[-3000:]
            assert time.monotonic() < deadline, "up never became ready"
            time.sleep(1)
        yield u
    finally:
        if proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                sessions = {c.pid for c in psutil.Process(proc.pid).children()}
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                stop(proc, signal.SIGKILL, 5)
        _end_sessions(sessions)
