"""`palmyra-serve bench`: is the endpoint as fast as it should be?

the reference adaptation's performance tables against any OpenAI-compatible endpoint: 5.1 prefill latency and
5.3 TTFT by input length, 5.2 decode latency per token, 5.4 throughput vs concurrency with speed-up
and efficiency against the ideal. Prompts are seeded random token ids (exact lengths, never a
prefix-cache hit), `ignore_eos` fixes the output length. Writes report.md, results.json and two
PNG plots; `--compare A.json B.json` puts two runs side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from palmyra_serve.tools.endpoint import add_key_arguments

if TYPE_CHECKING:
    from collections.abc import Awaitable

    import httpx

SCHEMA = "palmyra-bench/1"
# The reference adaptation's one scaling figure (its table's numbers did not survive, this did):
# batch sizes 1 and 16 on one 910B in bf16, throughput 14.05x, against an ideal of 16x.
REFERENCE_SCALING = {"from": 1, "to": 16, "speedup": 14.05, "efficiency": 0.878, "on": "Ascend 910B x 1, bf16"}
_T = TypeVar("_T")  # what a guarded request returns


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}") from exc
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers: {text!r}")
    return vals


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8080", help="endpoint root (default %(default)s)")
    parser.add_argument("--model", default="palmyra-mini", help="served model name (default %(default)s)")
    add_key_arguments(parser)
    parser.add_argument(
        "--input-lengths",
        type=_ints,
        default=_ints("128,512,1024,2048,4096,8192"),
        help="prompt lengths in tokens, capped at max_model_len - output tokens (default 128,512,1024,2048,4096,8192)",
    )
    parser.add_argument("--output-tokens", type=int, default=64, help="tokens per request (default %(default)s)")
    parser.add_argument(
        "--concurrency",
        type=_ints,
        default=_ints("1,2,4,8,16"),
        help="concurrent streams for the throughput table (default 1,2,4,8,16)",
    )
    parser.add_argument(
        "--throughput-input-length",
        type=int,
        default=128,
        help="prompt length for the throughput table (default %(default)s)",
    )
    parser.add_argument("--repetitions", type=int, default=3, help="samples per point (default %(default)s)")
    parser.add_argument(
        "--warmup", type=int, default=2, help="requests sent first and not measured (default %(default)s)"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="when /v1/models does not report max_model_len (default: ask, else 8192)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random token-id prompts")
    parser.add_argument("--timeout", type=float, default=900.0, help="per-request timeout in seconds")
    parser.add_argument("--out", default=None, help="directory for report.md, results.json and plots")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("A.json", "B.json"),
        default=None,
        help="print a side-by-side table of two results.json files (B / A ratios) and exit",
    )


def plan(input_lengths: list[int], output_tokens: int, max_model_len: int) -> list[int]:
    """Input lengths to measure: each capped at max_model_len - output_tokens (the longest prompt
    that still leaves room for the output), de-duplicated, ascending."""
    cap = max_model_len - output_tokens
    if cap < 1:
        raise ValueError(f"output tokens {output_tokens} leave no room in max_model_len {max_model_len}")
    return sorted({min(n, cap) for n in input_lengths})


def scaling_against_reference(throughput: list[dict]) -> dict:
    """Throughput at 16 streams over throughput at 1 (p50s) and that over 16: the reference's own
    arithmetic, beside its figure; None where --concurrency left out 1 or 16."""
    p50 = {r["concurrency"]: r["tokens_per_s"]["p50"] for r in throughput if r["tokens_per_s"]["n"]}
    lo, hi = REFERENCE_SCALING["from"], REFERENCE_SCALING["to"]
    measured = lo in p50 and hi in p50 and p50[lo] > 0
    speedup = p50[hi] / p50[lo] if measured else None
    return {
        "from": lo,
        "to": hi,
        "speedup": speedup,
        "efficiency": speedup / hi if speedup is not None else None,
        "reference": REFERENCE_SCALING,
    }


def run(args: argparse.Namespace) -> int:
    if args.compare:
        return run_compare(args)
    if args.output_tokens < 2:
        print("error: --output-tokens must be at least 2 (decode latency needs a second token)", file=sys.stderr)
        return 2
    import asyncio

    doc = asyncio.run(_bench(args))
    return write(doc, args.out)


PLOTS_MISSING = (
    "no plots in {out}: matplotlib is not installed (everything else is written). For the plots, install "
    "the tools' extra (pip install -e '.[tools]', or ./bootstrap.sh install, whose default includes it) "
    "and run bench again"
)


def write(doc: dict, out: str | None) -> int:
    from palmyra_serve.tools import report

    md = report.bench_markdown(doc)
    print(md)
    if out:
        out_dir = Path(out)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "results.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
        (out_dir / "report.md").write_text(md, encoding="utf-8")
        written = ["report.md", "results.json"]
        try:
            from palmyra_serve.tools import plots

            plots.latency_vs_length(doc, out_dir / "latency_vs_length.png")
            plots.throughput_vs_concurrency(doc, out_dir / "throughput_vs_concurrency.png")
            written += ["latency_vs_length.png", "throughput_vs_concurrency.png"]
        except ImportError:  # the plots are the one part that needs matplotlib: the rest is written
            print(PLOTS_MISSING.format(out=out_dir), file=sys.stderr)
        print(f"wrote {out_dir}/{', '.join(written)}", file=sys.stderr)
    return 1 if doc["errors"] else 0


def run_compare(args: argparse.Namespace) -> int:
    from palmyra_serve.tools import report

    a_path, b_path = (Path(p) for p in args.compare)
    docs = []
    for p in (a_path, b_path):
        doc = json.loads(p.read_text(encoding="utf-8"))
        if doc.get("schema") != SCHEMA:
            print(f"error: {p} is not a bench results.json ({SCHEMA})", file=sys.stderr)
            return 2
        docs.append(doc)
    md = report.compare_markdown(docs[0], docs[1], str(a_path), str(b_path))
    print(md)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "compare.md").write_text(md, encoding="utf-8")
    return 0


def make_client(args: argparse.Namespace, max_concurrency: int) -> httpx.AsyncClient:
    """The AsyncClient of a run: one connection per stream (tests swap this for a MockTransport)."""
    import httpx

    from palmyra_serve.tools.endpoint import api_key, headers

    limits = httpx.Limits(max_connections=max_concurrency + 4, max_keepalive_connections=max_concurrency + 4)
    return httpx.AsyncClient(
        base_url=args.base_url.rstrip("/"), headers=headers(api_key(args)), timeout=args.timeout, limits=limits
    )


async def _get(client: httpx.AsyncClient, path: str) -> httpx.Response | None:
    import httpx

    try:
        return await client.get(path)
    except httpx.HTTPError:
        return None


async def served_version(client: httpx.AsyncClient) -> str | None:
    """vLLM's own /version: answered by the bare engine; the sidecar does not relay it."""
    r = await _get(client, "/version")
    try:
        return str(r.json()["version"]) if r is not None and r.status_code == 200 else None
    except (ValueError, KeyError, TypeError):
        return None


