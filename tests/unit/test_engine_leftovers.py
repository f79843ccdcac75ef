"""Nothing of a dead engine outlives it: the launcher and `up` end what an engine left behind.

Regression for a fault run of the quick start: after vLLM's API server was SIGKILLed, its engine
core and worker (and a multiprocessing resource tracker that ignores SIGTERM) lived on,
re-parented to init, because `up` stopped only a launcher that was still running. Here plain
dummy processes stand in for vLLM's: an "API server" that forks children which ignore SIGTERM,
one of them in a session of its own (the launcher must still find it), and that then dies or
exits. The engine tier does the same to the real vLLM CPU engine (tests/engine/test_up.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from palmyra_serve import up
from palmyra_serve.engine import process_tree
from tests.helpers.waiting import wait_until

# The API server's stand-in. argv: pid file, then what to start and how to end. Children: `group`
# stays in its process group and session and ignores SIGTERM (like the resource tracker),
# `session` calls setsid and ignores SIGTERM, `polite` stays and honours SIGTERM (like the engine
# core), `orphan` is a grandchild whose parent exits at once (re-parented) that lives 1 s,
# `tracker` ignores SIGTERM and, like multiprocessing's resource tracker, cleans up and exits once
# no process holds its pipe any more, `stuck` catches SIGTERM and does nothing (like an engine core
# whose shutdown hangs).
# Endings: `exit=N` exits with N once the children are up, `wait` waits to be killed, `term`
# records a SIGTERM in the pid file and exits 0.
DUMMY = textwrap.dedent("""
    import os, signal, sys, time
    out, args = sys.argv[1], sys.argv[2:]

    def note(line):
        with open(out, "a") as f:
            f.write(line + "\\n")

    def hold(setsid, ignore_term, life=None):
        if setsid:
            os.setsid()
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(life if life else 3600)
        os._exit(0)

    signal.signal(signal.SIGTERM, lambda *_: (note("TERM"), os._exit(0)) if "term" in args else os._exit(1))
    note(f"api_server {os.getpid()}")
    if "tracker" in args:  # first: every later child holds the pipe, as vLLM's processes do
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while os.read(r, 1):
                pass
            note("cleaned")
            os._exit(0)
        os.close(r)
        note(f"tracker {pid}")
    if "stuck" in args:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, lambda *_: None)
            while True:
                time.sleep(3600)
        note(f"stuck {pid}")
    for kind in ("group", "session", "polite"):
        if kind in args:
            pid = os.fork()
            if pid == 0:
                hold(kind == "session", kind != "polite")
            note(f"{kind} {pid}")
    if "orphan" in args:
        mid = os.fork()
        if mid == 0:
            if os.fork() == 0:
                note(f"orphan {os.getpid()}")
                hold(False, False, life=1.0)
            os._exit(0)
        os.waitpid(mid, 0)
    note("ready")
    ending = [a for a in args if a.startswith("exit=")]
    if ending:
        sys.exit(int(ending[0].split("=")[1]))
    while True:
        time.sleep(3600)
""")

# The launcher as the engine containers and `up` run it: a process of its own, the dummy its child.
LAUNCHER = textwrap.dedent("""
    import sys
    from palmyra_serve.engine import launcher, process_tree
    process_tree.GRACE_S = 0.5  # the dummies need no time to stop; SIGKILL comes after this
    sys.exit(launcher.run(launcher.EngineCommand(argv=sys.argv[1:])))
""")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Engine:
    """The dummy engine's pid file: the children it started, once it says it is ready."""

    def __init__(self, tmp_path: Path) -> None:
        self.script = tmp_path / "dummy_api_server.py"
        self.script.write_text(DUMMY)
        self.pids = tmp_path / "pids"
        self.launchers: list[subprocess.Popen] = []

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, str(self.script), str(self.pids), *args]

    def lines(self) -> list[str]:
        return self.pids.read_text().splitlines() if self.pids.exists() else []

    def started(self) -> dict[str, int]:
        """What the dummy started so far by kind, its own pid as `api_server`."""
        return {kind: int(pid) for kind, pid in (line.split() for line in self.lines() if " " in line)}

    def ready(self) -> dict[str, int]:
        wait_until(lambda: "ready" in self.lines(), 20, "the dummy engine's children")
        return self.started()

    def start_launcher(self, *args: str) -> subprocess.Popen:
        launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, *self.argv(*args)], start_new_session=True)
        self.launchers.append(launcher)
        return launcher


