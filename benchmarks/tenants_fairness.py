"""Fair share between tenants under overload, against first-come-first-served, in one run.

Two tenants on the real vLLM CPU engine (the tiny stand-in) behind the sidecar: `heavy` offers
4x the engine's capacity, `light` 0.25x, both open-loop Poisson arrivals at the same time (the
goodput benchmark's requests: distinct 48-word prompts, 64 streamed tokens, ignore_eos). Two
sidecar configurations, one after the other on the same engine:

- fifo: both keys plain keys, so both clients are one tenant (`default`): one queue in arrival
  order, as before tenants existed;
- fair share: a tenants file naming `heavy` and `light`, weight 1 each.

A request is good when it completes within the SLOs (benchmarks/goodput.py's is_good). The claim:
with fair share the light tenant's goodput is at least 95 % of what it offers, and the heavy one
gets the rest of the capacity. SLOs: pass --ttft-slo/--itl-slo scaled to the machine (the sidecar's
adaptive admission gets the same values).

    python -m benchmarks.tenants_fairness --ttft-slo 4 --itl-slo 1     # writes results/tenants-fairness.{md,json}
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import results_files
from benchmarks.goodput import closed_loop_rate, engine_idle, open_loop, summarize_rate

HEAVY_KEY = "heavy-tenant-key-0123456789"
LIGHT_KEY = "light-tenant-key-0123456789"


def tenants_file(path: Path) -> Path:
    from palmyra_serve.sidecar.tenants.config import key_digest

    path.write_text(
        "tenants:\n"
        f"  - name: heavy\n    keys: ['{key_digest(HEAVY_KEY)}']\n"
        f"  - name: light\n    keys: ['{key_digest(LIGHT_KEY)}']\n"
    )
    return path


def refusals(page: str, tenant: str) -> dict[str, float]:
    """The sidecar's refusals of one tenant by reason (fifo: both clients are `default`)."""
    pattern = rf'^palmyra_tenant_refusals_total{{reason="([^"]+)",tenant="{re.escape(tenant)}"}} (\S+)$'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, page, re.M) if float(m.group(2))}


def headers(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]


async def both(url: str, args: argparse.Namespace, capacity: float, seed: int) -> dict[str, list]:
    heavy, light = await asyncio.gather(
        open_loop(url, headers(HEAVY_KEY), capacity * args.heavy, args.seconds, args.drain_s, seed, seed + 1, 64),
        open_loop(url, headers(LIGHT_KEY), capacity * args.light, args.seconds, args.drain_s, seed + 2, seed + 3, 64),
    )
    return {"heavy": heavy, "light": light}


def run(args: argparse.Namespace) -> dict:
    from tests.helpers import procs
    from tests.helpers.models import stand_in_model

    slo_env = {
        "PALMYRA_PLATFORM": "cpu",
        "PALMYRA_SLO_TTFT_S": str(args.ttft_slo),
        "PALMYRA_SLO_ITL_S": str(args.itl_slo),
        "PALMYRA_AUTH_DISABLED": "false",
    }
    started = datetime.now(UTC).isoformat(timespec="seconds")
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        configs = {
            "fifo": {"PALMYRA_API_KEYS": f"{HEAVY_KEY},{LIGHT_KEY}"},
            "fair share": {"PALMYRA_TENANTS_FILE": str(tenants_file(log_dir / "tenants.yaml"))},
        }
        with procs.engine(stand_in_model("tiny"), log_dir) as engine:
            engine_auth = headers(engine.api_key or "")
            capacity = args.capacity or asyncio.run(closed_loop_rate(engine.url, engine_auth, 32, 10.0, 64))
            print(f"capacity {capacity:.2f} req/s", flush=True)
            for name, env in configs.items():
                engine_idle(engine.url, 120)
                with procs.sidecar(
                    engine.url, log_dir, engine_api_key=engine.api_key, extra_env={**slo_env, **env}
                ) as sidecar:
                    results = asyncio.run(both(sidecar.url, args, capacity, 1000 * args.seed))
                    page = procs.http_get(f"{sidecar.url}/metrics")[1].decode()
                rows[name] = {}
                for tenant, rs in results.items():
                    row = summarize_rate(rs, args.seconds, args.ttft_slo, args.itl_slo, 64)
                    row["good_share_of_offered"] = row["good"] / row["sent"] if row["sent"] else None
                    row["refusals_by_reason"] = refusals(page, tenant if name == "fair share" else "default")
                    rows[name][tenant] = row
                    print(
                        f"{name:10} {tenant:5} offered {row['offered_per_s']:.2f}/s good {row['goodput_per_s']:.2f}/s "
                        f"({(row['good_share_of_offered'] or 0):.0%} of offered) refused {row['refused']} "
                        f"errors {row['errors']} unfinished {row['unfinished']} of {row['sent']} "
                        f"{row['refusals_by_reason']}",
                        flush=True,
                    )
    return {
        "schema": "palmyra-tenants-fairness/1",
        "meta": {
            "started_at": started,
            "cpus": os.cpu_count(),
            "capacity_per_s": capacity,
            "capacity_source": "given (--capacity)" if args.capacity else "closed loop, 32 streams, 10 s, bare engine",
            "heavy_multiple": args.heavy,
            "light_multiple": args.light,
            "seconds": args.seconds,
            "ttft_slo_s": args.ttft_slo,
            "itl_slo_s": args.itl_slo,
            "seed": args.seed,
        },
        "configs": rows,
    }


def markdown(doc: dict) -> str:
    meta = doc["meta"]
    lines = [
        "# Fair share between tenants under overload",
        "",
        f"{meta['started_at']}, {meta['cpus']} CPUs; the real vLLM CPU engine on the tiny stand-in, capacity "
        f"{meta['capacity_per_s']:.2f} req/s ({meta['capacity_source']}); `heavy` offers {meta['heavy_multiple']:g}x, "
        f"`light` {meta['light_multiple']:g}x, for {meta['seconds']:g} s at once. Good: complete within TTFT "
        f"{meta['ttft_slo_s']:g} s and a mean token gap of {meta['itl_slo_s']:g} s (the sidecar's SLOs set alike).",
        "",
        "| admission | tenant | offered/s | good/s | good / offered | refused | errors | unfinished |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, tenants in doc["configs"].items():
        for tenant, row in tenants.items():
            share = row["good_share_of_offered"]
            lines.append(
                f"| {name} | {tenant} | {row['offered_per_s']:.2f} | {row['goodput_per_s']:.2f} | "
                f"{'-' if share is None else f'{share:.0%}'} | {row['refused']} | {row['errors']} | "
                f"{row['unfinished']} |"
            )
    lines += [
        "",
        "Reproduce: `python -m benchmarks.tenants_fairness "
        f"--ttft-slo {meta['ttft_slo_s']:g} --itl-slo {meta['itl_slo_s']:g} --seconds {meta['seconds']:g}`"
        " (`--capacity R` skips measuring it)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heavy", type=float, default=4.0, help="the heavy tenant's offer, a multiple of capacity")
    parser.add_argument("--light", type=float, default=0.25, help="the light tenant's offer, a multiple of capacity")
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--drain-s", type=float, default=20.0)
    parser.add_argument("--capacity", type=float, default=None, help="1x in req/s (default: measure it)")
    parser.add_argument("--ttft-slo", type=float, default=2.0)
    parser.add_argument("--itl-slo", type=float, default=0.25)
    return results_files.main(parser, run, markdown, "tenants-fairness", argv)


if __name__ == "__main__":
    sys.exit(main())
