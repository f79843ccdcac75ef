#!/bin/bash
# Entrypoint of the engine images: puts the Ascend CANN environment in effect, prepares the
# writable directories, then execs the command (default `palmyra-serve engine --host 127.0.0.1
# --port 8000`) so it runs as PID 1 and gets the orchestrator's signals directly (the launcher
# forwards them to vLLM).
#
# It replaces the CANN base image's ENTRYPOINT, which sources three scripts before exec "$@"
# (Ascend/cann-container-image, cann/8.5.1-910b-ubuntu22.04-py3.11/Dockerfile): the toolkit's,
# the ascendnpu-ir one (puts bishengir-compile on PATH, which triton-ascend needs) and NNAL/ATB's.
# This one sources the same three, for any user, without a login or interactive shell.
#
# PALMYRA_CANN_ENV: required (Ascend image: a missing script is a misbuild, refuse to start),
#                   auto (default: source what exists; CPU/CUDA images have none), off.
# PALMYRA_ASCEND_ROOT: where CANN lives (default /usr/local/Ascend).
# PALMYRA_CANN_ENV_SCRIPTS: the scripts, relative to that root (default: CANN 8.5.1's three).
# PALMYRA_PRELOAD_JEMALLOC=1 preloads jemalloc, as vllm-ascend's image does in root's .bashrc.
# PALMYRA_WORK_DIR: created (with HOME and the cache directories the environment names) and
#                   made the working directory: CANN writes kernel_meta there, and a fresh
#                   volume (an emptyDir) starts empty.
set -eo pipefail

say() { echo "engine-entrypoint: $*" >&2; }

mode=${PALMYRA_CANN_ENV:-auto}
root=${PALMYRA_ASCEND_ROOT:-/usr/local/Ascend}
scripts=${PALMYRA_CANN_ENV_SCRIPTS:-ascend-toolkit/set_env.sh cann-8.5.1/share/info/ascendnpu-ir/bin/set_env.sh nnal/atb/set_env.sh}

if [ "$mode" != off ]; then
  missing=()
  for script in $scripts; do
    [ -f "$root/$script" ] || missing+=("$root/$script")
  done
  if [ ${#missing[@]} -gt 0 ] && [ "$mode" = required ]; then
    # All or nothing: a partial CANN environment fails later and far less clearly.
    say "CANN environment incomplete (PALMYRA_CANN_ENV=required), missing: ${missing[*]}"
    say "this image is not built on vllm-ascend's (CANN 8.5.1) image, or CANN moved; see docs/ascend-troubleshooting.md"
    exit 1
  fi
  sourced=0
  for script in $scripts; do
    [ -f "$root/$script" ] || continue
    # The vendor scripts reference unset variables and return non-zero on harmless probes:
    # source them without -e so they cannot abort the start.
    set +e
    # shellcheck disable=SC1090
    . "$root/$script"
    set -e
    say "sourced $root/$script"
    sourced=$((sourced + 1))
  done
  if [ "$sourced" -gt 0 ]; then
    # vllm-ascend's image appends /usr/local/lib (Mooncake's libraries) in root's .bashrc.
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/lib"
  fi
fi

if [ "${PALMYRA_PRELOAD_JEMALLOC:-0}" = 1 ]; then
  jemalloc="/usr/lib/$(uname -m)-linux-gnu/libjemalloc.so.2"
  if [ -f "$jemalloc" ]; then
    export LD_PRELOAD="$jemalloc${LD_PRELOAD:+:$LD_PRELOAD}"
  else
    say "$jemalloc not found, not preloading jemalloc"
  fi
fi

if [ -n "${PALMYRA_WORK_DIR:-}" ]; then
  for dir in "$PALMYRA_WORK_DIR" "${HOME:-}" "${VLLM_CACHE_ROOT:-}" "${HF_HOME:-}" "${MODELSCOPE_CACHE:-}" \
             "${TORCHINDUCTOR_CACHE_DIR:-}" "${TRITON_CACHE_DIR:-}" "${NUMBA_CACHE_DIR:-}" \
             "${ASCEND_CACHE_PATH:-}" "${ASCEND_WORK_PATH:-}" "${ASCEND_PROCESS_LOG_PATH:-}"; do
    [ -n "$dir" ] || continue
    mkdir -p "$dir" 2>/dev/null || true
    if [ ! -w "$dir" ]; then
      say "$dir is not writable by uid $(id -u) gid $(id -g): mount a writable volume at /cache (and match the image's HWHIAIUSER_UID/GID to the node's HwHiAiUser)"
      exit 1
    fi
  done
  cd "$PALMYRA_WORK_DIR"
fi

if [ $# -eq 0 ]; then
  say "no command given"
  exit 2
fi
exec "$@"
