"""The sliding minute a tenant's quota is counted over. Pure arithmetic, no I/O, no clock of its own.

Why a sliding minute of one-second slots, not a token bucket: a bucket that starts full lets a
tenant spend two minutes' worth in its first minute (the full bucket plus a minute of refill), and
a smaller bucket throttles a steady tenant below its limit. Here the promise is the one an operator
reads off the file: in any 60 seconds, at most the limit is admitted.

- take(now, amount, limit): admitted when what the last 60 s used plus `amount` fits the limit, or
  when nothing was used (an amount larger than the whole limit passes alone, then the minute is
  spent: never a request that can never pass). The amount goes into the current second's slot.
- settle(now, slot, delta): a reservation corrected by what the request really cost, in the slot
  it was taken in; if that slot has left the window, an excess counts now and a refund is dropped.
  A correction may push usage over the limit (the request cost more than reserved): later requests
  wait until it ages out, so over any long span the admitted total stays at the limit.
- retry_after(): seconds until enough of the oldest usage ages out for `amount` to fit.
- reset(): seconds until the window is empty again (OpenAI's x-ratelimit-reset-*).

tenants/redis_store.py runs the same rules inside Redis (one Lua script); the unit tests hold the
two to the same answers.
"""

from __future__ import annotations

WINDOW_S = 60


class SlidingMinute:
    """`slots` in ascending order of their second, with their running `total`: expiring the
    oldest and reading the usage cost O(1) per call, not a pass over the minute (the relay asks
    several times per request: this is on its hot path)."""

    __slots__ = ("slots", "total")

    def __init__(self, slots: dict[int, int] | None = None) -> None:
        self.slots: dict[int, int] = dict(sorted(slots.items())) if slots else {}
        self.total = sum(self.slots.values())

    def _expire(self, now: int) -> None:
        oldest = now - WINDOW_S
        slots = self.slots
        while slots:
            first = next(iter(slots))
            if first > oldest:
                return
            self.total -= slots.pop(first)

    def _add(self, now: int, amount: int) -> None:
        """Into the current second; if the clock stepped back, into the newest second instead, so
        that the slots stay in order."""
        slots = self.slots
        if slots:
            now = max(now, next(reversed(slots)))
        slots[now] = slots.get(now, 0) + amount
        self.total += amount

    def used(self, now: int) -> int:
        self._expire(now)
        return self.total

    def fits(self, now: int, amount: int, limit: int) -> bool:
        used = self.used(now)
        return used <= 0 or used + amount <= limit

    def take(self, now: int, amount: int, limit: int) -> bool:
        if not self.fits(now, amount, limit):
            return False
        self._add(now, amount)
        return True

    def settle(self, now: int, slot: int, delta: int) -> None:
        self._expire(now)
        if slot in self.slots:
            self.slots[slot] += delta
            self.total += delta
        elif delta > 0:
            self._add(now, delta)

    def retry_after(self, now: int, amount: int, limit: int) -> int:
        """Whole seconds (at least 1) until `amount` fits, if nothing else is taken meanwhile: a slot
        taken in second s stops counting at s + WINDOW_S."""
        excess = self.used(now) + amount - limit
        for second, taken in self.slots.items():
            if excess <= 0:
                break
            excess -= taken
            if excess <= 0:
                return max(1, second + WINDOW_S - now)
        return max(1, next(reversed(self.slots), now) + WINDOW_S - now) if excess > 0 else 1

    def reset(self, now: int) -> int:
        """Whole seconds until nothing in the window counts any more (0 when nothing does)."""
        self._expire(now)
        for second in reversed(self.slots):
            if self.slots[second] > 0:
                return second + WINDOW_S - now
        return 0
