"""A tenant's quotas at admission: requests and tokens per sliding minute, requests at once.

Per request (relay/handler.py): admit() before the admission queue, with the tokens to reserve
(reservation.py says how many); settle() when the request ends, with the tokens it really cost;
release() for its concurrency slot. Every verdict carries the tenant's x-ratelimit-* headers, as
OpenAI's API sends them, for the limits the tenant has.

Where the windows live: in this process (one replica), or in Redis (tenants/redis_store.py) so
that every replica counts against one minute. When Redis does not answer within its timeout, this
replica enforces its share of each limit on its own (limit / PALMYRA_QUOTA_REPLICAS, rounded up)
and tries Redis again a second later; palmyra_quota_store_up says which it is doing. A reservation
taken in Redis while Redis then fails is not settled (its reservation stands, the safe side).

Concurrency (max_concurrent) is counted per replica: a shared counter would keep the slots of a
replica that died until something expired them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.tenants.config import TenantSpec
from palmyra_serve.sidecar.tenants.window import SlidingMinute

log = logging.getLogger("palmyra.sidecar")

REQUESTS, TOKENS = "requests", "tokens"
KINDS = (REQUESTS, TOKENS)
# After a Redis failure, requests use the local share for this long before Redis is tried again.
REMOTE_RETRY_S = 1.0


@dataclass(frozen=True)
class WindowState:
    """One limit's standing after a take: what the headers say, and when a refusal may retry."""

    limit: int
    remaining: int
    reset_s: int
    retry_after_s: int = 0  # set when this window refused


def standing(window: SlidingMinute, now: int, limit: int, amount: int, admitted: bool) -> WindowState:
    """The state of `window` after a take of `amount` (admitted or not): the one computation both
    stores use, so the headers mean the same whichever counted."""
    used = window.used(now)
    return WindowState(
        limit=limit,
        remaining=max(0, limit - used),
        reset_s=window.reset(now),
        retry_after_s=0 if admitted else window.retry_after(now, amount, limit),
    )


@dataclass(frozen=True)
class Taken:
    admitted: bool
    slot: int  # the second the tokens were counted in
    states: dict[str, WindowState]  # by kind, for the limits the tenant has
    refused: str | None = None  # the kind that refused


class Store(Protocol):
    """Where the windows live; take() is atomic over both of a tenant's windows."""

    async def take(self, tenant: str, limits: dict[str, int], amounts: dict[str, int]) -> Taken: ...
    async def settle(self, tenant: str, slot: int, delta: int) -> None: ...
    async def ping(self) -> None: ...


class LocalStore:
    """The windows in this process. `share`: this replica's part of each limit (1: all of it)."""

    def __init__(self, share: int = 1, clock: Callable[[], float] = time.time) -> None:
        self.share = max(1, share)
        self.clock = clock
        self._windows: dict[tuple[str, str], SlidingMinute] = {}

    def _window(self, tenant: str, kind: str) -> SlidingMinute:
        key = (tenant, kind)
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = SlidingMinute()
        return window

    async def take(self, tenant: str, limits: dict[str, int], amounts: dict[str, int]) -> Taken:
        now = int(self.clock())
        limits = {kind: math.ceil(limit / self.share) for kind, limit in limits.items()}
        refused = None
        for kind, limit in limits.items():  # all or nothing: check every window before taking
            if not self._window(tenant, kind).fits(now, min(amounts[kind], limit), limit):
                refused = kind
                break
        if refused is None:
            for kind, limit in limits.items():
                self._window(tenant, kind).take(now, min(amounts[kind], limit), limit)
        states = {
            kind: standing(self._window(tenant, kind), now, limit, min(amounts[kind], limit), refused != kind)
            for kind, limit in limits.items()
        }
        return Taken(refused is None, now, states, refused)

    async def settle(self, tenant: str, slot: int, delta: int) -> None:
        self._window(tenant, TOKENS).settle(int(self.clock()), slot, delta)

    async def ping(self) -> None:
        """This process always answers."""


@dataclass
class Reservation:
    """What admit() took for one request, handed back to settle() and release()."""

    tenant: TenantSpec
    tokens: int = 0  # reserved in the tokens window (0: the tenant has no token limit)
    slot: int = 0
    store: Store | None = None
    concurrent: bool = False  # holds one of the tenant's concurrency slots
    settled: bool = False


@dataclass
class Verdict:
    reservation: Reservation | None  # None: refused
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    refusal: errors.ApiError | None = None


def duration(seconds: int) -> bytes:
    """A reset time as OpenAI writes it: 1s, 6m0s, 1h0m0s."""
    h, rest = divmod(max(0, seconds), 3600)
    m, s = divmod(rest, 60)
    if h:
        return b"%dh%dm%ds" % (h, m, s)
    if m:
        return b"%dm%ds" % (m, s)
    return b"%ds" % s


_HEADER_NAMES = {
    kind: (
        b"x-ratelimit-limit-" + kind.encode(),
        b"x-ratelimit-remaining-" + kind.encode(),
        b"x-ratelimit-reset-" + kind.encode(),
    )
    for kind in KINDS
}


def ratelimit_headers(states: dict[str, WindowState]) -> list[tuple[bytes, bytes]]:
    out = []
    for kind, state in states.items():
        limit, remaining, reset = _HEADER_NAMES[kind]
        out += [(limit, b"%d" % state.limit), (remaining, b"%d" % state.remaining), (reset, duration(state.reset_s))]
    return out


