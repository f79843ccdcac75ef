"""Relay benchmark: what the sidecar costs, measured side by side in one run.

Workload A: a fast fake engine that streams 64 SSE chunks per request at once, called directly,
through nginx (the reference for what a proxy can do) and through the sidecar (auth, admission and
metrics all on), at 1, 32 and 256 concurrent streams (`--concurrency`; the sidecar's fixed admission
limit and connection cap grow with the largest). wrk (native, so the client is not the bottleneck)
gives requests/s; a lean asyncio client (the sidecar's own C-parsed pool) gives TTFT percentiles
from alternating rounds; /proc gives each proxy's own CPU time per 1000 relayed requests. Where wrk
cannot run, `--load lean` counts requests/s with that lean client instead (closed loop, spread
over a few processes), and `--targets direct,sidecar` leaves nginx out. `--route` picks the API the
streams speak (the fake engine answers each in its own shape, 64 token deltas per request):
`completions` (the default, `/v1/completions`), `chat` (`/v1/chat/completions`), `responses`
(`/v1/responses`, OpenAI's typed events) or `messages` (`/v1/messages`, Anthropic's, the key in
`x-api-key` as its SDK sends it); several, comma-separated, are measured side by side in one run,
interleaved per concurrency.

Workload B: the real vLLM CPU engine on the tiny stand-in, direct vs through nginx vs through the
sidecar, tokens/s at 1 and 16 streams (alternating rounds, the same lean client), plus the first
request after /ready against the steady-state p50 (warmup must have removed the cold start).

    python -m benchmarks.relay                 # both workloads, writes benchmarks/results/relay.{md,json}
    python -m benchmarks.relay --workload A    # only the fake-engine relay
    python -m benchmarks.relay --workload A --concurrency 1,32,256,1024 --load lean --targets direct,sidecar
    python -m benchmarks.relay --workload A --concurrency 32 --route completions,chat,responses,messages
Needs nginx (Debian nginx-light) and wrk (Debian wrk) on PATH, unless --load lean and no nginx target.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.helpers import procs  # the test helpers start and stop the real processes

HERE = Path(__file__).resolve().parent

API_KEY = "bench-key"
BODY = json.dumps({"model": "palmyra-mini", "prompt": "hi", "max_tokens": 64, "stream": True})
CLK_TCK = os.sysconf("SC_CLK_TCK")

NGINX_CONF = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fcgi; uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  upstream engine {{ server 127.0.0.1:{engine_port}; keepalive 512; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""

WRK_LUA = """
wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["{header}"] = "{value}"
"""


@dataclass(frozen=True)
class BenchRoute:
    """One API the streams of workload A speak: its path, its streamed request (64 tokens) and the
    header its clients send the key in."""

    path: str
    body: str
    key_header: str = "Authorization"

    @property
    def key_value(self) -> str:
        return API_KEY if self.key_header == "x-api-key" else f"Bearer {API_KEY}"

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(self.key_header.lower().encode(), self.key_value.encode()), (b"content-type", b"application/json")]

    def lua(self) -> str:
        return WRK_LUA.format(body=self.body, header=self.key_header, value=self.key_value)


HI = [{"role": "user", "content": "hi"}]
ROUTES = {
    "completions": BenchRoute("/v1/completions", BODY),
    "chat": BenchRoute(
        "/v1/chat/completions", json.dumps({"model": "palmyra-mini", "messages": HI, "max_tokens": 64, "stream": True})
    ),
    "responses": BenchRoute(
        "/v1/responses", json.dumps({"model": "palmyra-mini", "input": "hi", "max_output_tokens": 64, "stream": True})
    ),
    "messages": BenchRoute(
        "/v1/messages",
        json.dumps({"model": "palmyra-mini", "max_tokens": 64, "messages": HI, "stream": True}),
        "x-api-key",
    ),
}


def workload_a_env(in_flight: int = 256) -> dict[str, str]:
    """The sidecar's settings in workload A: a key, fixed admission at `in_flight` with its queue
    and the connection cap they need plus 64 spare (nothing refused), the access log on, no canary."""
    return {
        "PALMYRA_API_KEYS": API_KEY,
        "PALMYRA_ADMISSION_MODE": "fixed",
        "PALMYRA_MAX_IN_FLIGHT": str(in_flight),
        "PALMYRA_MAX_QUEUE": "256",
        "PALMYRA_MAX_CONNECTIONS": str(in_flight + 256 + 64),
        "PALMYRA_LOG_LEVEL": "info",
        "PALMYRA_CANARY_INTERVAL_S": "3600",
    }


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / CLK_TCK


def start_nginx(nginx_dir: Path, engine_port: int, port: int) -> subprocess.Popen:
    nginx_dir.mkdir()
    (nginx_dir / "nginx.conf").write_text(NGINX_CONF.format(dir=nginx_dir, engine_port=engine_port, port=port))
    return procs.spawn(
        ["nginx", "-c", str(nginx_dir / "nginx.conf"), "-g", "daemon off;"], nginx_dir.parent / "nginx.log", {}
    )


def _wrk_field(pattern: str, text: str) -> str:
    m = re.search(pattern, text)
    if m is None:
        raise RuntimeError(f"no {pattern!r} in wrk's output:\n{text}")
    return m.group(1)


def run_wrk(url: str, conns: int, seconds: int, lua: Path) -> dict:
    out = subprocess.run(
        [
            "wrk",
            "-t",
            "1" if conns < 2 else "2",
            "-c",
            str(conns),
            "-d",
            f"{seconds}s",
            "--latency",
            "-s",
            str(lua),
            url,
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    text = out.stdout
    rps = float(_wrk_field(r"Requests/sec:\s+([\d.]+)", text))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    socket_errors = re.search(r"Socket errors: (.*)", text)
    return {
        "rps": rps,
        "non_2xx": int(errors.group(1)) if errors else 0,
        "socket_errors": socket_errors.group(1) if socket_errors else None,
        "requests": int(_wrk_field(r"(\d+) requests in", text)),
    }


async def lean_closed_loop(base: str, conns: int, seconds: float, route: str = "completions") -> dict:
    """wrk's measurement with the lean client: `conns` connections, each sending its next request as
    soon as the previous one ended, for `seconds` after one warm request each. Counts what wrk counts."""
    from palmyra_serve.sidecar.upstream.failures import UpstreamError
    from palmyra_serve.sidecar.upstream.pool import EnginePool

    pool = EnginePool(base, 5, 60)
    bench = ROUTES[route]
    headers = bench.headers()
    body = bench.body.encode()
    path = bench.path.encode()
    counts: dict[str, float] = {"requests": 0, "non_2xx": 0, "errors": 0}
    loop = asyncio.get_running_loop()
    stop_at = 0.0

    async def one() -> None:
        try:
            resp = await pool.request("POST", path, headers, body)
            while await resp.read_some():
                pass
            resp.release()
        except UpstreamError:
            counts["errors"] += 1
            return
        counts["requests"] += 1
        counts["non_2xx"] += not 200 <= resp.status < 400

    async def worker() -> None:
        while loop.time() < stop_at:
            await one()

    await asyncio.gather(*(one() for _ in range(conns)))  # every connection opened and warm
    counts["requests"] = counts["non_2xx"] = counts["errors"] = 0
    t0 = loop.time()
    stop_at = t0 + seconds
    await asyncio.gather(*(worker() for _ in range(conns)))
    counts["wall_s"] = loop.time() - t0
    pool.close()
    return counts


def _lean_process(args: tuple[str, int, float, str]) -> dict:
    return asyncio.run(lean_closed_loop(*args))


def run_lean(url: str, conns: int, seconds: int, route: str = "completions") -> dict:
    """requests/s of a closed loop of the lean client, in up to a quarter of the cores' processes
    (at most `conns`), so one Python client process is not what limits the count."""
    base = url.removesuffix(ROUTES[route].path)
    procs_n = max(1, min(conns, (os.cpu_count() or 1) // 4))
    shares = [conns // procs_n + (i < conns % procs_n) for i in range(procs_n)]
    if procs_n == 1:
        parts = [_lean_process((base, conns, seconds, route))]
    else:
        with multiprocessing.get_context("fork").Pool(procs_n) as pool:
            parts = pool.map(_lean_process, [(base, share, seconds, route) for share in shares])
    requests = sum(p["requests"] for p in parts)
    return {
        "rps": requests / max(p["wall_s"] for p in parts),
        "requests": requests,
        "non_2xx": sum(p["non_2xx"] for p in parts),
        "socket_errors": f"errors {sum(p['errors'] for p in parts)}",
        "client_processes": procs_n,
    }


async def ttft_probe(base: str, conns: int, total: int, ttfts: list[float], route: str = "completions") -> float:
    """Times to the first body bytes (appended to ttfts) at a fixed concurrency; returns SSE events
    per request. The client is the sidecar's own lean pool (C-parsed, keep-alive), so what it adds
    to every target is small and the same."""
    from palmyra_serve.sidecar.upstream.pool import EnginePool

    pool = EnginePool(base, 5, 60)
    bench = ROUTES[route]
    headers = bench.headers()
    body = bench.body.encode()
    path = bench.path.encode()
    events = 0
    remaining = total

    async def one(record: bool) -> None:
        nonlocal events
        t0 = time.perf_counter()
        resp = await pool.request("POST", path, headers, body)
        data = await resp.read_some()
        if record:
            ttfts.append(time.perf_counter() - t0)
        while data:
            events += data.count(b"data: ") if record else 0
            data = await resp.read_some()
        resp.release()

    async def worker() -> None:
        nonlocal remaining
        await one(record=False)  # opens the keep-alive connection: steady state is measured, as with wrk
        while remaining > 0:
            remaining -= 1
            await one(record=True)

    await asyncio.gather(*(worker() for _ in range(conns)))
    pool.close()
    return events / total


def ttft_rounds(urls: dict[str, str], conns: int, rounds: int, route: str = "completions") -> dict[str, dict]:
    """TTFT of every target in alternating rounds, so the machine's drift hits all of them alike."""
    samples: dict[str, list[float]] = {name: [] for name in urls}
    chunks: dict[str, float] = {}
    for _ in range(rounds):
        for name, url in urls.items():
            chunks[name] = asyncio.run(ttft_probe(url, conns, max(1000, conns * 8), samples[name], route))
    out = {}
    for name, ttfts in samples.items():
        ttfts.sort()
        out[name] = {
            "ttft_p50_ms": 1000 * ttfts[len(ttfts) // 2],
            "ttft_p99_ms": 1000 * ttfts[int(len(ttfts) * 0.99) - 1],
            "ttft_samples": len(ttfts),
            "chunks_per_request": chunks[name],
        }
    return out


def workload_a(
    seconds: int,
    concurrencies: list[int],
    log_dir: Path,
    ttft_rounds_n: int = 5,
    load: str = "wrk",
    names: tuple[str, ...] = ("direct", "nginx", "sidecar"),
    tenants: bool = False,
    tracing: float | None = None,
    routes: tuple[str, ...] = ("completions",),
) -> dict:
    """The results of each route under results["routes"][route]["targets"][target][concurrency];
    results["targets"] is the first route's (the only one, by default)."""
    engine_port, nginx_port = procs.free_port(), procs.free_port()
    luas = {}
    for route in routes:
        luas[route] = log_dir / f"post-{route}.lua"
        luas[route].write_text(ROUTES[route].lua())
    engine = procs.spawn([sys.executable, str(HERE / "fast_engine.py"), str(engine_port)], log_dir / "fast.log", {})
    nginx = start_nginx(log_dir / "nginx-a", engine_port, nginx_port) if "nginx" in names else None
    by_route: dict[str, dict] = {route: {"path": ROUTES[route].path, "targets": {}} for route in routes}
    results: dict = {"concurrency": concurrencies, "targets": by_route[routes[0]]["targets"], "load": load}
    results["routes"] = by_route
    try:
        procs.wait_for(f"http://127.0.0.1:{engine_port}/health", engine, log_dir / "fast.log", 20)
        if nginx is not None:
            procs.wait_for(f"http://127.0.0.1:{nginx_port}/health", nginx, log_dir / "nginx.log", 20)
        # Fixed admission at 256 (or the largest concurrency, when larger): this workload measures
        # the relay, not the adaptive limit (which would size itself to a fake engine that reports
        # no capacity), so nothing may be refused; the connection cap is what that limit and the
        # queue need plus its 64 spare.
        env = workload_a_env(max(256, *concurrencies))
        if tenants:
            env.update(tenants_env(log_dir))
        sink = span_sink() if tracing is not None else contextlib.nullcontext("")
        with (
            sink as sink_url,
            procs.sidecar(
                f"http://127.0.0.1:{engine_port}",
                log_dir,
                extra_env=env
                if tracing is None
                else {**env, "PALMYRA_OTLP_TRACES_ENDPOINT": sink_url, "PALMYRA_TRACE_SAMPLE_RATIO": str(tracing)},
            ) as sidecar,
        ):
            import psutil

            sidecar_pids = [sidecar.proc.pid] + [c.pid for c in psutil.Process(sidecar.proc.pid).children(True)]
            targets = {"direct": (f"http://127.0.0.1:{engine_port}", [engine.pid])}
            if nginx is not None:
                nginx_pids = [nginx.pid] + [c.pid for c in psutil.Process(nginx.pid).children(recursive=True)]
                targets["nginx"] = (f"http://127.0.0.1:{nginx_port}", nginx_pids)
            targets["sidecar"] = (sidecar.url, sidecar_pids)
            for route in routes:
                for name in targets:
                    by_route[route]["targets"][name] = {}
            for conns in concurrencies:
                # Interleave routes and targets per concurrency so drift on this noisy machine hits all alike.
                for route in routes:
                    path = ROUTES[route].path
                    row_of = by_route[route]["targets"]
                    for name, (base, pids) in targets.items():
                        url = base + path
                        cpu0 = cpu_seconds(pids)
                        wrk = (
                            run_wrk(url, conns, seconds, luas[route])
                            if load == "wrk"
                            else run_lean(url, conns, seconds, route)
                        )
                        cpu = cpu_seconds(pids) - cpu0
                        row_of[name][str(conns)] = {
                            **wrk,
                            "chunks_per_s": wrk["rps"] * 64,
                            "proxy_cpu_s_per_1000": 1000 * cpu / max(1, wrk["requests"]),
                        }
                    probes = ttft_rounds(
                        {name: base for name, (base, _) in targets.items()}, conns, ttft_rounds_n, route
                    )
                    for name in targets:
                        row = row_of[name][str(conns)]
                        row.update(probes[name])
                        label = name if len(routes) == 1 else f"{route}/{name}"
                        print(
                            f"A c={conns:<4} {label:8} {row['rps']:9.0f} req/s  ttft p50 {row['ttft_p50_ms']:7.2f} ms"
                            f"  p99 {row['ttft_p99_ms']:7.2f} ms  cpu/1000 {row['proxy_cpu_s_per_1000']:.3f} s"
                            f"  non2xx {row['non_2xx']}",
                            flush=True,
                        )
    finally:
        if nginx is not None:
            procs.stop(nginx, timeout_s=5)
        procs.stop(engine, timeout_s=5)
    return results


@contextlib.contextmanager
def span_sink() -> Iterator[str]:
    """An OTLP/HTTP endpoint that takes every export and keeps nothing (a thread of this process,
    so its CPU is not the sidecar's): what the sidecar pays for tracing is its own spans and its
    exporter."""

    class Sink(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()


def tenants_env(log_dir: Path) -> dict[str, str]:
    """The key as a tenant's with every per-minute limit, none of them reached: each request takes
    the whole quota path (the key's tenant, the reservation, the x-ratelimit-* headers, the stream's
    usage asked for and removed, the settlement), and nothing is refused."""
    from palmyra_serve.sidecar.tenants.config import key_digest

    path = log_dir / "tenants.yaml"
    path.write_text(
        f"tenants:\n  - name: bench\n    keys: ['{key_digest(API_KEY)}']\n"
        "    requests_per_minute: 1000000000\n    tokens_per_minute: 1000000000000\n"
    )
    return {"PALMYRA_API_KEYS": "", "PALMYRA_TENANTS_FILE": str(path)}


async def stream_tokens(
    base: str, headers: list[tuple[bytes, bytes]], streams: int, max_tokens: int
) -> tuple[int, float, list[float]]:
    """Tokens received, wall time and per-request latencies of `streams` concurrent streamed
    completions. The client is the sidecar's own lean pool, the same for every target, so the
    benchmark's load generator takes as little CPU from the engine as it can."""
    from palmyra_serve.sidecar.upstream.pool import EnginePool

    body = json.dumps(
        {
            "model": "palmyra-mini",
            "prompt": [9707] * 16,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "temperature": 0,
        }
    ).encode()
    headers = [*headers, (b"content-type", b"application/json")]
    pool = EnginePool(base, 10, 600)
    latencies: list[float] = []
    tokens = 0

    async def one() -> None:
        nonlocal tokens
        t0 = time.perf_counter()
        resp = await pool.request("POST", b"/v1/completions", headers, body)
        assert resp.status == 200, await resp.read()
        while data := await resp.read_some():
            tokens += data.count(b'"text"')
        resp.release()
        latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(streams)))
    wall = time.perf_counter() - t0
    pool.close()
    return tokens, wall, latencies


