#!/usr/bin/env bash
# The checks for a lent accelerator machine (one NVIDIA H200, 16 cores, no network), in one call
# of at most ~7 minutes, everything it finds written under $OUT (8 files at most):
#   machine.txt   what the machine is: nvidia-smi, torch's view of the GPU, cores, CPU, glibc, and
#                 whether `import vllm` works there (it cannot: vLLM for CUDA is a 240-330 MB wheel
#                 that needs its own torch, far over what a call may carry)
#   relay.md/json benchmarks/relay.py workload A (fast fake engine; direct, nginx, sidecar) at
#                 1, 32, 256 and 1024 streams: requests/s and each proxy's CPU per 1000 requests
#   overload.md/json  benchmarks/overload.py: adaptive admission against a fake engine of known
#                 capacity that writes its 64 token events at once, 0.5x / 1x / 2x of that capacity
#   logs.txt      the sidecars' and engines' log tails (tracebacks first)
#   log           this script's whole output
# It needs the folder .whl carried along: the sidecar's wheels (cp312 manylinux, the versions
# pyproject.toml pins, and their dependencies) and .whl/tools (Debian 12's nginx and wrk with
# their own libraries; where they do not run, relay.py falls back to its lean client, no nginx).
#
#   bash benchmarks/device_check.sh                          # there: OUT is set by the device tool
#   OUT=/tmp/devout PY=python3.12 QUICK=1 bash benchmarks/device_check.sh   # a short rehearsal here
# PY: the Python 3.12 to use (default python3); QUICK=1 shrinks every duration and size.
set -u -o pipefail
OUT=${OUT:?set OUT to the folder that comes back}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
if [ "${QUICK:-0}" = 1 ]; then
  CONC=1,32,256 SECONDS_A=2 ROUNDS_A=1 SLOTS=16 SERVICE=0.2 SECONDS_B=5 CAP_B=2 T_A=200 T_B=150
else
  CONC=1,32,256,1024 SECONDS_A=5 ROUNDS_A=3 SLOTS=128 SERVICE=0.2 SECONDS_B=10 CAP_B=4 T_A=230 T_B=170
fi

facts() {
  echo "date: $(date -u +%FT%TZ)"
  echo "uname: $(uname -a)"
  grep -E '^(PRETTY_NAME|VERSION_ID)=' /etc/os-release 2>/dev/null
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "memory: $(free -g 2>/dev/null | awk '/^Mem:/ {print $2 " GiB"}')"
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "open files: soft $(ulimit -Sn), hard $(ulimit -Hn); somaxconn $(cat /proc/sys/net/core/somaxconn 2>/dev/null)"
  echo "python3: $(command -v python3) $($PY -V 2>&1)"
  echo "--- nvidia-smi"
  timeout 30 nvidia-smi 2>&1
  timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
  echo "--- torch"
  timeout 90 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available()); print(torch.cuda.get_device_name())' 2>&1 | tail -3
  echo "--- import vllm"
  timeout 60 python3 -c 'import vllm; print("vllm", vllm.__version__)' 2>&1 | tail -1
  echo "--- the image's own copies of the sidecar's dependencies (the carried wheels take precedence)"
  timeout 30 python3 -m pip list 2>/dev/null | grep -iE '^(aiohttp|uvloop|httptools|fastapi|starlette|uvicorn|pydantic|pydantic-settings|orjson|msgspec|prometheus.client|psutil|vllm) '
  echo "nginx on PATH: $(command -v nginx || echo none); wrk on PATH: $(command -v wrk || echo none)"
}

ldd_tools() {
  LD_LIBRARY_PATH="$PWD/.whl/tools/lib" ldd .whl/tools/libexec/nginx .whl/tools/libexec/wrk 2>&1
}