@pytest.fixture
def engine(tmp_path: Path):
    e = Engine(tmp_path)
    yield e
    # Whatever a failing test left: never leak it into the next one.
    for launcher in e.launchers:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    for pid in e.started().values():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_killed_api_server_leaves_nothing_behind_the_launcher(engine):
    launcher = engine.start_launcher("group", "session", "polite", "wait")
    children = engine.ready()
    api_server = children.pop("api_server")
    assert psutil.Process(api_server).ppid() == launcher.pid
    assert all(alive(pid) for pid in children.values())
    # Its own process group, in the launcher's session: a signal reaches vLLM once, via the launcher.
    assert os.getpgid(api_server) == api_server and os.getsid(api_server) == launcher.pid
    os.kill(api_server, signal.SIGKILL)
    assert launcher.wait(timeout=30) == 128 + signal.SIGKILL  # its child's fate, as a shell says it
    assert [kind for kind, pid in children.items() if alive(pid)] == []


def test_an_api_server_that_exits_has_its_leftovers_ended_and_its_code_kept(engine):
    launcher = engine.start_launcher("polite", "session", "exit=3")
    assert launcher.wait(timeout=30) == 3
    assert [kind for kind, pid in engine.ready().items() if alive(pid)] == []  # the API server too


def test_sigterm_reaches_the_api_server_once_and_what_it_leaves_is_ended(engine):
    launcher = engine.start_launcher("group", "term")
    children = engine.ready()
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 0
    assert engine.lines().count("TERM") == 1
    assert not alive(children["group"])


def test_a_resource_tracker_outlives_the_stuck_ones_long_enough_to_clean_up(engine):
    """The engine core may hang in its shutdown after SIGTERM (seen mid-stream once its API server
    was gone): it gets SIGKILL, but the tracker, which ignores SIGTERM on purpose, is left to see
    its pipe close and unlink the shared memory before it exits; SIGKILLed together it could not."""
    launcher = engine.start_launcher("tracker", "stuck", "wait")
    children = engine.ready()
    os.kill(children.pop("api_server"), signal.SIGKILL)
    assert launcher.wait(timeout=30) == 128 + signal.SIGKILL
    assert "cleaned" in engine.lines()
    assert [kind for kind, pid in children.items() if alive(pid)] == []


def test_the_launcher_reaps_orphans_while_the_engine_runs(engine):
    """As PID 1 of the engine container the launcher adopts every orphan, and a PID 1 that does not
    reap them piles up zombies; as a subreaper it does the same outside a container."""
    launcher = engine.start_launcher("orphan", "wait")
    orphan = engine.ready()["orphan"]
    try:
        # Adopted by the launcher (not by init), and gone from the process table once it exits.
        wait_until(lambda: psutil.Process(orphan).ppid() == launcher.pid, 5, "the orphan re-parented to the launcher")
        wait_until(lambda: not psutil.pid_exists(orphan), 10, "the exited orphan reaped")
        assert launcher.poll() is None
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)


def test_up_stops_the_session_of_an_engine_that_already_died(engine, tmp_path, monkeypatch):
    """`up` restarts a dead engine; before that, nothing of the old one may remain, even when its
    leader (here the dummy itself, no launcher) is already gone and its children ignore SIGTERM."""
    monkeypatch.setattr(process_tree, "GRACE_S", 0.5)
    proc = up._spawn(engine.argv("group", "polite", "exit=0"), dict(os.environ), tmp_path / "engine.log")
    assert proc.wait(timeout=30) == 0
    children = engine.ready()
    del children["api_server"]  # the leader, gone
    assert all(alive(pid) for pid in children.values())  # what used to survive
    up._stop(proc, "engine", 5)
    assert [kind for kind, pid in children.items() if alive(pid)] == []
    assert process_tree.members(proc.pid) == []


def test_the_process_table_reads_names_with_spaces_and_parentheses(tmp_path):
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; open('/proc/self/comm', 'w').write(') x (1 2'); print(flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert child.stdout is not None
    try:
        child.stdout.readline()  # the name is set
        (me,) = [p for p in process_tree.processes() if p.pid == child.pid]
        assert (me.ppid, me.pgid, me.sid) == (os.getpid(), child.pid, child.pid)
        assert process_tree.members(child.pid) == [child.pid]
        assert child.pid in process_tree.descendants(os.getpid())
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
