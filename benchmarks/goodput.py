"""Goodput benchmark: how much traffic is served within the SLO when demand exceeds capacity.

Open-loop Poisson arrivals at multiples of a measured capacity (default 0.5x, 1x, 2x, 4x), the
bare engine and the sidecar side by side in one run (alternating per rate, the order rotated), on
the tiny stand-in served by the real vLLM CPU engine. Every request: a distinct 48-word prompt,
64 streamed tokens with `ignore_eos`. A request is *good* when it completes (HTTP 200, every token,
`[DONE]`) with TTFT <= 2 s and a mean inter-token gap <= 0.25 s (the project's default SLOs, as in
the admission targets). Goodput is good requests per second of arrivals.

Capacity: a closed loop of `--capacity-concurrency` streams against the bare engine for
`--capacity-s` seconds; its throughput (streams / mean request time) is 1x. `--capacity` skips the measurement.

Arrivals stop after `--seconds`; requests still open `--drain-s` later are cancelled (the client
goes away, the engine aborts them) and count as unfinished, never good. Their wait so far enters the
TTFT percentiles as a lower bound (the table marks those percentiles with >=).

    python -m benchmarks.goodput                             # writes benchmarks/results/goodput.{md,json,png}
    python -m benchmarks.goodput --seconds 5 --rates 1,2     # a short smoke run
    python -m benchmarks.goodput --name goodput-baseline     # another file name
    python -m benchmarks.goodput --nginx                     # a third target: nginx in front of the engine,
                                                             # what a bare relay hop costs on this machine

Run it under the shared lock: `flock /tmp/palmyra-engine.lock python -m benchmarks.goodput`,
from the repository root (the test helpers it runs the processes with import as `tests.helpers`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks import results_files
from palmyra_serve.tools.stats import percentile

if TYPE_CHECKING:  # imported where it runs: the arithmetic (and its unit tests) needs no sidecar
    from palmyra_serve.sidecar.upstream.pool import EnginePool

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

SCHEMA = "palmyra-goodput/1"
MODEL = "palmyra-mini"
TTFT_SLO_S = 2.0
ITL_SLO_S = 0.25
PROMPT_WORDS = 48
MAX_TOKENS = 64
TOKEN_EVENT = b'"text":'  # in every completion chunk; escaped text can never contain it
USAGE_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')
# A small fixed vocabulary: prompts are distinct (no prefix-cache hits) yet tokenise to a similar length.
WORDS = [
    "river",
    "mountain",
    "signal",
    "garden",
    "copper",
    "window",
    "lantern",
    "harbor",
    "meadow",
    "thunder",
    "violet",
    "engine",
    "orbit",
    "canvas",
    "marble",
    "pepper",
    "falcon",
    "quartz",
    "ember",
    "willow",
    "saddle",
    "comet",
    "velvet",
    "anchor",
    "prism",
    "tundra",
    "cobalt",
    "mosaic",
    "glacier",
    "beacon",
    "hollow",
    "raven",
    "cedar",
    "dune",
    "lagoon",
    "nectar",
    "opal",
    "pixel",
    "quiver",
    "ripple",
    "summit",
    "timber",
    "umbra",
    "vortex",
    "wander",
    "yonder",
    "zephyr",
    "amber",
    "bristle",
    "cinder",
]


# --- pure arithmetic (unit-tested in tests/unit/test_goodput_bench.py) ---------------------------


@dataclass
class RequestResult:
    status: int | None = None  # HTTP status; None when no response head arrived
    ttft_s: float | None = None  # send -> first token-bearing chunk
    itl_s: float | None = None  # mean gap between token chunks: (last - first) / (tokens - 1)
    tokens: int = 0
    done: bool = False  # the stream ended with [DONE] and no error event
    waited_s: float = 0.0  # send -> end (or cancellation)
    unfinished: bool = False  # still open at the drain deadline and cancelled
    error: str | None = None
    retry_after: str | None = None


def poisson_arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Arrival offsets (s) of a Poisson process of `rate` per second over [0, seconds)."""
    if rate <= 0 or seconds <= 0:
        return []
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < seconds:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def is_good(
    r: RequestResult, ttft_slo_s: float = TTFT_SLO_S, itl_slo_s: float = ITL_SLO_S, tokens: int = MAX_TOKENS
) -> bool:
    """Completed in full within both SLOs."""
    return (
        r.status == 200
        and r.done
        and not r.unfinished
        and r.tokens >= tokens
        and r.ttft_s is not None
        and r.ttft_s <= ttft_slo_s
        and r.itl_s is not None
        and r.itl_s <= itl_slo_s
    )


