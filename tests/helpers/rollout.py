"""A rolling update on one machine, to count what a rollout costs the clients.

Replicas are real sidecar processes, each in front of the FAKE engine (tests/helpers/fake_engine.py,
whose `fake:slow` prompt streams a token every 0.3 s: two real CPU engines do not fit on 2 cores).
They sit behind a real HAProxy that stands in for Service endpoints plus kube-proxy: it health-checks
each sidecar's `/ready` and stops routing to a replica only after `fall` failed checks, `inter` apart,
which is the few seconds of propagation a cluster has between SIGTERM and the last proxy forgetting
the pod. It never retries and never redispatches (`retries 0`, no `option redispatch`): a request
routed to a replica that refuses it is a failed request, as for a plain Service client.

Replicas join and leave HAProxy through its runtime API (stats socket): the backend declares a few
server slots parked on a closed port and marked down, and a new replica's address is written into a
free slot, where it turns UP only after `rise` passing `/ready` checks, as a new pod's endpoint
becomes ready; when a replica's process has exited its slot is parked again, as the endpoint of a
deleted pod goes away. (Pre-declared slots on fixed ports would work too, but a freshly started
HAProxy counts an unchecked server as UP, and the runtime API also mirrors how endpoints change.)

The rollout follows a Deployment with maxSurge 1 / maxUnavailable 0: start a new replica, wait until
HAProxy routes to it, SIGTERM one old replica, wait for it to exit, repeat. A steady streaming load
runs throughout; every request is counted as ok, failed (not 200, or no response) or cut (200 but
the SSE stream ended without `[DONE]`).

Run it by hand for a table, from the repository root:
    python -m tests.helpers.rollout --propagation 5 0 --runs 3
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.helpers import procs
from tests.helpers.waiting import wait_until

PARKED_PORT = 1  # nothing listens there: a parked slot fails its checks and gets no traffic
# Short sidecar intervals so a replica is ready in seconds (the fake engine answers at once).
SIDECAR_ENV = {
    "PALMYRA_HEALTH_POLL_INTERVAL_S": "0.2",
    "PALMYRA_CANARY_INTERVAL_S": "1",
    "PALMYRA_CANARY_TIMEOUT_S": "2",
    "PALMYRA_WARMUP_MAX_BACKOFF_S": "1",
    "PALMYRA_CONNECT_TIMEOUT_S": "1",
    "PALMYRA_READ_TIMEOUT_S": "10",
    "PALMYRA_WARMUP_REQUEST_TIMEOUT_S": "5",
    "PALMYRA_DRAIN_TIMEOUT_S": "15",
    "PALMYRA_LOG_LEVEL": "info",
}
STREAM = {"model": "palmyra-mini", "prompt": "fake:slow", "stream": True}  # one token every 0.3 s


class HAProxy:
    """A real HAProxy in front of `slots` server slots, driven through its admin socket."""

    def __init__(self, workdir: Path, slots: int = 4, inter_s: float = 1.0, fall: int = 3, rise: int = 2) -> None:
        self.workdir = workdir
        self.slots = [f"r{i}" for i in range(slots)]
        self.inter_s, self.fall, self.rise = inter_s, fall, rise
        self.port = procs.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.socket_path = workdir / "haproxy.sock"
        self.config_path = workdir / "haproxy.cfg"
        self.log_path = workdir / "haproxy.log"
        self.proc: subprocess.Popen | None = None

    def config(self) -> str:
        servers = "\n".join(f"    server {name} 127.0.0.1:{PARKED_PORT} check" for name in self.slots)
        inter_ms = int(self.inter_s * 1000)
        return f"""\
global
    stats socket {self.socket_path} mode 600 level admin
    log stdout format raw local0
defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    # A plain Service client: no second attempt anywhere, no move to another server.
    retries 0
    no option redispatch
frontend clients
    bind 127.0.0.1:{self.port}
    default_backend replicas
