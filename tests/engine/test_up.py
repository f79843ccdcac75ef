"""`palmyra-serve up` end to end, on one `up` run (each engine start costs a minute or more here):
a real completion with the quick start's settings; each of vLLM's processes killed, then the
engine's launcher, each engine restarted by `up` while the same sidecar serves on; Ctrl-C while the
last restart is still starting leaves nothing.

Nothing of a dead engine survives it, whichever of its processes died. Regression for a fault run
of the quick start: after vLLM's API server was SIGKILLed (idle or mid-stream) `up` restarted the
engine, but the old VLLM::EngineCore and VLLM::Worker (4.8 GB RSS per worker on the full model)
and a resource tracker lived on, re-parented to init, for as long as the machine ran. Measured
here before the fix with the tiny stand-in: EngineCore 805 MiB, Worker 2046 MiB, tracker 12 MiB,
still there after `up` itself stopped. One kill per engine start, each on the engine the previous
restart brought up: the API server mid-stream, the engine core while its engine is still starting
(before it is ready: a death during start-up must be cleaned up too), a worker mid-stream, then the
launcher's process group while that restart is starting. Only two of the five engines are waited
for until ready (the first and the one the mid-stream worker kill needs): each wait is an engine
start. After each of
vLLM's, once `up` says it restarted the engine, no process of the old engine's session or process
groups may remain, nor any of the /dev/shm segments its processes mapped (structure, not a memory
figure).

The tests share the run and build on each other's state, in file order.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helpers import procs
from tests.helpers.api import HTTP, completion, plain_client
from tests.helpers.waiting import wait_until

# vLLM names its processes: the engine core and the workers by process title (/proc/<pid>/comm
# keeps 15 characters of it), the API server by its module on the command line.
KINDS = {
    "api_server": lambda p: "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline()),
    "engine_core": lambda p: p.name().startswith("VLLM::EngineCor"),
    "worker": lambda p: p.name().startswith("VLLM::Worker"),
}
# (what dies, and when: "mid-stream" on a ready engine, or "starting", as soon as the three
# processes exist): restarts 1 to 3; the launcher's own death is restart 4
KILLS = (("api_server", "mid-stream"), ("engine_core", "starting"), ("worker", "mid-stream"))


def engine_processes(launcher: psutil.Process) -> dict[str, psutil.Process] | None:
    """The launcher's vLLM processes by kind, once all three exist."""
    found: dict[str, psutil.Process] = {}
    for p in launcher.children(recursive=True):
        for kind, is_kind in KINDS.items():
            try:
                if is_kind(p):
                    found.setdefault(kind, p)
            except psutil.Error:
                pass
    return found if len(found) == len(KINDS) else None


