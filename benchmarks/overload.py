"""Overload against a fast engine: adaptive admission refuses nothing up to capacity, only clean 429s above it.

The sidecar with its default (adaptive) admission in front of tests/helpers/fake_engine.py set up
as an engine of a known capacity: `--slots` generations at once (its `max_running`), each answering
`--service-s` after it starts with all 64 token events in one write (`one_write`), the way a fast
engine on a fast machine delivers a short stream; requests beyond the slots wait inside the engine,
as in vLLM's scheduler queue. Capacity (1×) is measured as goodput.py measures it (a closed loop
of 2 × slots streams against the bare engine, Little's law); then open-loop Poisson arrivals at
multiples of it (default 0.5×, 1×, 2×), the bare engine and each sidecar side by side with the same
arrival times, through goodput.py's client (the sidecar's own lean pool).

Checks (printed at the end; the exit status is 1 when one fails):
- at ≤ 1×: each sidecar refuses nothing and cuts nothing; the TTFT it adds (p50, p99, against
  bare at the same arrivals) is reported, not judged;
- above 1×: the sidecar refuses some, every refusal is a 429 with Retry-After (no other status, no
  client-side error), no admitted stream is cut or left unfinished, and /metrics counts no admission
  fault (palmyra_admission_faults_total) and no internal error (palmyra_internal_errors_total);
- the sidecar's log holds no traceback.

`--variant NAME:PALMYRA_X=V,...` adds a sidecar with other settings as one more target (repeatable),
e.g. a connection cap wide enough for the adaptive ceiling plus the queue
(`--variant wide-cap:PALMYRA_MAX_CONNECTIONS=576`; the default 384 is 64 in flight + 256 queued + 64,
fixed mode's numbers, while the adaptive ceiling against an engine of unknown size is 256).

    python -m benchmarks.overload                                  # writes benchmarks/results/overload.{md,json}
    python -m benchmarks.overload --slots 16 --seconds 6 --out /tmp/o   # a short smoke run
    python -m benchmarks.overload --slots 128 --service-s 0.2 --variant wide-cap:PALMYRA_MAX_CONNECTIONS=576
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import resource
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import goodput  # its open-loop client, capacity measurement and per-rate summary
from tests.helpers import procs

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

SCHEMA = "palmyra-overload/1"
TOKENS = 64
COUNTERS = (
    "palmyra_rejections_total",
    "palmyra_admission_faults_total",
    "palmyra_internal_errors_total",
    "palmyra_upstream_errors_total",
    "palmyra_connections_reclaimed_total",
)
HEADERS = [(b"content-type", b"application/json")]


def counters(url: str) -> dict[str, float]:
    """The sidecar's counters that say how it refused or failed, one entry per series (labels kept)."""
    _, page = procs.http_get(f"{url}/metrics")
    out: dict[str, float] = {}
    for line in page.decode().splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in COUNTERS:
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


def gauge(url: str, name: str) -> float | None:
    _, page = procs.http_get(f"{url}/metrics")
    m = re.search(rf"^{name} (\S+)", page.decode(), re.MULTILINE)
    return float(m.group(1)) if m else None


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def engine_stats(engine_url: str) -> dict:
    _, body = procs.http_get(f"{engine_url}/fake/stats")
    return json.loads(body)