class EngineScrapes:
    """The engine's metrics page, read between bench's phases (engine_metrics.py)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.path: str | None = None
        self.tried = False

    async def read(self) -> dict[str, tuple[float, float]] | None:
        from palmyra_serve.tools import engine_metrics

        paths = [self.path] if self.path else ([] if self.tried else list(engine_metrics.PATHS))
        self.tried = True
        for path in paths:
            r = await _get(self.client, path)
            found = engine_metrics.sums(r.text) if r is not None and r.status_code == 200 else {}
            if found:
                self.path = path
                return found
        return None


async def _bench(args: argparse.Namespace) -> dict:
    import asyncio

    import httpx
    from tqdm import tqdm

    from palmyra_serve.tools import engine_metrics, environment, stats
    from palmyra_serve.tools.endpoint import check_response, parse_models
    from palmyra_serve.tools.loadgen import prefill_once, stream_once
    from palmyra_serve.tools.prompts import RandomPrompts

    started = datetime.now(UTC).isoformat(timespec="seconds")
    conc = sorted(set(args.concurrency))
    async with make_client(args, max(conc)) as client:
        r = await client.get("/v1/models")
        info = parse_models(check_response(r.status_code, r.text), args.model)
        max_len = info.max_model_len or args.max_model_len or 8192
        lengths = plan(args.input_lengths, args.output_tokens, max_len)
        thr_len = plan([args.throughput_input_length], args.output_tokens, max_len)[0]
        prompts = RandomPrompts(args.seed)
        reps, out_tok = args.repetitions, args.output_tokens
        total = args.warmup + len(lengths) * reps * 2 + sum(c * reps for c in conc)
        bar = tqdm(total=total, desc="bench", unit="req", file=sys.stderr, disable=args.no_progress)
        errors: list[str] = []

        async def guarded(coro: Awaitable[_T]) -> _T | None:
            try:
                return await coro
            except (httpx.HTTPError, ValueError, KeyError) as exc:  # EndpointError is a RuntimeError
                errors.append(f"{type(exc).__name__}: {exc}")
            except RuntimeError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                bar.update(1)
            return None

        for _ in range(args.warmup):
            await guarded(stream_once(client, args.model, prompts.take(lengths[0]), out_tok))
        errors.clear()  # a cold engine may time out on warm-up; only measured requests count

        scrapes = EngineScrapes(client)
        engine_before = await scrapes.read()
        phases: list[dict] = []
        seq_ttft: list[float] = []  # what the engine's TTFT histogram saw in this phase, from the client
        seq_gaps: list[float] = []
        prefill, ttft, decode = [], [], []
        for n in lengths:
            lat, first, per_tok = [], [], []
            for _ in range(reps):
                bar.set_postfix_str(f"length {n}")
                t = await guarded(prefill_once(client, args.model, prompts.take(n)))
                if t is not None:
                    lat.append(t)
                    seq_ttft.append(t)
                s = await guarded(stream_once(client, args.model, prompts.take(n), out_tok))
                if s is not None:
                    first.append(s.ttft)
                    seq_ttft.append(s.ttft)
                    if s.per_token is not None:
                        per_tok.append(s.per_token)
                        seq_gaps.append(s.per_token)
            prefill.append({"input_tokens": n, "latency_s": stats.summarize(lat), "samples": lat})
            ttft.append({"input_tokens": n, "ttft_s": stats.summarize(first), "samples": first})
            decode.append({"input_tokens": n, "per_token_s": stats.summarize(per_tok), "samples": per_tok})

        engine_mid = await scrapes.read()
        if engine_before and engine_mid:
            window = engine_metrics.window(engine_before, engine_mid)
            phases.append(engine_metrics.cross_check("5.1-5.3, one request at a time", seq_ttft, seq_gaps, window))
        conc_ttft: list[float] = []
        conc_gaps: list[float] = []
        loop = asyncio.get_running_loop()
        throughput = []
        for c in conc:
            rates, req_lat = [], []
            for _ in range(reps):
                bar.set_postfix_str(f"concurrency {c}")
                batch = [prompts.take(thr_len) for _ in range(c)]
                t0 = loop.time()
                got = await asyncio.gather(*(guarded(stream_once(client, args.model, ids, out_tok)) for ids in batch))
                wall = loop.time() - t0
                done = [s for s in got if s is not None]
                if len(done) == c and wall > 0:
                    rates.append(sum(s.tokens for s in done) / wall)
                req_lat += [s.e2e for s in done]
                conc_ttft += [s.ttft for s in done]
                conc_gaps += [s.per_token for s in done if s.per_token is not None]
            throughput.append(
                {
                    "concurrency": c,
                    "tokens_per_s": stats.summarize(rates),
                    "samples": rates,
                    "request_latency_s": stats.summarize(req_lat),
                }
            )
        engine_after = await scrapes.read()
        if engine_mid and engine_after:
            window = engine_metrics.window(engine_mid, engine_after)
            name = f"5.4, {min(conc)}-{max(conc)} streams"
            phases.append(engine_metrics.cross_check(name, conc_ttft, conc_gaps, window))
        version = await served_version(client)
        bar.close()

    scale = stats.scaling({r["concurrency"]: r["tokens_per_s"]["p50"] for r in throughput if r["tokens_per_s"]["n"]})
    for row in throughput:
        row.update(scale.get(row["concurrency"], {"speedup": float("nan"), "efficiency": float("nan")}))
    cross = {"path": scrapes.path, "phases": phases}
    if not phases:
        cross["unavailable"] = f"no {engine_metrics.TTFT} on {' or '.join(engine_metrics.PATHS)} of {args.base_url}"
    return {
        "schema": SCHEMA,
        "environment": environment.describe(args.base_url, version),
        "meta": {
            "base_url": args.base_url,
            "model": info.id,
            "max_model_len": max_len,
            "started_at": started,
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "output_tokens": out_tok,
            "repetitions": reps,
            "warmup": args.warmup,
            "seed": args.seed,
            "input_lengths": lengths,
            "concurrency": conc,
        },
        "throughput_input_tokens": thr_len,
        "prefill": prefill,
        "ttft": ttft,
        "decode": decode,
        "throughput": throughput,
        "scaling": scaling_against_reference(throughput),
        "engine_cross_check": cross,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
    }
