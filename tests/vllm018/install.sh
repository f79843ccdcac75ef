#!/usr/bin/env bash
# Builds the venv the vllm018 tier runs vLLM 0.18.0 from (PALMYRA_VLLM018_VENV, default
# .venv-vllm018): the locked set in requirements.txt beside this script, with --no-deps, so no
# resolver runs and nothing moves between runs. Skipped when the venv was built from this very
# lock and script (a stamp, as bootstrap.sh keeps one). About 8 GB and 3 minutes on a new machine
# (the index's torch 2.10.0 brings its CUDA libraries).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${PALMYRA_VLLM018_VENV:-.venv-vllm018}
LOCK=tests/vllm018/requirements.txt
STAMP="$VENV/.palmyra-installed"
want=$(cat "$LOCK" "$0" | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
t0=$SECONDS
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# The set unpacks to about 8.2 GB: say so up front rather than as pip's "No space left on device"
# halfway through a wheel.
need_kb=$((9 * 1024 * 1024))
have_kb=$(df -Pk "$VENV" | awk 'NR == 2 { print $4 }')
if [ ! -f "$STAMP" ] && [ "$have_kb" -lt "$need_kb" ]; then
  echo "[vllm018] $VENV needs about 9 GB free and its filesystem has $((have_kb / 1024 / 1024)) GB" >&2
  exit 1
fi
# Byte-compiled at install where Python would not write the bytecode it compiles on import itself
# (PYTHONDONTWRITEBYTECODE): otherwise every engine process compiled vLLM's imports again.
compile=(--no-compile)
[ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || compile=()
"$VENV/bin/pip" install --disable-pip-version-check -q "${compile[@]}" --no-deps -r "$LOCK"
echo "$want" >"$STAMP"
echo "[vllm018] installed vLLM 0.18.0 into $VENV in $((SECONDS - t0)) s" >&2