def workload_b(rounds: int, max_tokens: int, log_dir: Path) -> dict:
    from tests.helpers.models import stand_in_model

    model = stand_in_model("tiny")
    results: dict = {"streams": {}, "cold_start": {}}
    with procs.engine(model, log_dir) as engine:
        engine_auth = [(b"authorization", f"Bearer {engine.api_key}".encode())]
        nginx_port = procs.free_port()
        nginx = start_nginx(log_dir / "nginx-b", engine.port, nginx_port)
        try:
            procs.wait_for(f"http://127.0.0.1:{nginx_port}/health", nginx, log_dir / "nginx.log", 20)
            with procs.sidecar(engine.url, log_dir, engine_api_key=engine.api_key) as sidecar:
                # First request after /ready: the one a real client would be unlucky enough to send.
                _, first_wall, _ = asyncio.run(stream_tokens(sidecar.url, [], 1, max_tokens))
                steady = [asyncio.run(stream_tokens(sidecar.url, [], 1, max_tokens))[1] for _ in range(7)]
                results["cold_start"] = {
                    "first_after_ready_s": first_wall,
                    "steady_p50_s": statistics.median(steady),
                    "ratio": first_wall / statistics.median(steady),
                }
                print(
                    f"B first request after /ready {first_wall:.3f} s vs steady p50 {statistics.median(steady):.3f} s",
                    flush=True,
                )
                targets: tuple[tuple[str, str, list[tuple[bytes, bytes]]], ...] = (
                    ("direct", engine.url, engine_auth),
                    ("nginx", f"http://127.0.0.1:{nginx_port}", engine_auth),
                    ("sidecar", sidecar.url, []),
                )
                for streams in (1, 16):
                    totals = {name: [0, 0.0] for name, _, _ in targets}
                    for r in range(rounds):
                        # Alternating rounds, the order rotated each round: drift and position in the
                        # round hit every target alike.
                        for name, base, headers in targets[r % 3 :] + targets[: r % 3]:
                            tokens, wall, _ = asyncio.run(stream_tokens(base, headers, streams, max_tokens))
                            totals[name][0] += tokens
                            totals[name][1] += wall
                    row = {name: t / w for name, (t, w) in totals.items()}
                    row["ratio"] = row["sidecar"] / row["direct"]
                    row["nginx_ratio"] = row["nginx"] / row["direct"]
                    results["streams"][str(streams)] = row
                    print(
                        f"B {streams:>2} streams: direct {row['direct']:.1f} tok/s, nginx {row['nginx']:.1f} "
                        f"({100 * row['nginx_ratio']:.1f}%), sidecar {row['sidecar']:.1f} ({100 * row['ratio']:.1f}%)",
                        flush=True,
                    )
        finally:
            procs.stop(nginx, timeout_s=5)
    return results


