"""Driving the sidecar's edge as an attacker would: raw sockets (bytes as they are, no client
normalizes them), the sidecar's own counters, and its RSS sampled from outside."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import psutil

from tests.helpers.procs import Server

MIB = 1024 * 1024


def raw_exchange(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Send bytes as they are (no client normalizes the path), read until the server closes or stops."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        return read_response(s)


def read_response(s: socket.socket) -> bytes:
    """One response on `s`: its head and a Content-Length body, or what came before the server
    closed or reset the connection (b"" if nothing did)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
            if b"\r\n\r\n" in out:
                body = out.partition(b"\r\n\r\n")[2]
                length = header_of(out, b"content-length")
                if length is not None and len(body) >= int(length):
                    break
    except (ConnectionResetError, TimeoutError):
        pass
    return out


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def header_of(response: bytes, name: bytes) -> bytes | None:
    for line in response.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def counter(client: httpx.Client, sc: Server, series: str) -> float:
    """One series of the sidecar's /metrics, e.g. 'palmyra_rejections_total{reason="x"}' (0 if absent)."""
    for line in client.get(f"{sc.url}/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def rejections(client: httpx.Client, sc: Server, reason: str) -> float:
    return counter(client, sc, f'palmyra_rejections_total{{reason="{reason}"}}')


class RssPeak:
    """A process's RSS sampled every 10 ms from outside, and its CPU time, while the block runs."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.before = self.peak = self.proc.memory_info().rss
        self.cpu_before = self._cpu()
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _cpu(self) -> float:
        times = self.proc.cpu_times()
        return times.user + times.system

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.01)

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.before) / MIB

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu_s = self._cpu() - self.cpu_before


def busy_connection(port: int) -> socket.socket:
    """A connection in the middle of a request: a POST whose body never finishes arriving (the
    relay waits for it until the body deadline). Never closed to make room at the cap."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model"'
    )
    return s
