"""The relay's own CPU per request, in one process: the sidecar's raw-ASGI relay (relay/handler.py)
called as uvicorn calls it, in front of an engine pool that hands back the fast fake engine's
stream (benchmarks/fast_engine.py) from memory. No socket, no HTTP parsing or framing: what is
left is the sidecar's own Python per request (key, body read, field policy, admission, stream
accounting, usage event removed, metrics, access log), the part two trees can differ in.

Settings as workload A of benchmarks/relay.py gives the real sidecar (a key, fixed admission,
access log on). The stream comes in `--writes-per-read` of the fake engine's writes per read
(1: one read per write, as on an idle engine; 0: the whole stream in one read), the requests one
after another; CPU time (time.process_time) over `--requests` after `--warmup`, best of `--repeat`.
`--profile FILE` writes cProfile's table (sorted by own time) of one more pass.

`--parts` also times two pieces of the path: the body's inspection alone (the relay's `_inspect`,
or its `inspect` step: parse, checks, rewrites; `--requests` calls), and the whole path again with
the relay's usage-event filter taken out (the UsageEventFilter of the module holding the stream's
loop, relay/pump.py or relay/handler.py, replaced by None for that pass: no check per read, nothing
removed; the engine still sends the event when asked), the difference being what removing the
event costs. A tree without that filter or that method skips the piece.

Run it against any tree's sidecar with PYTHONPATH (the relay of d6b8b7d and 38ae7a8, one method
per request, and the later one of named steps, relay/pump.py holding the stream's loop, alike):

    PYTHONPATH=/path/to/tree/service python -m benchmarks.relay_path --route completions,responses,messages
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import importlib
import io
import json
import os
import pstats
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from benchmarks.fast_engine import stream_of
from benchmarks.relay import API_KEY, ROUTES, workload_a_env

# Never reached: the pool below answers.
ENV = {**workload_a_env(), "PALMYRA_ENGINE_URL": "http://127.0.0.1:9"}


class MemoryResponse:
    """EngineResponse's interface (upstream/pool.py) over reads held in memory."""

    __slots__ = ("_at", "_reads", "content_type", "opened_at", "raw_headers", "reason", "status")

    def __init__(self, reads: list[bytes]) -> None:
        self._reads = reads
        self._at = 0
        self.status = 200
        self.reason = "OK"
        self.raw_headers = [(b"content-type", b"text/event-stream")]
        self.content_type = "text/event-stream"
        self.opened_at = 0.0

    async def read_some(self) -> bytes:
        if self._at == len(self._reads):
            return b""
        self._at += 1
        return self._reads[self._at - 1]

    @property
    def finished(self) -> bool:
        return self._at == len(self._reads)

    def release(self) -> None:
        pass


