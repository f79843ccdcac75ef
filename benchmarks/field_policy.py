"""What the field policy costs and what it closes, on the real vLLM CPU engine (tiny stand-in)
behind the sidecar, with four tenants: alice and bob (private prefix caches, the default), carol
and dave (`prefix_cache: shared`).

1. Prefix-cache timing between tenants. A 1,800-token prompt is sent by one tenant, then timed
   (max_tokens 1: the time is the prefill) when the same tenant sends it again, when another
   tenant sends it, and against a fresh prompt of the same length. Between shared tenants a
   second tenant's request hits the cache (what every tenant could time before salts); between
   private ones it does not. The difference is what salting costs a tenant that could have shared.
2. The worst request the policy admits, against a plain request of the same max_tokens: each
   timed alone on the idle engine (median of `--rounds`).

    python -m benchmarks.field_policy            # from the repository root; prints tables
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

KEYS = {name: f"{name}-bench-key-0123456789" for name in ("alice", "bob", "carol", "dave")}
PROMPT_TOKENS = 1800
MODEL = "palmyra-mini"


def tenants_file(path: Path) -> Path:
    from palmyra_serve.sidecar.tenants.config import key_digest

    lines = ["tenants:"]
    for name, key in KEYS.items():
        lines.append(f"  - name: {name}\n    keys: ['{key_digest(key)}']")
        if name in ("carol", "dave"):
            lines.append("    prefix_cache: shared")
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(client: httpx.Client, url: str, tenant: str, body: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    resp = client.post(url, json=body, headers={"authorization": f"Bearer {KEYS[tenant]}"})
    took = time.perf_counter() - t0
    if resp.status_code != 200:
        raise SystemExit(f"{tenant}: {resp.status_code} {resp.text[:300]}")
    return took


def prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(1000, 100_000) for _ in range(PROMPT_TOKENS)]


def prefix_timing(client: httpx.Client, base: str, rounds: int) -> dict[str, list[float]]:
    url = f"{base}/v1/completions"
    rng = random.Random(7)
    out: dict[str, list[float]] = {k: [] for k in ("own hit", "other private", "other shared", "fresh")}
    for _ in range(rounds):
        for first, second, label in (("alice", "bob", "other private"), ("carol", "dave", "other shared")):
            p = prompt(rng)
            timed(client, url, first, {"model": MODEL, "prompt": p, "max_tokens": 1})
            out[label].append(timed(client, url, second, {"model": MODEL, "prompt": p, "max_tokens": 1}))
            if label == "other private":
                out["own hit"].append(timed(client, url, first, {"model": MODEL, "prompt": p, "max_tokens": 1}))
        out["fresh"].append(timed(client, url, "bob", {"model": MODEL, "prompt": prompt(rng), "max_tokens": 1}))
    return out


def worst_requests(client: httpx.Client, base: str, rounds: int, max_tokens: int) -> dict[str, list[float]]:
    chat = f"{base}/v1/chat/completions"
    comp = f"{base}/v1/completions"
    rng = random.Random(11)
    short = [rng.randrange(1000, 100_000) for _ in range(16)]
    long_prompt = [rng.randrange(1000, 100_000) for _ in range(500)]  # within prompt_logprobs_max_tokens
    schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "a",
            "schema": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 64}}},
        },
    }
    cases: dict[str, tuple[str, dict[str, Any]]] = {
        "plain": (comp, {"prompt": short, "max_tokens": max_tokens}),
        "n=8, logprobs 20, min_tokens = max_tokens, ignore_eos": (
            comp,
            {
                "prompt": short,
                "max_tokens": max_tokens,
                "n": 8,
                "logprobs": 20,
                "min_tokens": max_tokens,
                "ignore_eos": True,
            },
        ),
        "500-token prompt, echo + logprobs 20 + prompt_logprobs 20": (
            comp,
            {"prompt": long_prompt, "max_tokens": max_tokens, "echo": True, "logprobs": 20, "prompt_logprobs": 20},
        ),
        "json_schema maxLength 64 (64 units), n=8": (
            chat,
            {
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": max_tokens,
                "n": 8,
                "response_format": schema,
            },
        ),
    }
    cases["all of the above at once, on completions"] = (
        comp,
        {
            "prompt": long_prompt,
            "max_tokens": max_tokens,
            "echo": True,
            "logprobs": 20,
            "prompt_logprobs": 20,
            "n": 8,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "response_format": schema,
        },
    )
    out: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (url, body) in cases.items():
            out[name].append(timed(client, url, "alice", {"model": MODEL, **body}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    from benchmarks.goodput import engine_idle
    from tests.helpers import procs
    from tests.helpers.models import stand_in_model

    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        env = {"PALMYRA_TENANTS_FILE": str(tenants_file(log_dir / "tenants.yaml")), "PALMYRA_AUTH_DISABLED": "false"}
        with (
            procs.engine(stand_in_model("tiny"), log_dir) as engine,
            procs.sidecar(engine.url, log_dir, engine_api_key=engine.api_key, extra_env=env) as sidecar,
            httpx.Client(timeout=300) as client,
        ):
            engine_idle(engine.url, 60)
            timing = prefix_timing(client, sidecar.url, args.rounds)
            print(f"\n1,800-token prompt, max_tokens 1, median of {args.rounds} (ms)\n")
            print("| second request | median ms | min | max |\n|---|---|---|---|")
            for label, xs in timing.items():
                print(f"| {label} | {statistics.median(xs) * 1000:.1f} | {min(xs) * 1000:.1f} | {max(xs) * 1000:.1f} |")
            worst = worst_requests(client, sidecar.url, args.rounds, args.max_tokens)
            plain = statistics.median(worst["plain"])
            print(f"\nmax_tokens {args.max_tokens}, each alone, median of {args.rounds}\n")
            print(
                "| request | median s | x plain | slowest s (the first: a grammar compiled cold) |\n|---|---|---|---|"
            )
            for label, xs in worst.items():
                median = statistics.median(xs)
                print(f"| {label} | {median:.3f} | {median / plain:.2f} | {max(xs):.3f} |")


if __name__ == "__main__":
    main()