def summarize_rate(
    results: list[RequestResult],
    seconds: float,
    ttft_slo_s: float = TTFT_SLO_S,
    itl_slo_s: float = ITL_SLO_S,
    tokens: int = MAX_TOKENS,
) -> dict:
    """One row of the table: goodput per second of arrivals, latency percentiles, refusals."""
    good = sum(is_good(r, ttft_slo_s, itl_slo_s, tokens) for r in results)
    completed = [r for r in results if r.status == 200 and r.done and not r.unfinished]
    # TTFT of everything that was answered 200 or left waiting: a request cancelled before its first
    # token contributes its wait so far, a lower bound (censored).
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    censored = [r.waited_s for r in results if r.ttft_s is None and r.unfinished]
    ttft_all = ttfts + censored
    itls = [r.itl_s for r in completed if r.itl_s is not None]
    refused = [r for r in results if r.status == 429]
    errors = [r for r in results if r.status not in (200, 429) and not r.unfinished]
    errors += [r for r in results if r.status == 200 and not r.done and not r.unfinished]
    refusal_s = [r.waited_s for r in refused]

    def pct(xs: list[float], q: float) -> float | None:
        return percentile(xs, q) if xs else None

    return {
        "sent": len(results),
        "offered_per_s": len(results) / seconds if seconds else 0.0,
        "good": good,
        "goodput_per_s": good / seconds if seconds else 0.0,
        "completed": len(completed),
        "refused": len(refused),
        "errors": len(errors),
        "unfinished": sum(r.unfinished for r in results),
        "ttft_p50_s": pct(ttft_all, 50),
        "ttft_p99_s": pct(ttft_all, 99),
        # A censored wait can only grow, and any sample growing can only raise a percentile.
        "ttft_p50_lower_bound": bool(censored),
        "ttft_p99_lower_bound": bool(censored),
        "itl_p50_s": pct(itls, 50),
        "itl_p99_s": pct(itls, 99),
        "refusal_p99_s": pct(refusal_s, 99),
        # Why completed requests were not good (a request can miss both).
        "completed_short": sum(r.tokens < tokens for r in completed),
        "completed_over_ttft": sum(r.ttft_s is not None and r.ttft_s > ttft_slo_s for r in completed),
        "completed_over_itl": sum(r.itl_s is None or r.itl_s > itl_slo_s for r in completed),
        "retry_after": sorted({r.retry_after for r in refused if r.retry_after}),
        "first_error": next((r.error for r in errors if r.error), None),
    }


def _fmt(row: dict, key: str) -> str:
    v = row.get(key)
    if v is None:
        return "—"
    mark = "≥" if row.get(f"{key.removesuffix('_s')}_lower_bound") else ""
    return f"{mark}{v:.2f}"


