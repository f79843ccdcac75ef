#!/usr/bin/env bash
# The test command: installs everything the tests need (Python packages into the venv, Debian
# tools with apt-get when missing), then runs pytest on the chosen tiers.
#   ./test.sh                 every tier: unit app static engine container
#   ./test.sh unit app        only these tiers (fast: no vLLM, no podman)
#   PALMYRA_LONG=1 ./test.sh  also the long variants (soak, longer fuzzing)
# Extra pytest arguments go after `--`:  ./test.sh unit -- -k settings -x
set -euo pipefail
cd "$(dirname "$0")"
VENV=${PALMYRA_VENV:-.venv}
ALL_TIERS=(unit app static engine container)

tiers=(); pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; pytest_args=("$@"); break ;;
    unit|app|static|engine|container) tiers+=("$1") ;;
    *) echo "unknown tier: $1 (one of: ${ALL_TIERS[*]})" >&2; exit 2 ;;
  esac
  shift
done
[ ${#tiers[@]} -gt 0 ] || tiers=("${ALL_TIERS[@]}")
has() { local t; for t in "${tiers[@]}"; do [ "$t" = "$1" ] && return 0; done; return 1; }

log() { printf '[test] %s\n' "$*" >&2; }

apt_install() {
  local missing=() pkg bin
  for pair in "$@"; do
    pkg=${pair%%:*}; bin=${pair#*:}
    command -v "$bin" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Python: the engine tiers need the CPU engine; the others only the light sidecar install.
if has engine || has container; then
  PALMYRA_EXTRAS=engine-cpu,model,tools,test ./bootstrap.sh install
else
  PALMYRA_EXTRAS=${PALMYRA_TEST_EXTRAS:-engine-cpu,model,tools,test} ./bootstrap.sh install
fi
"$VENV/bin/pip" install --disable-pip-version-check -q -r tests/requirements-tools.txt

# Debian tools, each only when missing.
debs=(curl:curl)
has static && debs+=(prometheus:promtool)
has app && debs+=(haproxy:haproxy prometheus:prometheus)  # the rollout simulation; the autoscaler query on a live Prometheus
has engine && debs+=(prometheus:prometheus)
has container && debs+=(podman:podman runc:runc debootstrap:debootstrap catatonit:catatonit)
apt_install "${debs[@]}"

marker=$(IFS=' '; set -- "${tiers[@]}"; out=$1; shift; for t; do out="$out or $t"; done; echo "$out")
log "pytest -m '$marker'"
export PATH="$PWD/$VENV/bin:$PATH"
set +e
"$VENV/bin/python" -m pytest -m "$marker" "${pytest_args[@]}"
rc=$?
set -e
# pytest's 5 means "no tests collected": a tier selection that ran nothing is a failure here too.
exit $rc
