#!/bin/bash
# Entrypoint of the engine images: puts the Ascend CANN environment in effect, then execs the
# command (default `palmyra-serve engine --host 0.0.0.0 --port 8000`) so it runs as PID 1 and gets
# the orchestrator's signals directly (the launcher forwards them to vLLM).
#
# The upstream CANN images source ascend-toolkit/set_env.sh and nnal/atb/set_env.sh only from
# .bashrc, which a non-interactive entrypoint never reads: without this, torch-npu finds no CANN.
#
# PALMYRA_CANN_ENV: required (Ascend image: missing scripts are a fatal misbuild),
#                   auto (default: source what exists; CPU/CUDA images have none), off.
# PALMYRA_ASCEND_ROOT: where CANN lives (default /usr/local/Ascend; tests point it elsewhere).
# PALMYRA_PRELOAD_JEMALLOC=1 preloads jemalloc, as vllm-ascend's own image does.
set -eo pipefail

mode=${PALMYRA_CANN_ENV:-auto}
root=${PALMYRA_ASCEND_ROOT:-/usr/local/Ascend}

if [ "$mode" != off ]; then
  for script in "$root/ascend-toolkit/set_env.sh" "$root/nnal/atb/set_env.sh"; do
    if [ -f "$script" ]; then
      # The vendor scripts reference unset variables and return non-zero on harmless probes:
      # source them without -e/-u so they cannot abort the start.
      set +e
      # shellcheck disable=SC1090
      . "$script"
      set -e
    elif [ "$mode" = required ]; then
      echo "engine-entrypoint: $script missing (PALMYRA_CANN_ENV=required)" >&2
      exit 1
    fi
  done
fi

if [ "${PALMYRA_PRELOAD_JEMALLOC:-0}" = 1 ]; then
  jemalloc="/usr/lib/$(uname -m)-linux-gnu/libjemalloc.so.2"
  if [ -f "$jemalloc" ]; then
    export LD_PRELOAD="$jemalloc${LD_PRELOAD:+:$LD_PRELOAD}"
  else
    echo "engine-entrypoint: $jemalloc not found, not preloading jemalloc" >&2
  fi
fi

if [ $# -eq 0 ]; then
  echo "engine-entrypoint: no command given" >&2
  exit 2
fi
exec "$@"