class MemoryPool:
    """EnginePool.request() answering every streamed generation as the fast fake engine does."""

    def __init__(self, writes_per_read: int) -> None:
        self.writes_per_read = writes_per_read
        self.requests = 0

    async def request(self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> Any:
        self.requests += 1
        writes = stream_of(target.decode(), body)
        k = self.writes_per_read or len(writes)
        return MemoryResponse([b"".join(writes[i : i + k]) for i in range(0, len(writes), k)])


@functools.cache
def module(*names: str) -> Any:
    """The first of these modules the tree has (modules moved between the trees compared); looked up
    once, so a name the tree lacks costs no failed import per request."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(f"none of {names}")


def relay_under_test() -> tuple[Any, MemoryPool, Any]:
    """The sidecar's relay built as the sidecar builds it, its pool replaced; and a connection's hook."""
    os.environ.update(ENV)
    from palmyra_serve import logs
    from palmyra_serve.settings import Settings
    from palmyra_serve.sidecar.app import create_app

    settings = Settings()
    logs.configure(settings.log_level)
    relay: Any = create_app(settings).sidecar.relay
    pool = MemoryPool(1)
    # The engine's pool replaced by one of the same interface, where the tree keeps it.
    if hasattr(relay, "pump"):
        relay.pump.pool = pool
    else:
        relay.pool = pool
    disconnect = module("palmyra_serve.sidecar.core.disconnect", "palmyra_serve.sidecar.edge.protocol")
    return relay, pool, disconnect.DisconnectHook()


def request(route: str, hook: Any) -> tuple[dict, Callable[[], Awaitable[dict]]]:
    """A scope as uvicorn's front end makes it (the connection's hook in it) and its receive()."""
    disconnect = module("palmyra_serve.sidecar.core.disconnect", "palmyra_serve.sidecar.edge.protocol")
    bench = ROUTES[route]
    body = bench.body.encode()
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict:
        return message

    scope = {
        "type": "http",
        "method": "POST",
        "path": bench.path,
        "raw_path": bench.path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8080"), *bench.headers(), (b"content-length", b"%d" % len(body))],
        disconnect.DISCONNECT_HOOK: hook,
    }
    return scope, receive


async def run(relay: Any, hook: Any, route: str, n: int, sent: dict[str, int]) -> None:
    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            key = "ok" if message["status"] == 200 else f"status {message['status']}"
            sent[key] = sent.get(key, 0) + 1
        else:
            sent["bytes"] = sent.get("bytes", 0) + len(message.get("body", b""))

    for _ in range(n):
        scope, receive = request(route, hook)
        await relay(scope, receive, send)


def measure(relay: Any, pool: MemoryPool, hook: Any, route: str, args: argparse.Namespace) -> dict:
    import uvloop

    pool.writes_per_read = args.writes_per_read
    loop = uvloop.new_event_loop()
    sent: dict[str, int] = {}
    try:
        loop.run_until_complete(run(relay, hook, route, args.warmup, sent))
        times = []
        for _ in range(args.repeat):
            t0 = time.process_time()
            loop.run_until_complete(run(relay, hook, route, args.requests, sent))
            times.append(time.process_time() - t0)
        profile_text = None
        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            loop.run_until_complete(run(relay, hook, route, args.requests, sent))
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile_rows)
            profile_text = out.getvalue()
        (relay.access_log if hasattr(relay, "access_log") else relay.publish.access_log).flush()
    finally:
        loop.close()
    reads = len(pool_reads(route, args.writes_per_read))
    if set(sent) != {"ok", "bytes"}:
        raise SystemExit(f"{route}: not every request was relayed: {sent}")
    return {
        "route": route,
        "reads_per_request": reads,
        "us_per_request": 1e6 * min(times) / args.requests,
        "us_per_request_all": [1e6 * t / args.requests for t in times],
        "bytes_per_request": sent["bytes"] / sent["ok"],
        "profile": profile_text,
    }


def pool_reads(route: str, writes_per_read: int) -> list[int]:
    writes = stream_of(ROUTES[route].path, b"")
    k = writes_per_read or len(writes)
    return list(range(0, len(writes), k))


def inspect_us(relay: Any, hook: Any, route: str, n: int) -> float | None:
    """µs per call of the relay's body inspection, on the route's body, for the key's tenant."""
    body = ROUTES[route].body.encode()
    if hasattr(relay, "_inspect"):  # one method per request: _inspect(body, entry, tenant, record)
        routes = module("palmyra_serve.sidecar.routes")
        records = module("palmyra_serve.sidecar.relay.record")
        bench = ROUTES[route]
        entry = routes.RELAYED[bench.path]
        tenant = relay.keys.tenants.spec(relay.keys.identify(f"Bearer {API_KEY}".encode()))
        record = records.RequestRecord("0" * 32, "POST", bench.path, entry.label)

        def once() -> None:
            relay._inspect(body, entry, tenant, record)

    elif hasattr(relay, "ingress") and hasattr(relay, "inspect"):  # named steps around one context
        scope, receive = request(route, hook)
        ctx = relay.ingress(scope, receive, None)
        relay.identify(ctx)

        def once() -> None:
            ctx.body = body
            relay.inspect(ctx)

    else:
        return None
    for _ in range(n // 10):
        once()
    t0 = time.process_time()
    for _ in range(n):
        once()
    return 1e6 * (time.process_time() - t0) / n


def without_usage_filter(relay: Any, pool: MemoryPool, hook: Any, route: str, args: argparse.Namespace) -> float | None:
    """µs per request of the whole path with the usage-event filter taken out (None: the tree has none)."""
    loop = module("palmyra_serve.sidecar.relay.pump", "palmyra_serve.sidecar.relay.handler")  # the stream's loop
    if not hasattr(loop, "UsageEventFilter"):
        return None
    kept = loop.UsageEventFilter
    loop.UsageEventFilter = lambda: None
    try:
        quiet = argparse.Namespace(**{**vars(args), "profile": None})
        return float(measure(relay, pool, hook, route, quiet)["us_per_request"])
    finally:
        loop.UsageEventFilter = kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--route", default="completions", help="one or more of " + ",".join(ROUTES))
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--writes-per-read", type=int, default=1, help="the fake engine's writes per read; 0: all")
    parser.add_argument("--profile", metavar="FILE", help="cProfile's table of one more pass per route, to FILE")
    parser.add_argument("--profile-rows", type=int, default=40)
    parser.add_argument("--parts", action="store_true", help="also time the inspection and the path without the filter")
    parser.add_argument("--json", metavar="FILE", help="the figures as JSON")
    args = parser.parse_args(argv)
    routes = args.route.split(",")
    if unknown := [r for r in routes if r not in ROUTES]:
        sys.exit(f"--route: unknown {','.join(unknown)}")
    # The access log goes to stdout: kept off the terminal, written as the sidecar writes it.
    real_stdout = sys.stdout
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - closed below
    write: Callable[[str], object] = real_stdout.write
    try:
        relay, pool, hook = relay_under_test()
        import palmyra_serve

        tree = os.path.dirname(os.path.dirname(palmyra_serve.__file__))
        rows: list[dict] = []
        for route in routes:
            row = measure(relay, pool, hook, route, args)
            rows.append(row)
            write(
                f"{route:12} {row['reads_per_request']:3d} reads/request {row['bytes_per_request']:6.0f} bytes out "
                f"{row['us_per_request']:7.1f} us/request "
                f"(runs: {', '.join(f'{x:.1f}' for x in row['us_per_request_all'])})\n"
            )
            if args.parts:
                row["inspect_us"] = inspect_us(relay, hook, route, args.requests)
                row["without_usage_filter_us"] = without_usage_filter(relay, pool, hook, route, args)
                write(
                    f"{route:12} inspection alone {row['inspect_us'] or 0:.2f} us/request; "
                    f"without the usage-event filter {row['without_usage_filter_us'] or 0:.1f} us/request\n"
                )
            if row["profile"] and args.profile:
                with open(args.profile, "a") as f:
                    f.write(f"=== {tree} {route} writes/read {args.writes_per_read}\n{row['profile']}\n")
    finally:
        sys.stdout.close()
        sys.stdout = real_stdout
    if args.json:
        for row in rows:
            row.pop("profile", None)
        with open(args.json, "w") as f:
            json.dump({"tree": tree, "writes_per_read": args.writes_per_read, "routes": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