def markdown(doc: dict) -> str:
    meta = doc["meta"]
    cap = meta["capacity_per_s"]
    lines = [
        f"# Goodput benchmark{' — ' + meta['label'] if meta.get('label') else ''}",
        "",
        (
            f"{meta['started_at']}, {meta['cpus']} cores, {meta['cpu_model']}; tiny stand-in on the vLLM CPU "
            f"engine; sidecar settings: {meta['sidecar_env'] or 'defaults'}."
        ),
        (
            f"Open-loop Poisson arrivals, {meta['seconds']:.0f} s per rate, {meta['prompt_words']}-word prompts, "
            f"{meta['max_tokens']} streamed tokens (ignore_eos); good = complete with TTFT ≤ {meta['ttft_slo_s']} s "
            f"and mean inter-token gap ≤ {meta['itl_slo_s']} s. Capacity (1×) = {cap:.1f} req/s "
            f"({meta['capacity_source']}). Unfinished = still open {meta['drain_s']:.0f} s after arrivals "
            "stopped, cancelled."
        ),
        "",
        (
            "| offered | target | goodput /s | % of peak | TTFT p50 / p99 s | ITL p50 / p99 s | refused (429) "
            "| errors | unfinished | sent |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    peak = max((row["goodput_per_s"] for point in doc["rates"] for row in point["targets"].values()), default=0.0)
    for point in doc["rates"]:
        for name, row in point["targets"].items():
            share = f"{100 * row['goodput_per_s'] / peak:.0f}%" if peak else "—"
            lines.append(
                f"| {point['offered_per_s']:.1f}/s ({point['multiple']:g}×) | {name} | {row['goodput_per_s']:.1f} "
                f"| {share} | {_fmt(row, 'ttft_p50_s')} / {_fmt(row, 'ttft_p99_s')} "
                f"| {_fmt(row, 'itl_p50_s')} / {_fmt(row, 'itl_p99_s')} | {row['refused']} | {row['errors']} "
                f"| {row['unfinished']} | {row['sent']} |"
            )
    lines += [
        "",
        (
            f"Peak goodput in this run: {peak:.1f}/s. Targets: at 2× and 4× the sidecar keeps "
            "≥ 90% of the peak; at ≤ 1× it keeps ≥ 98% of bare vLLM's goodput with a TTFT p99 no worse."
        ),
        "",
    ]
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> Path:
    from palmyra_serve.tools.plots import _pyplot

    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(doc["rates"][0]["targets"]) if doc["rates"] else []
    xs = [p["offered_per_s"] for p in doc["rates"]]
    for name in names:
        rows = [p["targets"][name] for p in doc["rates"]]
        ax1.plot(xs, [r["goodput_per_s"] for r in rows], marker="o", label=f"{name} goodput")
        ax2.plot(xs, [r["ttft_p99_s"] or math.nan for r in rows], marker="o", label=f"{name} TTFT p99")
    if xs:
        ax1.plot([0, max(xs)], [0, max(xs)], linestyle=":", color="grey", label="goodput = offered")
    ax1.set_xlabel("offered load (req/s)")
    ax1.set_ylabel("good requests / s")
    ax1.set_title("Goodput at the SLO")
    ax2.axhline(doc["meta"]["ttft_slo_s"], linestyle="--", color="tab:red", label="TTFT SLO")
    ax2.set_xlabel("offered load (req/s)")
    ax2.set_ylabel("TTFT p99 (s)")
    ax2.set_yscale("log")
    ax2.set_title("TTFT p99 (lower bound when requests were cancelled)")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def cache_config(metrics_text: str) -> dict[str, str]:
    """The labels of vLLM's `vllm:cache_config_info` series (empty when the engine has none)."""
    m = re.search(r"^vllm:cache_config_info\{(.*)\}\s", metrics_text, re.MULTILINE)
    return dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) if m else {}


# --- the load ---------------------------------------------------------------------------------


def prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(PROMPT_WORDS))


def body(text: str, max_tokens: int) -> bytes:
    # include_usage: under load vLLM sends several tokens in one chunk, so tokens are counted from
    # its usage report, not from chunks.
    return json.dumps(
        {
            "model": MODEL,
            "prompt": text,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        }
    ).encode()


