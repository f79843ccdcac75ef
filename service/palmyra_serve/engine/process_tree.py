"""The processes an engine is made of, found the way the kernel groups them, and ended together.

vLLM's API server starts an engine-core process, which starts the workers (and Python's
multiprocessing starts a resource tracker). They stay in the session and process group they were
born in, but not under their parent: when the API server dies first they are re-parented, and
live on holding the model's memory (on an accelerator, the device's). So a dead engine is ended
by what the kernel still knows about it: its session, its process group, and, for a launcher
that made itself a child subreaper, its descendants.

Linux only (/proc, prctl); elsewhere nothing is found and nothing is adopted.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
# SIGTERM first: vLLM's engine core stops its workers on it, and the resource tracker (which
# ignores SIGTERM) then sees its pipe close and unlinks the shared memory they leaked.
GRACE_S = 5.0
# After SIGKILL: a process leaves /proc once the kernel has torn it down (on an accelerator that
# includes releasing the device's memory, which can take seconds).
KILL_WAIT_S = 15.0
POLL_S = 0.05


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str


def _read(stat: Path) -> Proc | None:
    try:
        text = stat.read_text()
    except OSError:  # gone between listing and reading, or not ours to read
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return Proc(int(stat.parent.name), int(fields[1]), int(fields[2]), int(fields[3]), fields[0])


def processes() -> list[Proc]:
    """Every live process (zombies are dead: they hold no memory and wait only to be reaped)."""
    if not PROC.is_dir():
        return []
    found = (_read(d / "stat") for d in PROC.iterdir() if d.name.isdigit())
    return [p for p in found if p is not None and p.state not in ("Z", "X")]


def members(leader: int) -> list[int]:
    """Live processes (this one aside) of the session or the process group whose leader was
    `leader`. The number stays theirs while any of them lives, even once the leader is gone."""
    me = os.getpid()
    return sorted(p.pid for p in processes() if leader in (p.sid, p.pgid) and p.pid != me)


def descendants(pid: int) -> list[int]:
    """Live processes below `pid` by parentage."""
    children: dict[int, list[int]] = {}
    for p in processes():
        children.setdefault(p.ppid, []).append(p.pid)
    found: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return sorted(found)


def set_subreaper(on: bool) -> bool:
    """Make this process a child subreaper (or stop being one): orphans below it are re-parented to
    it instead of to init, so it can still find and reap them. Returns whether it was one before."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # no prctl: not Linux
        return False
    was = ctypes.c_int(0)
    prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(int(on)), 0, 0, 0)
    return bool(was.value)


def reap_any() -> None:
    """Collect every child that has exited (none of them is waited on by anyone else)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(find: Callable[[], list[int]], timeout_s: float, reap: bool) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        if reap:
            reap_any()
        left = find()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_S)


def ignores_sigterm(pid: int) -> bool:
    """Whether the process set SIGTERM to be ignored (SIG_IGN, not a handler): multiprocessing's
    resource tracker does, and exits by itself once every process that shares its pipe is gone."""
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:
        return False
    ignored = next((line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), "0")
    return bool(int(ignored, 16) & (1 << (signal.SIGTERM - 1)))


def end_all(
    find: Callable[[], list[int]], grace_s: float | None = None, kill_wait_s: float | None = None, reap: bool = False
) -> list[int]:
    """End every process `find` names, and return what is left (empty when everything went).

    SIGTERM, and up to `grace_s` for them to go. Then SIGKILL for those that do not ignore
    SIGTERM, and one more `grace_s` for those that do: multiprocessing's resource tracker ignores
    it and exits once the others are gone, after unlinking the shared memory they left in
    /dev/shm (killed with them, it would leave that behind). Then SIGKILL for whatever `find`
    still names, up to `kill_wait_s` for it to leave. `find` is asked again at each step, so a
    process started meanwhile is ended too. `reap`: they are this process's children (a
    subreaper's adopted orphans), collected as they exit.
    """
    grace = GRACE_S if grace_s is None else grace_s
    _signal(find(), signal.SIGTERM)
    left = _wait_gone(find, grace, reap)
    if not left:
        return left
    log.warning("processes %s still there %.1f s after SIGTERM: SIGKILL", " ".join(map(str, left)), grace)
    left = _wait_gone(lambda: _killing(find, spare=ignores_sigterm), grace, reap)
    if left:
        left = _wait_gone(lambda: _killing(find), KILL_WAIT_S if kill_wait_s is None else kill_wait_s, reap)
    return left


def _killing(find: Callable[[], list[int]], spare: Callable[[int], bool] = lambda _pid: False) -> list[int]:
    # Asked at every poll: anything that appears after the SIGKILL (a fork in flight) gets one too.
    left = find()
    _signal([pid for pid in left if not spare(pid)], signal.SIGKILL)
    return left