def of_engine(sid: int, groups: set[int]) -> list[str]:
    """Live processes in the old engine's session or in one of its process groups."""
    left = []
    for p in psutil.process_iter(["name", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and (os.getsid(p.pid) == sid or os.getpgid(p.pid) in groups):
                left.append(f"{p.pid} {p.info['name']} rss={p.memory_info().rss // 2**20} MiB")
        except (psutil.Error, OSError):  # gone meanwhile
            pass
    return left


def shared_memory(pids: set[int]) -> set[str]:
    """The /dev/shm segments these processes map (vLLM's message queues between its processes)."""
    found = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        found |= {line.split()[-1] for line in maps.splitlines() if " /dev/shm/" in line}
    return found


class Stream(threading.Thread):
    """A long streamed completion through the sidecar; `started` is set at its first bytes; `tail`
    keeps its last bytes, `cut` whether the connection broke rather than ended."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.started = url, threading.Event()
        self.tail, self.cut = b"", False

    def run(self) -> None:
        body = completion("Tell me a long story", max_tokens=1500, stream=True, ignore_eos=True)
        try:
            with (
                plain_client(timeout=120) as client,
                client.stream("POST", f"{self.url}/v1/completions", json=body) as resp,
            ):
                for chunk in resp.iter_bytes():
                    self.started.set()
                    self.tail = (self.tail + chunk)[-4096:]
        except httpx.HTTPError:
            self.cut = True  # the engine died under it: that is the point

    def ended_as_a_failure(self) -> bool:
        """An error event or a broken connection: never a stream that looks complete."""
        return self.cut or b'"error"' in self.tail


def kill_and_check(u: procs.Up, restart: int, target: str, when: str) -> None:
    """Kill the current engine's `target`, wait for `up` to restart the engine, and check that
    nothing of the old one remains."""
    launcher = u.engine_launcher()
    vllm = wait_until(lambda: engine_processes(launcher), 60, "the engine's three vLLM processes")
    sid, groups = os.getsid(launcher.pid), {os.getpgid(p.pid) for p in (launcher, *vllm.values())}
    assert sid == launcher.pid  # up starts each engine in a session of its own
    tree = {launcher.pid} | {c.pid for c in launcher.children(recursive=True)}
    segments = shared_memory(tree)
    stream = None
    if when == "mid-stream":
        stream = Stream(u.url)
        stream.start()
        assert stream.started.wait(60), "the stream never started"
    victim = vllm[target]
    engine_log = u.logs / "engine.log"
    seen = engine_log.stat().st_size
    t_kill = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    wait_until(
        lambda: f"engine restarted (restart {restart})" in u.console(),
        90,
        f"up to restart the engine after its {target} was killed",
        interval_s=0.2,
    )
    took = time.monotonic() - t_kill
    left = of_engine(sid, groups)
    print(
        f"{target} killed {when} (pid {victim.pid}); up restarted the engine "
        f"{took:.1f} s later; left of the old engine (session {sid}, groups {sorted(groups)}): {left or 'nothing'}"
    )
    said = engine_log.read_bytes()[seen:].decode(errors="replace").splitlines()
    for line in said:  # what the launcher found and did (ended leftovers, needed SIGKILL)
        if "engine processes behind" in line or "SIGKILL" in line:
            print(f"  launcher: {line.strip()}")
    kept = sorted(x for x in segments if Path(x).exists())
    print(f"  its /dev/shm segments: {len(segments)}, still there: {kept}")
    assert left == [], f"after the {target} was killed, processes of the old engine remain: {left}"
    # Its shared memory too: the resource tracker unlinks it, if it is not killed before the others.
    assert kept == [], f"after the {target} was killed, the old engine's shared memory remains"
    assert not [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    if stream is not None:
        stream.join(30)
        assert not stream.is_alive(), "the stream outlived its engine"
        assert stream.ended_as_a_failure(), f"the stream ended as if complete: {stream.tail[-300:]!r}"


def wait_ready_again(u: procs.Up, restart: int) -> None:
    """Until `up` says the engine of this restart is ready (an engine killed while starting never is)."""
    t0 = time.monotonic()
    started = f"engine restarted (restart {restart})"
    wait_until(
        lambda: "ready again in " in u.console().partition(started)[2],
        420,
        "ready again after the restart",
        interval_s=1,
    )
    wait_until(
        lambda: HTTP.get(f"{u.url}/ready", timeout=5).status_code == 200,
        120,
        "/ready true after the restart",
        interval_s=0.5,
    )
    print(f"  ready again {time.monotonic() - t0:.0f} s later")


@pytest.fixture(scope="module")
def up(tiny_model_dir, log_dir) -> Iterator[procs.Up]:
    t0 = time.monotonic()
    with procs.up(tiny_model_dir, log_dir) as u:
        print(f"\nup ready in {time.monotonic() - t0:.0f} s")
        yield u


@pytest.fixture(scope="module")
def sidecar_pid(up) -> int:
    """The sidecar `up` started first: it must be the one serving after every engine restart."""
    return next(c.pid for c in psutil.Process(up.proc.pid).children() if "sidecar" in " ".join(c.cmdline()))


def serves(up: procs.Up, tokens: int) -> None:
    resp = HTTP.post(
        f"{up.url}/v1/completions", timeout=60, json={"model": "palmyra-mini", "prompt": "Hello", "max_tokens": tokens}
    )
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == tokens, resp.text


def test_up_serves_without_keys_and_only_the_sidecar_reaches_the_engine(up, sidecar_pid):
    out = up.console()
    assert f"http://127.0.0.1:{up.port}" in out and "curl " in out
    # No key configured: the quick start, and only it, serves without auth, and says so.
    assert "auth disabled for this local quick start (PALMYRA_AUTH_DISABLED=true)" in out
    serves(up, 5)
    # The engine's /v1 is guarded by the generated pod-local key: only the sidecar gets in.
    assert HTTP.get(f"http://127.0.0.1:{up.engine_port}/v1/models", timeout=5).status_code == 401
    # The terminal shows progress, not vLLM's start-up chatter (the engine's log has it).
    assert "Application startup complete" not in up.console()


def test_each_way_an_engine_dies_leaves_nothing_of_it_behind(up, sidecar_pid):
    t0 = time.monotonic()
    for restart, (target, when) in enumerate(KILLS, start=1):
        if when == "mid-stream" and restart > 1:  # the first engine is ready: the fixture waited
            wait_ready_again(up, restart - 1)
            serves(up, 3)  # the sidecar `up` started first serves again, from the restarted engine
            assert psutil.Process(sidecar_pid).is_running()
        kill_and_check(up, restart, target, when)
    print(f"test wall time {time.monotonic() - t0:.0f} s")


def test_a_killed_launcher_is_restarted_and_the_sidecar_untouched(up, sidecar_pid):
    # The launcher of the engine that restart 3 is starting dies: `up` says so and restarts it with
    # backoff (restart 4; the next test stops it while it starts), the sidecar untouched throughout.
    # The launcher's group holds the launcher alone (vLLM's API server has a group of its own), so
    # what is left of vLLM is up's to end, as the previous test checked for each of vLLM's processes.
    dead = up.engine_launcher()
    os.killpg(dead.pid, signal.SIGKILL)

    def said_since_restart_3() -> str:
        return up.console().partition("engine restarted (restart 3)")[2]

    wait_until(lambda: "restarting the engine in" in said_since_restart_3(), 30, "up to notice the dead engine")
    wait_until(lambda: "engine restarted (restart 4)" in said_since_restart_3(), 30, "the engine restarted")
    assert up.engine_launcher().pid != dead.pid
    assert psutil.Process(sidecar_pid).is_running()  # the sidecar stayed up throughout


def test_sigint_while_the_engine_restarts_stops_everything(up):
    # The launcher kill's restart is under way: Ctrl-C now meets an engine still starting (waiting
    # for it to be ready first would cost a whole engine start).
    up.engine_launcher()  # the restarted engine's launcher is there
    family = [up.proc.pid] + [c.pid for c in psutil.Process(up.proc.pid).children(recursive=True)]
    family += [
        p.pid for p in psutil.process_iter(["cmdline"]) if str(up.engine_port) in " ".join(p.info["cmdline"] or [])
    ]
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(timeout=90) == 0

    def alive() -> list[int]:
        gone = psutil.STATUS_ZOMBIE
        return [pid for pid in set(family) if psutil.pid_exists(pid) and psutil.Process(pid).status() != gone]

    try:
        wait_until(lambda: not alive(), 5, "every process of up gone")
    except AssertionError:
        raise AssertionError(f"left behind: {alive()}") from None
    assert "stopped" in up.console()
    # The terminal shows progress; the children's output went to the log files it named.
    assert "Application startup complete" in (up.logs / "engine.log").read_text(errors="replace")
    assert "sidecar started" in (up.logs / "sidecar.log").read_text()
