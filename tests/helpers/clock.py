"""A clock the test sets by hand (`clock.now += 0.1`), injected where the code under test takes one."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