def report(a: dict | None, b: dict | None) -> str:
    lines = ["# Relay benchmark", "", f"Machine: {os.cpu_count()} cores, {platform_line()}; one run, side by side.", ""]
    if a:
        routes = a.get("routes") or {"completions": {"path": "/v1/completions", "targets": a["targets"]}}
        lines += [
            "## Workload A: fast fake engine, 64 SSE chunks per request",
            "",
            "Requests/s from "
            + ("wrk." if a.get("load", "wrk") == "wrk" else "the lean asyncio client (closed loop)."),
            "",
        ]
        for route, part in routes.items():
            if len(routes) > 1:
                lines += [f"### {route} (`{part['path']}`)", ""]
            lines += route_report(a["concurrency"], part["targets"])
        if len(routes) > 1:
            lines += per_route_report(a["concurrency"], routes)
    if b:
        lines += [
            "## Workload B: real vLLM CPU engine, tiny stand-in",
            "",
            "| streams | direct tok/s | through nginx tok/s | nginx ratio | through sidecar tok/s | sidecar ratio |",
            "|---|---|---|---|---|---|",
        ]
        for streams, row in b["streams"].items():
            lines.append(
                f"| {streams} | {row['direct']:.1f} | {row['nginx']:.1f} | {100 * row['nginx_ratio']:.1f}% "
                f"| {row['sidecar']:.1f} | {100 * row['ratio']:.1f}% |"
            )
        cold = b["cold_start"]
        lines += [
            "",
            f"First request after /ready: {cold['first_after_ready_s']:.3f} s; steady-state p50 "
            f"{cold['steady_p50_s']:.3f} s; ratio {cold['ratio']:.2f} (target ≤ 1.2).",
            "",
        ]
    return "\n".join(lines)


