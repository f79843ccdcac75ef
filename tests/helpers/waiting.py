"""Bounded polling for tests: every wait has a deadline and says what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")
# A poll that cannot reach its server yet (starting, restarting) is a "not yet", not a failure.
NOT_YET: tuple[type[BaseException], ...] = (httpx.TransportError, ConnectionError)


def wait_until(predicate: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.1) -> T:
    """Call predicate until it returns something truthy; return that, or fail after timeout_s.
    A predicate that answers None for "not yet" returns what it found, never None."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except NOT_YET as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")


def seconds_until(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.1) -> float:
    """wait_until, returning how long the condition took to hold."""
    t0 = time.monotonic()
    wait_until(predicate, timeout_s, what, interval_s)
    return time.monotonic() - t0
