"""Two trees' sidecars side by side: the relay's CPU per request, A against B, in short alternating
runs on one fast fake engine, so that the machine's drift (on a shared VM, one tree's whole run can
land in a slow minute) hits both alike.

Each tree's sidecar runs from its own `service/` (PYTHONPATH), with workload A's settings of
benchmarks/relay.py (a key, fixed admission, the access log on, no canary). Then, `--pairs` times,
for each route: a wrk run of `--seconds` at `--concurrency` against A and one against B (which goes
first alternates), each sidecar's own CPU time (/proc) over its requests. Printed: every pair's
B/A ratio, and per route the geometric mean with its 95% interval (t over the pairs' log ratios)
and B/A requests/s.

    python -m benchmarks.relay_ab --a /path/to/before --b . --route completions,chat --pairs 12
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.relay import HERE, ROUTES, cpu_seconds, run_wrk, workload_a_env
from tests.helpers import procs

# Two-sided 95% t quantiles for 1..30 degrees of freedom (beyond, the normal's 1.96).
T95: tuple[float, ...] = (
    *(12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13),
    *(2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04),
)


def t95(df: int) -> float:
    return T95[df - 1] if df <= len(T95) else 1.96


def workload_env(tree: Path) -> dict[str, str]:
    return {**workload_a_env(), "PYTHONPATH": str(tree.resolve() / "service")}


def summary(ratios: list[float]) -> tuple[float, float, float]:
    """Geometric mean and its 95% interval."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.mean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.exp(mean), math.exp(mean)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", type=Path, required=True, help="tree A (holds service/)")
    parser.add_argument("--b", type=Path, required=True, help="tree B (holds service/)")
    parser.add_argument("--route", default="completions,chat", help="one or more of " + ",".join(ROUTES))
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    routes = args.route.split(",")
    log_dir = Path(tempfile.mkdtemp(prefix="relay-ab-"))
    port = procs.free_port()
    engine = procs.spawn([sys.executable, str(HERE / "fast_engine.py"), str(port)], log_dir / "fast.log", {})
    luas = {}
    for route in routes:
        luas[route] = log_dir / f"post-{route}.lua"
        luas[route].write_text(ROUTES[route].lua())
    engine_url = f"http://127.0.0.1:{port}"
    try:
        procs.wait_for(f"{engine_url}/health", engine, log_dir / "fast.log", 20)
        with (
            procs.sidecar(engine_url, log_dir, extra_env=workload_env(args.a)) as side_a,
            procs.sidecar(engine_url, log_dir, extra_env=workload_env(args.b)) as side_b,
        ):
            sides = {"A": side_a, "B": side_b}
            for route in routes:  # warm both: first requests import and allocate
                for side in sides.values():
                    run_wrk(side.url + ROUTES[route].path, args.concurrency, 2, luas[route])
            cpu: dict[str, list[tuple[float, float]]] = {route: [] for route in routes}
            rps: dict[str, list[tuple[float, float]]] = {route: [] for route in routes}
            for pair in range(args.pairs):
                for route in routes:
                    seen: dict[str, tuple[float, float]] = {}
                    for name in ("A", "B") if pair % 2 == 0 else ("B", "A"):
                        side = sides[name]
                        before = cpu_seconds([side.proc.pid])
                        run = run_wrk(side.url + ROUTES[route].path, args.concurrency, args.seconds, luas[route])
                        spent = cpu_seconds([side.proc.pid]) - before
                        if run["non_2xx"] or not run["requests"]:
                            raise SystemExit(f"{name} answered {run['non_2xx']} non-2xx of {run['requests']}")
                        seen[name] = (spent / run["requests"] * 1e6, run["rps"])
                    cpu[route].append((seen["A"][0], seen["B"][0]))
                    rps[route].append((seen["A"][1], seen["B"][1]))
                    a, b = seen["A"][0], seen["B"][0]
                    print(f"pair {pair + 1:2d} {route:12s} A {a:7.1f} us  B {b:7.1f} us  B/A {b / a:.2f}", flush=True)
    finally:
        procs.stop(engine)
    print(f"\nA: {args.a}\nB: {args.b}\n{args.concurrency} streams, {args.seconds} s per run, {args.pairs} pairs")
    for route in routes:
        mean, low, high = summary([b / a for a, b in cpu[route]])
        speed, _, _ = summary([b / a for a, b in rps[route]])
        a_med = statistics.median(a for a, _ in cpu[route])
        b_med = statistics.median(b for _, b in cpu[route])
        print(
            f"{route:12s} CPU per request B/A {mean:.3f} (95% {low:.3f}-{high:.3f}); "
            f"median A {a_med:.1f} us, B {b_med:.1f} us; requests/s B/A {speed:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
