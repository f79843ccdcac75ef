#!/usr/bin/env python3
"""HTTP health probe, Python standard library only.

One script for every place a probe runs: Docker HEALTHCHECK, Compose healthcheck and Kubernetes
exec probe. Images do not need curl (the sidecar image has none), and Kubernetes' httpGet probe
turns into a curl run under `podman kube play`, so an exec probe calling this file works the
same everywhere.

    python3 http_probe.py URL [--timeout S] [--expect-json-key K=V ...]

Exit status: 0 healthy, 1 unhealthy (non-2xx, refused, timeout, body mismatch), 2 usage error.
Prints one short line saying why, which Docker and Kubernetes keep as the probe's output.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

HEALTHY, UNHEALTHY, USAGE = 0, 1, 2
# Probes run often: read only what a health body needs, never a whole large response.
MAX_BODY = 64 * 1024


class _Usage(Exception):
    pass


class _Deadline(Exception):
    pass


def _arm_deadline(seconds: float) -> None:
    """Bound the whole probe, not just each socket operation (a trickling body could otherwise
    take one timeout per read). Signals work only in the main thread; elsewhere the per-socket
    timeout is the only bound."""
    if threading.current_thread() is not threading.main_thread():
        return

    def _expired(_signum: int, _frame: object) -> None:
        raise _Deadline()

    signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _disarm_deadline() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.setitimer(signal.ITIMER_REAL, 0)


class _Parser(argparse.ArgumentParser):
    # argparse exits 2 on its own errors already; this keeps the message to one line.
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Usage(message)


def _expectation(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected K=V, got {text!r}")
    return key, value


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("timeout must be > 0")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="http_probe.py", description="Exit 0 when URL answers 2xx (and matches).")
    parser.add_argument("url", help="http:// or https:// URL to GET")
    parser.add_argument("--timeout", type=_positive, default=3.0, help="total seconds allowed (default 3)")
    parser.add_argument(
        "--expect-json-key",
        type=_expectation,
        action="append",
        default=[],
        metavar="K=V",
        help="require top-level JSON key K to equal V (compared as JSON literal, else as string)",
    )
    args = parser.parse_args(argv)
    if not args.url.startswith(("http://", "https://")):
        raise _Usage(f"URL must start with http:// or https://, got {args.url!r}")
    return args


def _matches(actual: object, wanted: str) -> bool:
    # `ready=true` should match JSON true, `status=ok` the string "ok".
    try:
        literal = json.loads(wanted)
    except ValueError:
        literal = wanted
    return actual == literal or (isinstance(actual, str) and actual == wanted)


def check_body(body: bytes, expectations: list[tuple[str, str]]) -> str | None:
    """Return None when every expectation holds, else the reason it does not."""
    if not expectations:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return "body is not JSON"
    if not isinstance(doc, dict):
        return "body is not a JSON object"
    for key, wanted in expectations:
        if key not in doc:
            return f"key {key!r} missing"
        if not _matches(doc[key], wanted):
            return f"{key}={json.dumps(doc[key])} (want {wanted})"
    return None


def probe(url: str, timeout: float, expectations: list[tuple[str, str]]) -> tuple[int, str]:
    """GET url once; return (exit status, one-line reason)."""
    started = time.monotonic()
    request = urllib.request.Request(url, headers={"User-Agent": "palmyra-http-probe", "Accept": "application/json"})
    _arm_deadline(timeout)
    try:
        # urllib's timeout applies per socket operation; the deadline above bounds the total.
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status = response.status
            body = response.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        return UNHEALTHY, f"unhealthy: HTTP {exc.code} from {url}"
    except (TimeoutError, _Deadline):
        return UNHEALTHY, f"unhealthy: timeout after {timeout:g}s on {url}"
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return UNHEALTHY, f"unhealthy: timeout after {timeout:g}s on {url}"
        return UNHEALTHY, f"unhealthy: {reason} ({url})"
    except (OSError, ValueError) as exc:
        return UNHEALTHY, f"unhealthy: {type(exc).__name__}: {exc} ({url})"
    finally:
        _disarm_deadline()
    elapsed = time.monotonic() - started
    if not 200 <= status < 300:
        return UNHEALTHY, f"unhealthy: HTTP {status} from {url}"
    mismatch = check_body(body, expectations)
    if mismatch is not None:
        return UNHEALTHY, f"unhealthy: {mismatch} ({url})"
    return HEALTHY, f"healthy: HTTP {status} in {elapsed * 1000:.0f} ms ({url})"


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except _Usage as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    code, line = probe(args.url, args.timeout, args.expect_json_key)
    print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