def engine_idle(engine_url: str, timeout_s: float) -> None:
    """Wait until the fake engine runs and queues nothing, so one target's backlog does not bill the next."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = engine_stats(engine_url)
        if stats["running"] == 0 and stats["waiting"] == 0:
            return
        time.sleep(0.2)


def tracebacks(log: str) -> int:
    return log.count("Traceback (most recent call last)")


def run(args: argparse.Namespace, log_dir: Path) -> dict:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the bare engine's backlog above 1× is open streams
    variants: dict[str, dict[str, str]] = {"sidecar": {}}
    for spec in args.variant:
        name, _, settings = spec.partition(":")
        variants[f"sidecar {name}"] = dict(kv.split("=", 1) for kv in settings.split(",") if kv)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(procs.fake_engine(log_dir))
        # The engine's shape is set before any sidecar starts: warmup meets the same engine as the load.
        control = {"max_running": args.slots, "first_delay_s": args.service_s, "one_write": True}
        urllib.request.urlopen(
            urllib.request.Request(
                f"{engine.url}/fake/control",
                data=json.dumps(control).encode(),
                headers={"content-type": "application/json"},
            ),
            timeout=5,
        ).read()
        sidecars = {
            name: stack.enter_context(procs.sidecar(engine.url, log_dir, extra_env=env))
            for name, env in variants.items()
        }
        targets = {"bare engine": engine.url, **{name: sc.url for name, sc in sidecars.items()}}
        ceilings = {name: gauge(sc.url, "palmyra_concurrency_ceiling") for name, sc in sidecars.items()}
        if args.capacity:
            capacity, source = args.capacity, "given"
        else:
            capacity = asyncio.run(
                goodput.closed_loop_rate(engine.url, HEADERS, 2 * args.slots, args.capacity_s, TOKENS)
            )
            source = f"closed loop, {2 * args.slots} streams, {args.capacity_s:.0f} s, bare engine"
        print(
            f"capacity {capacity:.1f} req/s ({source}; {args.slots} slots / {args.service_s} s = "
            f"{args.slots / args.service_s:.0f} by construction)",
            flush=True,
        )
        points = []
        for i, multiple in enumerate(args.rates):
            rate = capacity * multiple
            order = goodput.in_turn(list(targets), i)
            point = {"multiple": multiple, "offered_per_s": rate, "targets": {}}
            for name in order:
                engine_idle(engine.url, 60)
                base = targets[name]
                sidecar = sidecars.get(name)
                before = counters(base) if sidecar else {}
                engine_before = engine_stats(engine.url)
                watch = goodput.LimitWatch(base) if sidecar else None
                results = asyncio.run(
                    goodput.open_loop(
                        base,
                        HEADERS,
                        rate,
                        args.seconds,
                        args.drain_s,
                        1000 * args.seed + i,
                        1000 * args.seed + 10 * i,
                        TOKENS,
                    )
                )
                row = goodput.summarize_rate(results, args.seconds, tokens=TOKENS)
                row["statuses"] = dict(sorted(collections.Counter(str(r.status) for r in results).items()))
                row["client_errors"] = sum(r.status is None and r.error is not None for r in results)
                row["engine_aborted"] = engine_stats(engine.url)["aborted"] - engine_before["aborted"]
                if watch is not None:
                    row["admission"] = watch.stop()
                    row["counters"] = delta(before, counters(base))
                point["targets"][name] = row
                limit = row.get("admission", {})
                print(
                    f"{multiple:g}x {rate:7.1f}/s {name:18} goodput {row['goodput_per_s']:7.1f}/s  "
                    f"ttft p50 {1000 * (row['ttft_p50_s'] or 0):7.1f} p99 {1000 * (row['ttft_p99_s'] or 0):7.1f} ms  "
                    f"statuses {row['statuses']}  cut {row['errors']} unfinished {row['unfinished']}"
                    + (f"  limit {limit['limit_min']:g}-{limit['limit_max']:g}" if limit.get("limit_min") else "")
                    + (f"  {row['counters']}" if row.get("counters") else ""),
                    flush=True,
                )
            point["targets"] = {name: point["targets"][name] for name in targets}
            points.append(point)
        logs = {name: sc.log() for name, sc in sidecars.items()}
    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    doc = {
        "schema": SCHEMA,
        "meta": {
            "started_at": started,
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model,
            "slots": args.slots,
            "service_s": args.service_s,
            "tokens": TOKENS,
            "capacity_per_s": capacity,
            "capacity_source": source,
            "seconds": args.seconds,
            "drain_s": args.drain_s,
            "ttft_slo_s": goodput.TTFT_SLO_S,
            "itl_slo_s": goodput.ITL_SLO_S,
            "seed": args.seed,
            "sidecars": {
                name: {
                    "settings": variants[name] or "defaults",
                    "ceiling": ceilings[name],
                    "log_tracebacks": tracebacks(logs[name]),
                }
                for name in sidecars
            },
        },
        "rates": points,
    }
    doc["checks"] = checks(doc)
    return doc


def checks(doc: dict) -> list[dict]:
    """What must hold, one entry per sidecar and rate: {"what", "ok", "detail"}."""
    out = []
    for point in doc["rates"]:
        bare = point["targets"]["bare engine"]
        for name, row in point["targets"].items():
            if name == "bare engine":
                continue
            at = f"{point['multiple']:g}× {name}"
            c = row.get("counters", {})
            faults = sum(
                v for k, v in c.items() if k.startswith(("palmyra_admission_faults", "palmyra_internal_errors"))
            )
            if point["multiple"] <= 1:
                added = [1000 * ((row[k] or 0) - (bare[k] or 0)) for k in ("ttft_p50_s", "ttft_p99_s")]
                out.append(
                    {
                        "what": f"{at}: nothing refused, nothing cut",
                        "ok": row["refused"] == 0
                        and row["errors"] == 0
                        and row["unfinished"] == 0
                        and row["client_errors"] == 0
                        and faults == 0,
                        "detail": f"statuses {row['statuses']}, cut {row['errors']}, unfinished "
                        f"{row['unfinished']}; TTFT added p50 {added[0]:+.1f} ms, "
                        f"p99 {added[1]:+.1f} ms",
                    }
                )
            else:
                statuses = set(row["statuses"])
                out.append(
                    {
                        "what": f"{at}: the excess refused with 429 only, nothing admitted cut, no fault",
                        "ok": row["refused"] > 0
                        and statuses <= {"200", "429"}
                        and row["errors"] == 0
                        and row["unfinished"] == 0
                        and row["client_errors"] == 0
                        and faults == 0
                        and bool(row["retry_after"]),
                        "detail": f"statuses {row['statuses']}, cut {row['errors']}, unfinished "
                        f"{row['unfinished']}, client errors {row['client_errors']}, "
                        f"Retry-After {row['retry_after']}, counters {c or '{}'}, "
                        f"admitted good {row['good']} of {row['completed']}",
                    }
                )
    for name, meta in doc["meta"]["sidecars"].items():
        out.append(
            {
                "what": f"{name}: no traceback in its log",
                "ok": meta["log_tracebacks"] == 0,
                "detail": f"{meta['log_tracebacks']} tracebacks",
            }
        )
    return out


def markdown(doc: dict) -> str:
    meta = doc["meta"]
    sidecars = "; ".join(f"{name}: {m['settings']}, ceiling {m['ceiling']}" for name, m in meta["sidecars"].items())
    lines = [
        "# Overload against a fast engine",
        "",
        (
            f"{meta['started_at']}, {meta['cpus']} cores, {meta['cpu_model']}. Fake engine: {meta['slots']} "
            f"generations at once, each {meta['service_s']} s, {meta['tokens']} token events in one write, the "
            f"rest waiting in the engine. Capacity (1×) = {meta['capacity_per_s']:.1f} req/s "
            f"({meta['capacity_source']}). Open-loop Poisson arrivals, {meta['seconds']:.0f} s per rate; "
            f"still open {meta['drain_s']:.0f} s after arrivals stopped = unfinished, cancelled. "
            f"Sidecars ({sidecars})."
        ),
        "",
        "| offered | target | goodput /s | TTFT p50 / p99 ms | statuses | cut | unfinished | limit | counters |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for point in doc["rates"]:
        for name, row in point["targets"].items():
            adm = row.get("admission") or {}
            limit = f"{adm['limit_min']:g}–{adm['limit_max']:g}" if adm.get("limit_min") is not None else "—"
            ttft = " / ".join(
                "—"
                if row[k] is None
                else f"{'≥' if row[k.removesuffix('_s') + '_lower_bound'] else ''}{1000 * row[k]:.1f}"
                for k in ("ttft_p50_s", "ttft_p99_s")
            )
            counters_text = ", ".join(f"{k} {v:g}" for k, v in row.get("counters", {}).items()) or "—"
            lines.append(
                f"| {point['offered_per_s']:.0f}/s ({point['multiple']:g}×) | {name} "
                f"| {row['goodput_per_s']:.1f} | {ttft} | {row['statuses']} | {row['errors']} "
                f"| {row['unfinished']} | {limit} | {counters_text} |"
            )
    lines += ["", "Checks:", ""]
    lines += [f"- {'met' if c['ok'] else '**not met**'}: {c['what']} ({c['detail']})" for c in doc["checks"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=64, help="generations the fake engine runs at once")
    parser.add_argument("--service-s", type=float, default=0.2, help="how long one generation takes once started")
    parser.add_argument(
        "--rates", type=goodput._floats, default=goodput._floats("0.5,1,2"), help="multiples of capacity"
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="arrivals per rate and target (s)")
    parser.add_argument("--drain-s", type=float, default=5.0, help="wait after arrivals stop before cancelling")
    parser.add_argument("--capacity", type=float, default=None, help="1x in req/s (default: measure it)")
    parser.add_argument("--capacity-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:PALMYRA_X=V,...",
        help="one more sidecar target with these settings (repeatable)",
    )
    parser.add_argument("--name", default="overload", help="file name stem under --out")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the engine's and sidecars' logs here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = args.log_dir or Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        doc = run(args, log_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = markdown(doc)
    (args.out / f"{args.name}.md").write_text(md)
    print(md)
    return 0 if all(c["ok"] for c in doc["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