backend replicas
    # Each replica that is up gets its turn: a terminating one takes its fixed share of the
    # requests routed during the propagation window, not a share left to chance.
    balance roundrobin
    option httpchk
    http-check send meth GET uri /ready
    http-check expect status 200
    # Leaves a replica {(self.fall - 1) * self.inter_s:g}-{self.fall * self.inter_s:g} s after its /ready turns 503.
    default-server inter {inter_ms} fastinter {inter_ms} downinter {inter_ms} fall {self.fall} rise {self.rise}
    http-response set-header x-served-by %s
{servers}
"""

    def start(self) -> None:
        self.config_path.write_text(self.config())
        self.proc = procs.spawn(["haproxy", "-db", "-f", str(self.config_path)], self.log_path, {})
        wait_until(self.socket_path.exists, 10, "the HAProxy admin socket")
        for name in self.slots:  # a freshly started HAProxy counts unchecked servers as UP
            self.command(f"set server replicas/{name} health down")
        wait_until(lambda: all(s["status"].startswith("DOWN") for s in self.servers().values()), 10, "all slots down")

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc, timeout_s=5)

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            return sock.makefile(encoding="utf-8").read()

    def servers(self) -> dict[str, dict[str, str]]:
        """The backend's servers as HAProxy sees them: status (UP, DOWN, ...), stot (requests sent)."""
        lines = [ln for ln in self.command("show stat -1 4 -1").splitlines() if ln.strip()]
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, ln.split(","), strict=True)) for ln in lines[1:]]
        return {r["svname"]: r for r in rows if r["pxname"] == "replicas"}

    def attach(self, slot: str, port: int) -> None:
        """A new pod's endpoint: routed to once `rise` checks of /ready have passed."""
        self.command(f"set server replicas/{slot} addr 127.0.0.1 port {port}")

    def detach(self, slot: str) -> None:
        """The endpoint of a deleted pod goes away."""
        self.command(f"set server replicas/{slot} addr 127.0.0.1 port {PARKED_PORT}")
        self.command(f"set server replicas/{slot} health down")


@dataclass
class Result:
    started: float
    ended: float
    served_by: str
    outcome: str  # ok / failed / cut
    detail: str = ""


@dataclass
class Tally:
    results: list[Result] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.results if r.outcome == outcome)

    @property
    def sent(self) -> int:
        return len(self.results)