async def one_request(pool: EnginePool, headers: list[tuple[bytes, bytes]], payload: bytes, r: RequestResult) -> None:
    """Send one streamed completion and fill `r` as it goes (so a cancelled one keeps what it got).
    The client is the sidecar's own lean pool (C-parsed), the same for both targets."""
    from palmyra_serve.sidecar.upstream.failures import UpstreamError

    t0 = time.perf_counter()
    first = last = 0.0
    chunks, usage = 0, None
    resp = None
    try:
        resp = await pool.request("POST", b"/v1/completions", headers, payload)
        r.status = resp.status
        if resp.status != 200:
            r.retry_after = next((v.decode() for k, v in resp.raw_headers if k.lower() == b"retry-after"), None)
            text = (await resp.read())[:300]
            if resp.status != 429:
                r.error = f"HTTP {resp.status}: {text.decode('utf-8', 'replace')}"
            return
        tail = b""
        while data := await resp.read_some():
            now = time.perf_counter()
            n = data.count(TOKEN_EVENT)
            if n:
                if not first:
                    first = now
                    r.ttft_s = now - t0
                last = now
                chunks += n
            if m := USAGE_TOKENS.search(data):
                usage = int(m.group(1))
            tail = (tail + data)[-64:]
            if b'"error"' in data:
                r.error = data[:300].decode("utf-8", "replace")
        r.done = b"[DONE]" in tail and r.error is None
        r.tokens = usage if usage is not None else chunks
        if r.tokens > 1:
            r.itl_s = (last - first) / (r.tokens - 1)
    except UpstreamError as exc:
        r.error = f"{type(exc).__name__}: {exc}"
    finally:
        r.waited_s = time.perf_counter() - t0
        if resp is not None:
            resp.release()


async def open_loop(
    base: str,
    headers: list[tuple[bytes, bytes]],
    rate: float,
    seconds: float,
    drain_s: float,
    arrival_seed: int,
    prompt_seed: int,
    max_tokens: int,
) -> list[RequestResult]:
    from palmyra_serve.sidecar.upstream.pool import EnginePool

    pool = EnginePool(base, 10, 600)
    rng = random.Random(prompt_seed)
    arrivals = poisson_arrivals(rate, seconds, arrival_seed)
    results = [RequestResult() for _ in arrivals]
    tasks: list[asyncio.Task] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    for at, r in zip(arrivals, results, strict=True):
        delay = start + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one_request(pool, headers, body(prompt(rng), max_tokens), r)))
    end_of_arrivals = start + seconds
    if tasks:
        await asyncio.wait(tasks, timeout=max(0.0, end_of_arrivals + drain_s - loop.time()))
    for task, r in zip(tasks, results, strict=True):
        if not task.done():
            r.unfinished = True
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    pool.close()
    return results


async def closed_loop_rate(
    base: str, headers: list[tuple[bytes, bytes]], concurrency: int, seconds: float, max_tokens: int
) -> float:
    """Requests per second of `concurrency` back-to-back streams, by Little's law: concurrency over
    the mean request time (after one warm round). Counting completions in a window instead would
    be quantised: streams started together finish in lockstep rounds."""
    from palmyra_serve.sidecar.upstream.pool import EnginePool

    pool = EnginePool(base, 10, 600)
    rng = random.Random(1)
    times: list[float] = []
    loop = asyncio.get_running_loop()
    stop_at = 0.0

    async def worker(measure: bool) -> None:
        while True:
            r = RequestResult()
            await one_request(pool, headers, body(prompt(rng), max_tokens), r)
            if not measure:
                return
            if r.status == 200 and r.done:
                times.append(r.waited_s)
            if loop.time() >= stop_at:
                return

    await asyncio.gather(*(worker(False) for _ in range(concurrency)))
    stop_at = loop.time() + seconds
    await asyncio.gather(*(worker(True) for _ in range(concurrency)))
    pool.close()
    return concurrency / (sum(times) / len(times))


class LimitWatch:
    """Samples the sidecar's admission gauges every 0.5 s while a rate runs (a thread: the load's
    event loop stays the load's): the limit it settled on, and how it got there."""

    GAUGES = (
        "palmyra_concurrency_limit",
        "palmyra_concurrency_ceiling",
        "palmyra_in_flight_requests",
        "palmyra_queued_requests",
    )

    def __init__(self, url: str) -> None:
        import threading

        self.url = url
        self.trace: list[list[float | None]] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from tests.helpers import procs

        while not self._stop.wait(0.5):
            try:
                _, text = procs.http_get(f"{self.url}/metrics")
            except OSError:
                continue
            values = {}
            for name in self.GAUGES:
                m = re.search(rf"^{name} (\S+)", text.decode(), re.MULTILINE)
                values[name.removeprefix("palmyra_")] = float(m.group(1)) if m else None
            self.trace.append(
                [
                    round(time.monotonic() - self.t0, 1),
                    values["concurrency_limit"],
                    values["in_flight_requests"],
                    values["queued_requests"],
                ]
            )
            self.ceiling = values["concurrency_ceiling"]

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=5)
        limits = [t[1] for t in self.trace if t[1] is not None]
        return {
            "ceiling": getattr(self, "ceiling", None),
            "limit_min": min(limits, default=None),
            "limit_max": max(limits, default=None),
            "limit_last": limits[-1] if limits else None,
            "trace": self.trace,
        }  # [s, limit, in flight, queued]


