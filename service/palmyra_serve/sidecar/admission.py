"""Admission control: a bounded number of requests in flight, a bounded FIFO queue, and drain.

The engine batches what it is given, so the limit exists to keep latency bounded and to answer
overload with a fast 429 instead of a slow timeout. A released slot is handed straight to the
oldest waiter, so a waiter can never be overtaken by a newcomer.
"""

from __future__ import annotations

import asyncio
from collections import deque

from palmyra_serve.sidecar import errors


class Admission:
    def __init__(self, max_in_flight: int, max_queue: int, queue_timeout_s: float, retry_after_s: int) -> None:
        self.max_in_flight = max_in_flight
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self.draining = False
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        """Take a slot, waiting in the queue if needed; raises ApiError 429/503 when refused."""
        if self.draining:
            raise errors.draining(self.retry_after_s)
        if self.in_flight < self.max_in_flight and not self._waiters:
            self.in_flight += 1
            self._idle.clear()
            return
        if len(self._waiters) >= self.max_queue:
            raise errors.queue_full(self.retry_after_s)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self._idle.clear()
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                await fut
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return  # the slot arrived at the deadline: keep it
            self._discard(fut)
            raise errors.queue_timeout(self.retry_after_s) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # we were handed a slot but will never use it
            else:
                self._discard(fut)
            raise

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes on; in_flight is unchanged
                return
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def _discard(self, fut: asyncio.Future[None]) -> None:
        try:
            self._waiters.remove(fut)
        except ValueError:
            pass
        if not self._waiters and self.in_flight == 0:
            self._idle.set()

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests from now on; wait until nothing is in flight or queued. True if it emptied."""
        self.draining = True
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False