class StreamingLoad:
    """`clients` threads, each streaming one completion after another through the load balancer."""

    def __init__(self, url: str, clients: int = 8, max_tokens: int = 8, pause_s: float = 0.1) -> None:
        self.url = f"{url}/v1/completions"
        self.clients, self.max_tokens, self.pause_s = clients, max_tokens, pause_s
        self.tally = Tally()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # Staggered starts spread the clients over one request's duration: a steady arrival rate,
        # not bursts of `clients` requests at once that could all fall outside a short window.
        cycle = max_tokens * 0.3 + pause_s
        self._threads = [
            threading.Thread(target=self._client, args=(i * cycle / clients,), daemon=True) for i in range(clients)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 30) -> Tally:
        """Let every client finish the stream it is in, then return the tally."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), "a load client did not finish its last stream"
        return self.tally

    def _client(self, offset_s: float) -> None:
        body = {**STREAM, "max_tokens": self.max_tokens}
        self._stop.wait(offset_s)
        with httpx.Client(verify=False, timeout=httpx.Timeout(10.0)) as client:
            while not self._stop.is_set():
                result = self._one(client, body)
                with self._lock:
                    self.tally.results.append(result)
                self._stop.wait(self.pause_s)  # the deliberate pacing of a steady load

    def _one(self, client: httpx.Client, body: dict) -> Result:
        t0 = time.monotonic()
        served_by, status, events = "-", 0, []
        try:
            with client.stream("POST", self.url, json=body) as resp:
                status, served_by = resp.status_code, resp.headers.get("x-served-by", "-")
                if status != 200:
                    resp.read()
                    return Result(t0, time.monotonic(), served_by, "failed", f"{status} {resp.text[:160]}")
                events = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
        except httpx.HTTPError as exc:
            outcome = "cut" if status == 200 else "failed"
            return Result(t0, time.monotonic(), served_by, outcome, f"{type(exc).__name__}: {exc}")
        if not events or events[-1] != "data: [DONE]":
            return Result(t0, time.monotonic(), served_by, "cut", f"{len(events)} events, no [DONE]")
        return Result(t0, time.monotonic(), served_by, "ok")


@dataclass
class Replica:
    slot: str
    sidecar: procs.Server
    stack: contextlib.ExitStack
    sent_before: int  # HAProxy's request count of the slot when this replica took it


@dataclass
class Replacement:
    old: str
    new: str
    sigterm_at: float
    lb_down_after_s: float | None  # SIGTERM until HAProxy stopped routing to the old replica
    exit_after_s: float  # SIGTERM until the old sidecar exited
    exit_code: int


@dataclass
class Report:
    propagation_s: float
    tally: Tally
    replacements: list[Replacement]
    seconds: float

    def served_after_sigterm(self) -> int:
        """Requests the old replicas accepted after their SIGTERM (the propagation window at work)."""
        return sum(
            1
            for rep in self.replacements
            for r in self.tally.results
            if r.served_by == rep.old and r.started >= rep.sigterm_at and r.outcome == "ok"
        )

    def row(self) -> str:
        t = self.tally
        downs = "/".join(
            f"{r.lb_down_after_s:.1f}" if r.lb_down_after_s is not None else "-" for r in self.replacements
        )
        exits = "/".join(f"{r.exit_after_s:.1f}" for r in self.replacements)
        return (
            f"| {self.propagation_s:g} s | {t.sent} | {t.count('failed')} | {t.count('cut')} | "
            f"{self.served_after_sigterm()} | {downs} | {exits} | {self.seconds:.0f} s |"
        )

    def failures(self) -> list[str]:
        t0 = min((r.started for r in self.tally.results), default=0.0)
        return [
            f"{r.started - t0:6.2f} s {r.served_by} {r.outcome}: {r.detail}"
            for r in self.tally.results
            if r.outcome != "ok"
        ]


HEADER = (
    "| propagation | requests sent | failed | cut streams | served by old replicas after SIGTERM | "
    "SIGTERM to LB down (s) | SIGTERM to exit (s) | run |\n|---|---|---|---|---|---|---|---|"
)


class Fleet:
    """Replicas (fake engine + real sidecar), each in its own HAProxy slot."""

    def __init__(self, lb: HAProxy, log_dir: Path, propagation_s: float) -> None:
        self.lb, self.log_dir = lb, log_dir
        self.env = {**SIDECAR_ENV, "PALMYRA_DRAIN_PROPAGATION_S": str(propagation_s)}
        self.replicas: list[Replica] = []
        self._next_slot = 0

    def _free_slot(self) -> str:
        # Round robin: a slot is reused as late as possible, so x-served-by names one replica.
        used = {r.slot for r in self.replicas}
        for _ in self.lb.slots:
            slot = self.lb.slots[self._next_slot % len(self.lb.slots)]
            self._next_slot += 1
            if slot not in used:
                return slot
        raise AssertionError("no free HAProxy slot")

    def start_replica(self) -> Replica:
        """A new pod: its engine, then its sidecar, ready; then its endpoint, up in HAProxy."""
        slot = self._free_slot()
        stack = contextlib.ExitStack()
        try:
            engine = stack.enter_context(procs.fake_engine(self.log_dir))
            sidecar = stack.enter_context(procs.sidecar(engine.url, self.log_dir, extra_env=self.env, timeout_s=30))
            replica = Replica(slot, sidecar, stack, int(self.lb.servers()[slot]["stot"]))
            self.lb.attach(slot, sidecar.port)
            wait_until(lambda: self.lb.servers()[slot]["status"] == "UP", 15, f"HAProxy marking {slot} UP")
        except BaseException:
            stack.close()
            raise
        self.replicas.append(replica)
        return replica

    def wait_served(self, replica: Replica, timeout_s: float = 15) -> None:
        wait_until(
            lambda: int(self.lb.servers()[replica.slot]["stot"]) > replica.sent_before,
            timeout_s,
            f"HAProxy sending requests to {replica.slot}",
        )

    def terminate(self, replica: Replica, new: str, timeout_s: float = 40) -> Replacement:
        """What the kubelet does to the pod being replaced: SIGTERM, and wait for the exit. Then
        the endpoint goes away and the engine stops last (in a pod its preStop holds it back)."""
        proc = replica.sidecar.proc
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        down_at = exited_at = None
        while time.monotonic() - t0 < timeout_s:
            now = time.monotonic()
            # "UP 1/3" is still routed to, after one failed check of three: only DOWN counts.
            if down_at is None and not self.lb.servers()[replica.slot]["status"].startswith("UP"):
                down_at = now
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and (down_at is not None or now - exited_at > 5):
                break
            time.sleep(0.05)
        if exited_at is None:
            raise AssertionError(
                f"replica {replica.slot} still running {timeout_s} s after SIGTERM:\n{replica.sidecar.log()[-3000:]}"
            )
        self.lb.detach(replica.slot)
        replica.stack.close()
        self.replicas.remove(replica)
        return Replacement(
            replica.slot, new, t0, None if down_at is None else down_at - t0, exited_at - t0, proc.returncode
        )

    def close(self) -> None:
        # The count is over: no drain to wait for (each would sit out its propagation delay).
        for replica in self.replicas:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(replica.sidecar.proc.pid, signal.SIGKILL)
        for replica in self.replicas:
            replica.stack.close()
        self.replicas.clear()


def simulate(
    workdir: Path,
    propagation_s: float,
    replicas: int = 2,
    clients: int = 8,
    max_tokens: int = 8,
    inter_s: float = 1.0,
    fall: int = 3,
) -> Report:
    """Start `replicas` replicas behind HAProxy, put a steady streaming load on them, replace every
    one of them one at a time (maxSurge 1, maxUnavailable 0), stop the load, count."""
    t_start = time.monotonic()
    lb = HAProxy(workdir, slots=2 * replicas, inter_s=inter_s, fall=fall)
    fleet = Fleet(lb, workdir, propagation_s)
    replacements: list[Replacement] = []
    load = None
    try:
        lb.start()
        for _ in range(replicas):
            fleet.start_replica()
        load = StreamingLoad(lb.url, clients=clients, max_tokens=max_tokens)
        load.start()
        for replica in fleet.replicas:
            fleet.wait_served(replica)
        for old in list(fleet.replicas):
            new = fleet.start_replica()
            fleet.wait_served(new)
            replacements.append(fleet.terminate(old, new.slot))
        tally = load.stop()
        load = None
    finally:
        if load is not None:
            load.stop()
        fleet.close()
        lb.stop()
    return Report(propagation_s, tally, replacements, time.monotonic() - t_start)


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description="Rolling-update simulation behind HAProxy; prints a table.")
    parser.add_argument(
        "--propagation",
        type=float,
        nargs="+",
        default=[5.0, 0.0],
        help="PALMYRA_DRAIN_PROPAGATION_S values to simulate",
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--failures", action="store_true", help="list every failed or cut request")
    args = parser.parse_args()
    print(HEADER, flush=True)
    for _ in range(args.runs):
        for propagation in args.propagation:
            with tempfile.TemporaryDirectory(prefix="rollout-") as tmp:
                report = simulate(Path(tmp), propagation, clients=args.clients)
            print(report.row(), flush=True)
            if args.failures:
                for line in report.failures():
                    print(f"    {line}")
            print(f"    by outcome and replica: {_breakdown(report)}", file=sys.stderr)


def _breakdown(report: Report) -> dict[str, int]:
    return dict(collections.Counter(f"{r.served_by}:{r.outcome}" for r in report.tally.results))


if __name__ == "__main__":
    main()