def in_turn(names: list[str], i: int) -> list[str]:
    """The targets for the i-th rate, rotated so that each leads in turn (none always goes first,
    on an engine still settling from the rate before)."""
    k = i % len(names)
    return names[k:] + names[:k]


def engine_idle(engine_url: str, timeout_s: float) -> None:
    """Wait until the engine runs and queues nothing, so one rate's backlog does not bill the next."""
    from tests.helpers import procs

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, text = procs.http_get(f"{engine_url}/metrics")
        busy = sum(
            float(v)
            for v in re.findall(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\}\s+(\S+)", text.decode(), re.MULTILINE)
        )
        if busy == 0:
            return
        time.sleep(0.5)


@contextlib.contextmanager
def _nginx_relay(wanted: bool, engine_port: int, log_dir: Path) -> Iterator[str | None]:
    """nginx (Debian's nginx-light, relay.py's configuration: unbuffered, keep-alive upstream) in
    front of the engine, as a third target: what any relay hop costs on this machine, with none of
    the sidecar's work. Yields its base URL, or None when not wanted."""
    if not wanted:
        yield None
        return
    from benchmarks.relay import start_nginx
    from tests.helpers import procs

    port = procs.free_port()
    proc = start_nginx(log_dir / "nginx", engine_port, port)
    try:
        procs.wait_for(f"http://127.0.0.1:{port}/health", proc, log_dir / "nginx.log", 20)
        yield f"http://127.0.0.1:{port}"
    finally:
        procs.stop(proc, timeout_s=5)