def route_report(cs: list[int], t: dict) -> list[str]:
    """Workload A's table and targets for one route's streams."""
    names = [name for name in ("direct", "nginx", "sidecar") if name in t]
    lines = [
        "| streams | target | req/s | % of direct | chunks/s | TTFT p50 ms | TTFT p99 ms | proxy CPU s / 1000 req |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cs:
        direct = t["direct"][str(c)]["rps"]
        for name in names:
            r = t[name][str(c)]
            cpu = "—" if name == "direct" else f"{r['proxy_cpu_s_per_1000']:.3f}"
            lines.append(
                f"| {c} | {name} | {r['rps']:.0f} | {100 * r['rps'] / direct:.1f}% | {r['chunks_per_s']:.0f} "
                f"| {r['ttft_p50_ms']:.2f} | {r['ttft_p99_ms']:.2f} | {cpu} |"
            )
    s, n, d = t["sidecar"], t.get("nginx"), t["direct"]
    lines += ["", "Targets:", ""]
    for c in (x for x in cs if x >= 32):
        lines.append(
            f"- req/s at {c} streams: {100 * s[str(c)]['rps'] / d[str(c)]['rps']:.1f}% of direct (target ≥ 90%)"
        )
    if 1 in cs:
        lines.append(
            f"- TTFT p50 added at 1 stream: {s['1']['ttft_p50_ms'] - d['1']['ttft_p50_ms']:.3f} ms (target ≤ 0.3 ms)"
        )
    if 32 in cs and n:
        lines.append(
            f"- TTFT p99 at 32 streams: {s['32']['ttft_p99_ms'] / n['32']['ttft_p99_ms']:.2f}× nginx's (target ≤ 1.5×)"
        )
    for c in cs if n is not None else ():
        cpu_ratio = s[str(c)]["proxy_cpu_s_per_1000"] / t["nginx"][str(c)]["proxy_cpu_s_per_1000"]
        lines.append(f"- CPU per relayed request at {c} streams: {cpu_ratio:.1f}× nginx's (target ≤ 5×)")
    lines.append("")
    return lines


def per_route_report(cs: list[int], routes: dict[str, dict]) -> list[str]:
    """The routes side by side: the sidecar's CPU per relayed request, each against completions' (else
    the first route's)."""
    first = "completions" if "completions" in routes else next(iter(routes))
    lines = [
        "### Per route",
        "",
        f"| streams | route | sidecar req/s | % of direct | sidecar CPU s / 1000 req | vs {first} |",
        "|---|---|---|---|---|---|",
    ]
    for c in cs:
        base = routes[first]["targets"]["sidecar"][str(c)]["proxy_cpu_s_per_1000"]
        for route, part in routes.items():
            s, d = part["targets"]["sidecar"][str(c)], part["targets"]["direct"][str(c)]
            lines.append(
                f"| {c} | {route} | {s['rps']:.0f} | {100 * s['rps'] / d['rps']:.1f}% "
                f"| {s['proxy_cpu_s_per_1000']:.3f} | {s['proxy_cpu_s_per_1000'] / base:.2f}× |"
            )
    lines.append("")
    return lines


def platform_line() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["A", "B", "all"], default="all")
    parser.add_argument("--seconds", type=int, default=5, help="wrk duration per point")
    parser.add_argument("--concurrency", default="1,32,256")
    parser.add_argument(
        "--load",
        choices=["wrk", "lean"],
        default="wrk",
        help="workload A's requests/s: wrk, or the lean asyncio client where wrk cannot run",
    )
    parser.add_argument("--targets", default="direct,nginx,sidecar", help="workload A: which of direct,nginx,sidecar")
    parser.add_argument(
        "--route",
        default="completions",
        help="workload A: the streams' API, one or more (comma-separated, measured side by side) of "
        + ",".join(ROUTES),
    )
    parser.add_argument("--ttft-rounds", type=int, default=5, help="workload A: alternating TTFT rounds per point")
    parser.add_argument("--rounds", type=int, default=6, help="workload B: alternating rounds per point")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--tenants", action="store_true", help="workload A: the key as a tenant's, with requests and tokens limits"
    )
    parser.add_argument(
        "--tracing",
        type=float,
        nargs="?",
        const=1.0,
        metavar="RATIO",
        help="workload A: tracing on, this share of requests sampled (default 1), spans sent to a sink",
    )
    args = parser.parse_args()
    names = tuple(name for name in ("direct", "nginx", "sidecar") if name in args.targets.split(","))
    if not {"direct", "sidecar"} <= set(names):
        sys.exit("--targets needs direct and sidecar")
    routes = tuple(dict.fromkeys(args.route.split(",")))
    if unknown := [r for r in routes if r not in ROUTES]:
        sys.exit(f"--route: unknown {','.join(unknown)} (one or more of {','.join(ROUTES)})")
    needed = set()
    if args.workload != "B":
        needed |= {"wrk"} if args.load == "wrk" else set()
        needed |= {"nginx"} & set(names)
    if args.workload != "A":
        needed.add("nginx")
    for tool in sorted(needed):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: apt-get install wrk nginx-light")
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        a = (
            workload_a(
                args.seconds,
                [int(c) for c in args.concurrency.split(",")],
                log_dir,
                args.ttft_rounds,
                args.load,
                names,
                args.tenants,
                args.tracing,
                routes,
            )
            if args.workload in ("A", "all")
            else None
        )
        b = workload_b(args.rounds, args.max_tokens, log_dir) if args.workload in ("B", "all") else None
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "relay.json").write_text(json.dumps({"A": a, "B": b}, indent=2))
    md = report(a, b)
    (args.out / "relay.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