main() {
  echo "== machine"
  facts | tee "$OUT/machine.txt"

  echo "== the sidecar's Python: carried wheels in /tmp/site, ./service, a venv for the palmyra-serve script"
  PIP_CONFIG_FILE=/dev/null PIP_CONSTRAINT= "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "FAILED: wheel install"; return 1; }
  export PYTHONPATH="/tmp/site:$PWD/service"
  # tests/helpers/procs.py starts `palmyra-serve` from the folder of sys.executable: a venv of our own
  # (no pip, no site-packages: everything comes from PYTHONPATH) holds that script.
  rm -rf /tmp/pvenv
  if "$PY" -m venv --without-pip /tmp/pvenv; then
    VPY=/tmp/pvenv/bin/python3
  else  # no venv module: the script goes beside the interpreter itself (a bare machine, given back after)
    VPY=$("$PY" -c 'import sys; print(sys.executable)'); echo "no venv: palmyra-serve beside $VPY"
  fi
  SCRIPT=$(dirname "$VPY")/palmyra-serve
  printf '#!%s\nimport sys\nfrom palmyra_serve.cli import main\nsys.exit(main())\n' "$VPY" > "$SCRIPT"
  chmod +x "$SCRIPT"
  "$VPY" -c 'import sys, palmyra_serve.sidecar.app, uvloop, httptools, aiohttp, psutil, msgspec, orjson; print(sys.version.split()[0], "imports ok")' \
    || { echo "FAILED: imports"; return 1; }
  "$SCRIPT" --help >/dev/null || { echo "FAILED: palmyra-serve script"; return 1; }
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"  # root may raise the hard limit too
  echo "open files now: $(ulimit -n)"

  echo "== nginx and wrk (carried, Debian 12 builds with their own libraries)"
  chmod +x .whl/tools/bin/* .whl/tools/libexec/* 2>/dev/null
  export PATH="$PWD/.whl/tools/bin:$PATH"
  LOAD=wrk TARGETS=direct,nginx,sidecar
  # Their output is read whole (wrk -v exits 1 even when it runs; pipefail would count that).
  v=$(nginx -v 2>&1); echo "$v" | head -1
  mkdir -p /tmp/ngxt && printf 'pid /tmp/ngxt/pid;\nevents {}\nhttp { access_log off; server { listen 127.0.0.1:1; } }\n' > /tmp/ngxt/conf
  case "$v" in
    *"nginx version"*) nginx -t -c /tmp/ngxt/conf 2>&1 || { echo "nginx cannot take relay.py's kind of config"; TARGETS=direct,sidecar; } ;;
    *) echo "nginx does not run here"; TARGETS=direct,sidecar; ldd_tools ;;
  esac
  v=$(wrk -v 2>&1); echo "$v" | head -1
  case "$v" in "wrk "*) ;; *) echo "wrk does not run here"; LOAD=lean; ldd_tools ;; esac
  echo "load $LOAD, targets $TARGETS"

  echo "== $(date -u +%T) (a) relay benchmark, workload A, streams $CONC"
  timeout -s INT -k 20 "$T_A" "$VPY" -m benchmarks.relay --workload A --concurrency "$CONC" --seconds "$SECONDS_A" \
    --ttft-rounds "$ROUNDS_A" --load "$LOAD" --targets "$TARGETS" --out "$OUT"
  echo "relay rc $?"
  if [ ! -f "$OUT/relay.md" ] && [ "$SECONDS" -lt 200 ]; then  # it broke early: once more, needing neither tool
    echo "== $(date -u +%T) (a) again with the lean client, no nginx"
    timeout -s INT -k 20 150 "$VPY" -m benchmarks.relay --workload A --concurrency "$CONC" --seconds "$SECONDS_A" \
      --ttft-rounds 1 --load lean --targets direct,sidecar --out "$OUT"
    echo "relay (lean) rc $?"
  fi

  echo "== $(date -u +%T) (b) overload against a fast engine: $SLOTS slots x $SERVICE s, 64 events per write"
  rm -rf /tmp/ologs
  timeout -s INT -k 20 "$T_B" "$VPY" -m benchmarks.overload --slots "$SLOTS" --service-s "$SERVICE" --seconds "$SECONDS_B" \
    --capacity-s "$CAP_B" --variant wide-cap:PALMYRA_MAX_CONNECTIONS=576 --out "$OUT" --log-dir /tmp/ologs
  echo "overload rc $? (1: a check not met)"

  for f in /tmp/ologs/*.log; do
    [ -f "$f" ] || continue
    echo "=== $f: $(wc -c <"$f") bytes, $(grep -c 'Traceback (most recent' "$f") tracebacks"
    grep -m3 -A25 'Traceback (most recent' "$f"
    tail -n 40 "$f"
  done > "$OUT/logs.txt" 2>&1

  echo "== $(date -u +%T) summary"
  grep -E '^(nproc|cpu):' "$OUT/machine.txt"
  grep -A2 -- '--- torch' "$OUT/machine.txt" | tail -2
  grep -A1 -- '--- import vllm' "$OUT/machine.txt" | tail -1
  [ -f "$OUT/relay.md" ] && grep -E '^\| [0-9]+ \|' "$OUT/relay.md"
  [ -f "$OUT/overload.md" ] && grep -E '^- ' "$OUT/overload.md"
}

main 2>&1 | tee "$OUT/log"