def run(args: argparse.Namespace) -> dict:
    from tests.helpers import procs
    from tests.helpers.models import stand_in_model

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # thousands of open streams at 4x
    # The sidecar as a CPU deployment runs it: `up` and the Kubernetes CPU overlay tell it the
    # platform, which sets its admission ceiling (vLLM's CPU max-num-seqs, 128; docs/admission.md).
    sidecar_env = {"PALMYRA_PLATFORM": "cpu", **dict(kv.split("=", 1) for kv in args.sidecar_env)}
    model = stand_in_model("tiny")
    started = datetime.now(UTC).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = args.log_dir or Path(tmp)  # --log-dir keeps the engine's and sidecar's logs
        log_dir.mkdir(parents=True, exist_ok=True)
        with (
            procs.engine(model, log_dir) as engine,
            procs.sidecar(engine.url, log_dir, engine_api_key=engine.api_key, extra_env=sidecar_env) as sidecar,
            _nginx_relay(args.nginx, engine.port, log_dir) as nginx_relay,
        ):
            engine_auth = [
                (b"authorization", f"Bearer {engine.api_key}".encode()),
                (b"content-type", b"application/json"),
            ]
            targets = {"bare vLLM": (engine.url, engine_auth)}
            if nginx_relay is not None:
                targets["nginx relay"] = (nginx_relay, engine_auth)
            targets["sidecar"] = (sidecar.url, [(b"content-type", b"application/json")])
            _, metrics = procs.http_get(f"{engine.url}/metrics")
            cache = cache_config(metrics.decode())
            if args.capacity:
                capacity, source = args.capacity, "given"
            else:
                capacity = asyncio.run(
                    closed_loop_rate(
                        engine.url, engine_auth, args.capacity_concurrency, args.capacity_s, args.max_tokens
                    )
                )
                source = f"closed loop, {args.capacity_concurrency} streams, {args.capacity_s:.0f} s, bare engine"
            print(f"capacity {capacity:.2f} req/s ({source})", flush=True)
            points = []
            for i, multiple in enumerate(args.rates):
                rate = capacity * multiple
                order = in_turn(list(targets), i)
                point = {"multiple": multiple, "offered_per_s": rate, "targets": {}}
                for name in order:
                    engine_idle(engine.url, 120)
                    base, headers = targets[name]
                    watch = LimitWatch(sidecar.url) if name == "sidecar" else None
                    # The same arrival times for both targets; distinct prompts (no prefix-cache hits).
                    results = asyncio.run(
                        open_loop(
                            base,
                            headers,
                            rate,
                            args.seconds,
                            args.drain_s,
                            1000 * args.seed + i,
                            1000 * args.seed + 10 * i + list(targets).index(name),
                            args.max_tokens,
                        )
                    )
                    row = summarize_rate(results, args.seconds, args.ttft_slo, args.itl_slo, args.max_tokens)
                    if watch is not None:
                        row["admission"] = watch.stop()
                    point["targets"][name] = row
                    if args.raw:
                        row["requests"] = [
                            [r.status, r.ttft_s, r.itl_s, r.tokens, r.done, r.unfinished, r.waited_s] for r in results
                        ]
                    print(
                        f"{multiple:g}x {rate:6.1f}/s {name:10} goodput {row['goodput_per_s']:5.1f}/s  "
                        f"ttft p50 {row['ttft_p50_s'] or 0:.2f} p99 {row['ttft_p99_s'] or 0:.2f}  "
                        f"refused {row['refused']} errors {row['errors']} unfinished {row['unfinished']} "
                        f"of {row['sent']}"
                        + (
                            f"  limit {row['admission']['limit_min']:g}-{row['admission']['limit_max']:g}"
                            if row.get("admission") and row["admission"]["limit_min"] is not None
                            else ""
                        ),
                        flush=True,
                    )
                point["targets"] = {name: point["targets"][name] for name in targets}
                points.append(point)
    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    return {
        "schema": SCHEMA,
        "meta": {
            "label": args.label,
            "started_at": started,
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model,
            "capacity_per_s": capacity,
            "capacity_source": source,
            "seconds": args.seconds,
            "drain_s": args.drain_s,
            "prompt_words": PROMPT_WORDS,
            "max_tokens": args.max_tokens,
            "ttft_slo_s": args.ttft_slo,
            "itl_slo_s": args.itl_slo,
            "seed": args.seed,
            "sidecar_env": sidecar_env,
            "engine_cache_config": cache,
        },
        "rates": points,
    }


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=_floats, default=_floats("0.5,1,2,4"), help="multiples of capacity")
    parser.add_argument("--seconds", type=float, default=20.0, help="arrivals per rate and target (s)")
    parser.add_argument("--drain-s", type=float, default=15.0, help="wait after arrivals stop before cancelling")
    parser.add_argument("--capacity", type=float, default=None, help="1x in req/s (default: measure it)")
    parser.add_argument("--capacity-concurrency", type=int, default=32)
    parser.add_argument("--capacity-s", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--ttft-slo", type=float, default=TTFT_SLO_S)
    parser.add_argument("--itl-slo", type=float, default=ITL_SLO_S)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sidecar-env",
        action="append",
        default=[],
        metavar="PALMYRA_X=V",
        help="extra sidecar setting (repeatable); default: the sidecar's defaults",
    )
    parser.add_argument(
        "--raw",
        action="store_true",
        help="keep every request's [status, ttft, itl, tokens, done, unfinished, waited] in the JSON",
    )
    parser.add_argument(
        "--nginx", action="store_true", help="a third target: nginx relaying to the engine (needs nginx on PATH)"
    )
    parser.add_argument("--label", default="", help="a title suffix, e.g. 'baseline'")
    parser.add_argument("--name", default="goodput", help="file name stem under --out")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the engine's and sidecar's logs here")
    args = parser.parse_args(argv)
    doc = run(args)
    results_files.write(args.out, args.name, doc, markdown(doc))
    plot(doc, args.out / f"{args.name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
