"""Whether this replica is shutting down, and how far: the one drain state readiness and admission read.

Who sets it: only SidecarState.drain() (app.py), which server.py runs on the first SIGTERM. It
takes two steps, apart by PALMYRA_DRAIN_PROPAGATION_S, because endpoints and gateways keep
routing here for a while after readiness turns false:
- announce() (through HealthState.begin_drain()): /ready answers 503 with phase "draining";
  requests are still admitted and served, each answered with `Connection: close`.
- close() (through the engine admission's drain()): admission refuses newcomers (Draining, a 503
  with Retry-After) and the drain waits for what is in flight or queued.

Who reads it: HealthState (`draining`: readiness and its phase), the admission built on it
(`draining`: acquire() raises Draining), and relay/handler.py through those two (the connection
closes once announced, a newcomer gets 503 once closed). A state of its own is created where
none is passed (a unit under test; the relay's tokenize gate, which a drain does not close).
"""

from __future__ import annotations


class DrainState:
    def __init__(self) -> None:
        self.announced = False
        self.closed = False

    def announce(self) -> None:
        self.announced = True

    def close(self) -> None:
        """Closed implies announced: a replica that refuses new work never reads as ready."""
        self.announced = True
        self.closed = True
