"""The admission queue, shared fairly between tenants: start-time fair queuing by weight.

Why: a single FIFO lets the tenant that sends the most take the whole queue, so under overload a
light tenant waits behind a heavy one's backlog, or is refused for it. Here each tenant has its own
FIFO (order within a tenant is arrival order, as before) and the next slot goes to the tenant
whose head has the smallest start tag: a waiter's start tag is the later of the queue's virtual
time and its tenant's previous finish tag, and its finish tag is start + 1 / weight. Tenants that
are all backlogged are served in proportion to their weights; a tenant that was idle comes back at
the current virtual time, with no credit saved up and no debt (Goyal, Vin and Cheng's SFQ, 1996).
With one tenant this is the plain FIFO it replaces.

`Share` is what admission knows of a request's tenant: its name, weight and how much of the queue
it may hold (its weight's share of max_queue, at least 1, so that the caps of all tenants add up to
about the queue's bound, which stays a hard cap, and no tenant's backlog can fill the others' part).
A waiter that leaves (timed out, its client gone) takes its place in the order with it: the
tenant keeps no debt for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

from palmyra_serve.sidecar.core.share import Share

T = TypeVar("T")


class FairQueue(Generic[T]):
    __slots__ = ("_finish", "_len", "_queues", "_seq", "_step", "_vtime")

    def __init__(self) -> None:
        self._queues: dict[str, deque[tuple[float, int, T]]] = {}
        self._finish: dict[str, float] = {}  # each tenant's last finish tag (bounded by the tenants file)
        self._step: dict[str, float] = {}  # each tenant's 1 / weight, as its last push had it
        self._vtime = 0.0
        self._seq = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def count(self, tenant: str) -> int:
        queue = self._queues.get(tenant)
        return len(queue) if queue else 0

    def waiting_tenants(self) -> Iterator[str]:
        return (tenant for tenant, queue in self._queues.items() if queue)

    def ahead_of(self, share: Share) -> int:
        """How many waiters a request of `share`'s tenant arriving now would have ahead of it: those
        whose start tag is not after the one it would get. Each tenant's tags only grow along its
        queue, so the scan of a tenant stops at its first later tag: a backlogged tenant whose turn
        is not yet costs one comparison."""
        start = max(self._vtime, self._finish.get(share.tenant, 0.0))
        ahead = 0
        for queue in self._queues.values():
            for tag, _, _ in queue:
                if tag > start:
                    break
                ahead += 1
        return ahead

    def push(self, share: Share, item: T) -> None:
        start = max(self._vtime, self._finish.get(share.tenant, 0.0))
        step = self._step[share.tenant] = 1.0 / share.weight
        self._finish[share.tenant] = start + step
        self._seq += 1
        queue = self._queues.get(share.tenant)
        if queue is None:
            queue = self._queues[share.tenant] = deque()
        queue.append((start, self._seq, item))
        self._len += 1

    def pop(self) -> T:
        """The next waiter to serve (IndexError when none)."""
        best: deque[tuple[float, int, T]] | None = None
        for queue in self._queues.values():
            if queue and (best is None or queue[0][:2] < best[0][:2]):
                best = queue
        if best is None:
            raise IndexError("pop from an empty FairQueue")
        start, _, item = best.popleft()
        self._vtime = max(self._vtime, start)
        self._len -= 1
        return item

    def remove(self, tenant: str, item: T) -> bool:
        """Take a waiter out (it timed out or its client left); False when it is not queued."""
        queue = self._queues.get(tenant)
        if not queue:
            return False
        for i, entry in enumerate(queue):
            if entry[2] is item:
                # The tenant keeps no debt for a waiter that left: its later waiters, and its
                # finish tag, move up by the share the one that left would have used.
                step = self._step[tenant]
                later = [queue.pop() for _ in range(len(queue) - i - 1)]
                queue.pop()
                queue.extend((start - step, seq, it) for start, seq, it in reversed(later))
                self._finish[tenant] -= step
                self._len -= 1
                return True
        return False
