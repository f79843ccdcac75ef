"""Quota accuracy: tokens per minute enforced across two sidecar replicas sharing one Redis.

The real vLLM CPU engine (tiny stand-in), a real redis-server (Debian's), two sidecars in front of
the same engine, both with the same tenants file and Redis. Two tenants, each with a tokens per
minute limit L, each request sent to the replicas in turn, half streamed (without asking for
usage: the sidecar asks and removes it) and half not:

- `over` offers twice its limit: the tokens admitted in every 60 s window of the steady state
  should be within 2 % of L;
- `under` offers 80 % of its limit: it should never be refused, and get at least 95 % of what it
  offers.

A request's true cost is the engine's: its prompt's tokens (the engine's /tokenize, asked once per
prompt) plus the 32 tokens it generates (ignore_eos). Windows are counted by the second each
request was sent.

    python -m benchmarks.tenants_quota      # writes results/tenants-quota.{md,json}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

from benchmarks import results_files
from benchmarks.goodput import WORDS, poisson_arrivals

KEYS = {"over": "over-tenant-key-0123456789", "under": "under-tenant-key-0123456789"}
COMPLETION_TOKENS = 32
PROMPT_WORDS = 16


@dataclass
class Sent:
    tenant: str
    at: float  # seconds since the start
    cost: int  # prompt tokens + completion tokens, as the engine counts them
    status: int = 0
    tokens_seen: int = 0


def tenants_yaml(limit: int) -> str:
    from palmyra_serve.sidecar.tenants.config import key_digest

    return "tenants:\n" + "".join(
        f"  - name: {name}\n    keys: ['{key_digest(key)}']\n    tokens_per_minute: {limit}\n"
        for name, key in KEYS.items()
    )


async def send(client: httpx.AsyncClient, url: str, s: Sent, prompt: str, stream: bool) -> None:
    payload = {
        "model": "palmyra-mini",
        "prompt": prompt,
        "max_tokens": COMPLETION_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }
    headers = {"Authorization": f"Bearer {KEYS[s.tenant]}"}
    if stream:
        async with client.stream("POST", f"{url}/v1/completions", json=payload, headers=headers) as resp:
            s.status = resp.status_code
            async for line in resp.aiter_lines():
                if line.startswith("data: {") and '"text"' in line:
                    s.tokens_seen += 1
                if '"usage"' in line:
                    raise AssertionError("a usage event reached a client that did not ask for it")
    else:
        resp = await client.post(f"{url}/v1/completions", json=payload, headers=headers)
        s.status = resp.status_code
        if resp.status_code == 200:
            s.tokens_seen = resp.json()["usage"]["completion_tokens"]


async def load(urls: list[str], engine: str, engine_key: str, limit: int, seconds: float, seed: int) -> list[Sent]:
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(PROMPT_WORDS)) for _ in range(64)]
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=200)) as client:
        lengths = []
        for p in prompts:  # the engine's own count of each prompt
            r = await client.post(
                f"{engine}/tokenize",
                json={"model": "palmyra-mini", "prompt": p},
                headers={"Authorization": f"Bearer {engine_key}"},
            )
            lengths.append(r.json()["count"])
        cost = sum(lengths) / len(lengths) + COMPLETION_TOKENS
        offers = {"over": 2.0, "under": 0.8}
        schedule = []
        for i, (tenant, multiple) in enumerate(offers.items()):
            rate = multiple * limit / 60 / cost  # requests per second
            schedule += [(at, tenant) for at in poisson_arrivals(rate, seconds, seed + i)]
        schedule.sort()
        sent: list[Sent] = []
        tasks = []
        start = time.monotonic()
        for n, (at, tenant) in enumerate(schedule):
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            k = rng.randrange(len(prompts))
            s = Sent(tenant, time.monotonic() - start, lengths[k] + COMPLETION_TOKENS)
            sent.append(s)
            tasks.append(asyncio.create_task(send(client, urls[n % len(urls)], s, prompts[k], stream=n % 2 == 0)))
        await asyncio.gather(*tasks)
    return sent


def windows(sent: list[Sent], tenant: str, seconds: float, warmup_s: float) -> list[int]:
    """Admitted tokens in each 60 s window [t, t + 60) by send second, t from warmup_s in 1 s steps."""
    admitted = [s for s in sent if s.tenant == tenant and s.status == 200]
    out = []
    t = warmup_s
    while t + 60 <= seconds:
        out.append(sum(s.cost for s in admitted if t <= s.at < t + 60))
        t += 1
    return out


def run(args: argparse.Namespace) -> dict:
    from tests.helpers import procs
    from tests.helpers.models import stand_in_model
    from tests.helpers.redis_server import redis_server

    started = datetime.now(UTC).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        tenants = log_dir / "tenants.yaml"
        tenants.write_text(tenants_yaml(args.limit))
        with redis_server(log_dir) as redis, procs.engine(stand_in_model("tiny"), log_dir) as engine:
            env = {
                "PALMYRA_PLATFORM": "cpu",
                "PALMYRA_AUTH_DISABLED": "false",
                "PALMYRA_TENANTS_FILE": str(tenants),
                "PALMYRA_QUOTA_REDIS_URL": redis.url,
                "PALMYRA_QUOTA_REDIS_PASSWORD_FILE": str(redis.password_file),
                "PALMYRA_QUOTA_REPLICAS": "2",
                # The claim is the quota's: admission lets every admitted request through.
                "PALMYRA_ADMISSION_MODE": "fixed",
                "PALMYRA_MAX_IN_FLIGHT": "64",
                "PALMYRA_READ_TIMEOUT_S": "120",
            }
            with (
                procs.sidecar(engine.url, log_dir, engine_api_key=engine.api_key, extra_env=env) as a,
                procs.sidecar(engine.url, log_dir, engine_api_key=engine.api_key, extra_env=env) as b,
            ):
                sent = asyncio.run(
                    load([a.url, b.url], engine.url, engine.api_key or "", args.limit, args.seconds, args.seed)
                )
                store_errors = [
                    procs.http_get(f"{s.url}/metrics")[1].decode().count("palmyra_quota_store_up 0") for s in (a, b)
                ]
    over = windows(sent, "over", args.seconds, args.warmup_s)
    under = [s for s in sent if s.tenant == "under"]
    under_admitted = [s for s in under if s.status == 200]
    result = {
        "schema": "palmyra-tenants-quota/1",
        "meta": {
            "started_at": started,
            "cpus": os.cpu_count(),
            "limit_tokens_per_minute": args.limit,
            "seconds": args.seconds,
            "warmup_s": args.warmup_s,
            "seed": args.seed,
        },
        "over": {
            "sent": sum(s.tenant == "over" for s in sent),
            "refused": sum(s.tenant == "over" and s.status == 429 for s in sent),
            "windows": len(over),
            "window_min_share": min(over) / args.limit if over else None,
            "window_max_share": max(over) / args.limit if over else None,
            "window_mean_share": sum(over) / len(over) / args.limit if over else None,
            "first_minute_share": sum(s.cost for s in sent if s.tenant == "over" and s.status == 200 and s.at < 60)
            / args.limit,
        },
        "under": {
            "sent": len(under),
            "refused": sum(s.status == 429 for s in under),
            "admitted_share": len(under_admitted) / len(under) if under else None,
            "offered_tokens_per_minute": sum(s.cost for s in under) / args.seconds * 60,
        },
        "errors": sorted({s.status for s in sent if s.status not in (200, 429)}),
        "streams_checked_without_usage": sum(1 for i, s in enumerate(sent) if i % 2 == 0 and s.status == 200),
        "quota_store_down_seen": sum(store_errors),
    }
    print(json.dumps(result, indent=2))
    return result


def markdown(doc: dict) -> str:
    meta, over, under = doc["meta"], doc["over"], doc["under"]
    return "\n".join(
        [
            "# Tokens per minute across two replicas sharing one Redis",
            "",
            f"{meta['started_at']}, {meta['cpus']} CPUs; the real vLLM CPU engine on the tiny stand-in, two "
            f"sidecars, one redis-server; each tenant's limit {meta['limit_tokens_per_minute']} tokens per minute; "
            f"{meta['seconds']:g} s of load, requests to the replicas in turn, half streamed without asking "
            f"for usage. Windows: every 60 s window from {meta['warmup_s']:g} s on, 1 s apart, by send second; a "
            "request's cost is the engine's (its prompt's /tokenize count + 32 generated tokens).",
            "",
            "| tenant | offers | sent | refused (429) | admitted tokens per 60 s window / limit |",
            "|---|---|---|---|---|",
            f"| over | 2x its limit | {over['sent']} | {over['refused']} | "
            f"first minute {over['first_minute_share']:.1%}; "
            f"from {meta['warmup_s']:g} s: min {over['window_min_share']:.1%}, mean {over['window_mean_share']:.1%}, "
            f"max {over['window_max_share']:.1%} ({over['windows']} windows) |",
            f"| under | {under['offered_tokens_per_minute'] / meta['limit_tokens_per_minute']:.0%} of its limit | "
            f"{under['sent']} | {under['refused']} | admitted {under['admitted_share']:.1%} of its requests |",
            "",
            f"Errors (other statuses): {doc['errors'] or 'none'}. Streams admitted, none with a usage event: "
            f"{doc['streams_checked_without_usage']}.",
            "",
            f"Reproduce: `python -m benchmarks.tenants_quota --limit {meta['limit_tokens_per_minute']} "
            f"--seconds {meta['seconds']:g}`",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=4000, help="each tenant's tokens per minute")
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--warmup-s", type=float, default=30.0, help="windows start after this (the first fill)")
    return results_files.main(parser, run, markdown, "tenants-quota", argv)


if __name__ == "__main__":
    sys.exit(main())
