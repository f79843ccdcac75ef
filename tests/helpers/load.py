"""Closed-loop load for the app tests: N client threads, each sending its next streamed completion
as soon as the previous one ended, until stopped."""

from __future__ import annotations

import threading
from typing import Any, Self

import httpx


class ClosedLoop:
    """Every status is recorded (429s included). A client that gets a 429 waits `pause_after_429_s`
    before its next request, as a client honouring a refusal a little would."""

    def __init__(
        self, url: str, clients: int, body: dict[str, Any], *, timeout_s: float = 30.0, pause_after_429_s: float = 0.0
    ) -> None:
        self.url, self.body, self.timeout_s, self.pause_after_429_s = url, body, timeout_s, pause_after_429_s
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.errors: list[str] = []  # transport errors (a response cut short, a reset), each recorded
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self.stop.is_set():
                try:
                    with client.stream("POST", f"{self.url}/v1/completions", json=self.body) as resp:
                        resp.read()
                        self.statuses.append(resp.status_code)
                except httpx.TransportError as exc:
                    self.errors.append(repr(exc))
                    continue
                if resp.status_code == 429 and self.pause_after_429_s:
                    self.stop.wait(self.pause_after_429_s)

    def __enter__(self) -> Self:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