_REFUSAL_CODE = {REQUESTS: errors.ErrorCode.RATE_LIMIT_REQUESTS, TOKENS: errors.ErrorCode.RATE_LIMIT_TOKENS}


class Quotas:
    def __init__(
        self,
        remote: Store | None = None,
        replicas: int = 1,
        retry_after_max_s: int = 60,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.remote = remote
        # One replica's own windows: the whole limit without Redis, its share while Redis is away.
        self.local = LocalStore(replicas if remote is not None else 1, clock)
        self.retry_after_max_s = retry_after_max_s
        self.clock = clock
        self.remote_up = remote is not None
        self.remote_errors = 0
        self.on_remote_error: Callable[[], None] | None = None  # the metric's increment, bound by the app
        self._remote_retry_at = 0.0
        self._concurrent: dict[str, int] = {}

    @staticmethod
    def limited(spec: TenantSpec) -> bool:
        return bool(spec.requests_per_minute or spec.tokens_per_minute or spec.max_concurrent)

    async def admit(self, spec: TenantSpec, tokens: int | None) -> Verdict:
        """Take one request and `tokens` from the tenant's limits, or refuse (429 with Retry-After).
        `tokens` None: not a generation, which its tokens limit does not concern."""
        reservation = Reservation(spec)
        if spec.max_concurrent:
            held = self._concurrent.get(spec.name, 0)
            if held >= spec.max_concurrent:
                refusal = errors.over_quota(errors.ErrorCode.TENANT_CONCURRENCY, spec.name, spec.max_concurrent, 1)
                return Verdict(None, [], refusal)
            self._concurrent[spec.name] = held + 1
            reservation.concurrent = True
        limits: dict[str, int] = {}
        if spec.requests_per_minute:
            limits[REQUESTS] = spec.requests_per_minute
        if spec.tokens_per_minute and tokens is not None:
            limits[TOKENS] = spec.tokens_per_minute
        if not limits:
            return Verdict(reservation)
        amounts = {REQUESTS: 1, TOKENS: max(0, tokens or 0)}
        try:
            store, taken = await self._take(spec.name, limits, amounts)
        except BaseException:  # cancelled while asking: the concurrency slot is not kept
            self.release(reservation)
            raise
        headers = ratelimit_headers(taken.states)
        if not taken.admitted:
            self.release(reservation)
            assert taken.refused is not None
            state = taken.states[taken.refused]
            retry = min(self.retry_after_max_s, state.retry_after_s)
            refusal = errors.over_quota(_REFUSAL_CODE[taken.refused], spec.name, state.limit, retry)
            return Verdict(None, headers, refusal)
        if TOKENS in limits:
            reservation.tokens = min(amounts[TOKENS], taken.states[TOKENS].limit)
            reservation.slot = taken.slot
            reservation.store = store
        return Verdict(reservation, headers)

    async def _take(self, tenant: str, limits: dict[str, int], amounts: dict[str, int]) -> tuple[Store, Taken]:
        if self.remote is not None and self.clock() >= self._remote_retry_at:
            try:
                taken = await self.remote.take(tenant, limits, amounts)
            except Exception as exc:  # unreachable, slow, refused: this replica's share from now on
                self._remote_failed(exc)
            else:
                self._remote_back()
                return self.remote, taken
        return self.local, await self.local.take(tenant, limits, amounts)

    def _remote_back(self) -> None:
        if not self.remote_up:
            log.info("quota store answering again: limits are shared across replicas")
        self.remote_up = True
        self._remote_retry_at = 0.0

    def _remote_failed(self, exc: Exception) -> None:
        self.remote_errors += 1
        if self.on_remote_error is not None:
            self.on_remote_error()
        self._remote_retry_at = self.clock() + REMOTE_RETRY_S
        if self.remote_up:
            log.error(
                "quota store unreachable: each replica enforces its share of every limit until it answers",
                extra={"fields": {"error": f"{type(exc).__name__}: {exc}", "replicas": self.local.share}},
            )
        self.remote_up = False

    async def settle(self, reservation: Reservation, tokens: int) -> None:
        """Correct the reservation by what the request really cost (prompt + completion tokens)."""
        if reservation.settled:
            return
        reservation.settled = True
        if reservation.store is None or tokens == reservation.tokens:
            return
        try:
            await reservation.store.settle(reservation.tenant.name, reservation.slot, tokens - reservation.tokens)
        except Exception as exc:
            self._remote_failed(exc)  # the reservation stands

    def release(self, reservation: Reservation) -> None:
        if reservation.concurrent:
            reservation.concurrent = False
            self._concurrent[reservation.tenant.name] -= 1

    async def watch(self, interval_s: float = REMOTE_RETRY_S) -> None:
        """While the shared store is away, ask it every interval whether it is back, so that
        palmyra_quota_store_up turns 1 when it answers, not only at the next limited request."""
        assert self.remote is not None
        while True:
            await asyncio.sleep(interval_s)
            if self.remote_up:
                continue
            try:
                await self.remote.ping()
            except Exception as exc:
                self._remote_failed(exc)
            else:
                self._remote_back()

    async def close(self) -> None:
        close = getattr(self.remote, "close", None)
        if close is not None:
            await close()

    def in_use(self, tenant: str) -> int:
        return self._concurrent.get(tenant, 0)
