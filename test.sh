#!/usr/bin/env bash
# The test command: installs everything the tests need (Python packages into the venv, Debian
# tools with apt-get when missing), then runs pytest on the chosen tiers.
#   ./test.sh                 every tier: unit app static engine container vllm018
#   ./test.sh unit app        only these tiers (fast: no vLLM, no podman)
#   ./test.sh vllm018         the engine contract against vLLM 0.18.0, the Ascend image's version
#                             (its own venv, tests/vllm018/install.sh: ~8 GB, ~3 min when new)
#   PALMYRA_LONG=1 ./test.sh  also the long variants (soak, longer fuzzing)
# Extra pytest arguments go after `--` (to every pytest run):  ./test.sh unit -- -k settings -x
# Up to four pytest runs, one after the other: the tiers that start no engine (unit, static, app)
# on PALMYRA_TEST_WORKERS parallel workers (default 3; 0 runs them in this process), then the
# container tier alone, then the engine tier alone, then the engine contract (tests marked
# engine_contract) once more against vLLM 0.18.0 (PALMYRA_TEST_ENGINE=vllm018). Each writes a JUnit file into
# PALMYRA_TEST_REPORTS (default .test-reports/); the closing report (tests/helpers/suite_report.py)
# sums them per tier against its budgets and ends with one line counting every run's tests.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${PALMYRA_VENV:-.venv}
ALL_TIERS=(unit app static engine container vllm018)

tiers=(); pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; pytest_args=("$@"); break ;;
    unit|app|static|engine|container|vllm018) tiers+=("$1") ;;
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
    if [[ $bin == /* ]]; then [ -e "$bin" ] || missing+=("$pkg")  # a library: its file
    else command -v "$bin" >/dev/null 2>&1 || missing+=("$pkg"); fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Debian tools, each only when missing.
debs=(curl:curl)
has static && debs+=(prometheus:promtool prometheus-alertmanager:amtool)  # amtool checks the Alertmanager config
has app && debs+=(haproxy:haproxy prometheus:prometheus redis-server:redis-server prometheus-alertmanager:prometheus-alertmanager)  # the rollout simulation; the autoscaler query and the alerts on a live Prometheus; quotas shared through Redis; alerts delivered by Alertmanager
has engine && debs+=(prometheus:prometheus)
has container && debs+=(podman:podman runc:runc debootstrap:debootstrap catatonit:catatonit)
# vLLM 0.18's CPU engine refuses to start without tcmalloc preloaded (tests/helpers/engine_under_test.py).
has vllm018 && debs+=(libtcmalloc-minimal4:/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 prometheus:prometheus)
apt_install "${debs[@]}"

# The container tier's images build in the background (PALMYRA_TEST_PREBUILD=0: not) from here
# on, while the venv installs and then the tiers that start no engine run: the build keeps about
# one core busy (pip in the image, podman's layer commits), the venv install mostly the network,
# those tiers' tests mostly wait on sockets and timers. The tier's fixture builds the images again,
# from podman's layer cache, in seconds. The build script needs only the standard library, so the
# system's python3 runs it before the venv exists.
REPORTS=${PALMYRA_TEST_REPORTS:-.test-reports}
rm -rf "$REPORTS"; mkdir -p "$REPORTS"
build_pid=
if has container && [ "${PALMYRA_TEST_PREBUILD:-1}" = 1 ]; then
  log "building the container images in the background (log: $REPORTS/prebuild.log)"
  # A session of its own, so that nothing of it outlives this script if the script stops early.
  setsid python3 -m tests.helpers.prebuild "$REPORTS/prebuild" >"$REPORTS/prebuild.log" 2>&1 &
  build_pid=$!
  trap 'kill -- "-$build_pid" 2>/dev/null || true' EXIT
fi

# Python: the engine tiers need the CPU engine; the others only the light sidecar install. No
# byte-compiling at install when Python may write the bytecode it compiles on first import (the
# tests import a fraction of the 24,000 files): with PYTHONDONTWRITEBYTECODE set it never would,
# every engine process would compile vLLM's imports again (measured: the engine tier 175 s
# slower), so pip compiles then.
if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  export PALMYRA_PIP_ARGS=${PALMYRA_PIP_ARGS:---no-compile}
fi
if has engine || has container || has vllm018; then
  PALMYRA_EXTRAS=engine-cpu,model,tools,test ./bootstrap.sh install
else
  PALMYRA_EXTRAS=${PALMYRA_TEST_EXTRAS:-engine-cpu,model,tools,test} ./bootstrap.sh install
fi
"$VENV/bin/pip" install --disable-pip-version-check -q -r tests/requirements-tools.txt

export PATH="$PWD/$VENV/bin:$PATH"
WORKERS=${PALMYRA_TEST_WORKERS:-3}

failed=0
# One pytest run over the given tiers (those of them chosen); its exit status 5 ("no tests
# collected", e.g. after -k) is not a failure of this run alone: the closing report counts.
run_pytest() {
  local name=$1 workers=$2; shift 2
  local chosen=() t
  for t in "$@"; do has "$t" && chosen+=("$t"); done
  [ ${#chosen[@]} -gt 0 ] || return 0
  local marker=${chosen[0]} i
  for ((i = 1; i < ${#chosen[@]}; i++)); do marker="$marker or ${chosen[i]}"; done
  run_marked "$name" "$workers" "$marker"
}
run_marked() {
  local name=$1 workers=$2 marker=$3
  local xdist=()
  # loadfile: a module's tests share its fixtures on one worker; in collection order, which puts
  # the longest modules first (tests/conftest.py), not xdist's order by number of tests.
  [ "$workers" -gt 0 ] && xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder)
  log "pytest -m '$marker' ${xdist[*]}"
  local t0=$SECONDS rc=0
  "$VENV/bin/python" -m pytest -m "$marker" "${xdist[@]}" --junitxml="$REPORTS/$name.xml" "${pytest_args[@]}" || rc=$?
  log "$name: pytest exited $rc after $((SECONDS - t0)) s"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then failed=1; fi
}

set +e
# The tiers that start no engine: parallel workers overlap their waits. The container and engine
# tiers then run one after the other, each alone: each starts engines (vLLM, in containers or
# not) that take both cores while they start, and two at once would starve each other's checks.
run_pytest light "$WORKERS" unit static app
if [ -n "$build_pid" ]; then
  t0=$SECONDS
  wait "$build_pid"; rc=$?
  log "background image build exited $rc ($((SECONDS - t0)) s waited for it); a failure shows again in the container tier"
fi
# vLLM 0.18.0's venv installs (network and disk, little CPU) while the container tier runs.
v018_pid=
if has vllm018; then
  log "installing vLLM 0.18.0's venv in the background (log: $REPORTS/vllm018-install.log)"
  setsid tests/vllm018/install.sh >"$REPORTS/vllm018-install.log" 2>&1 &
  v018_pid=$!
  trap 'kill -- "-$v018_pid" 2>/dev/null || true; [ -n "$build_pid" ] && kill -- "-$build_pid" 2>/dev/null || true' EXIT
fi
run_pytest container 0 container
run_pytest engine 0 engine
if [ -n "$v018_pid" ]; then
  # Once more in the foreground when the background install failed (a dropped download is the
  # usual cause; the stamp makes a finished install a no-op); the log's tail says why otherwise.
  if wait "$v018_pid" || {
    log "vLLM 0.18.0's venv did not install; once more"
    tests/vllm018/install.sh >>"$REPORTS/vllm018-install.log" 2>&1
  }; then
    PALMYRA_TEST_ENGINE=vllm018 run_marked vllm018 0 engine_contract
  else
    log "vLLM 0.18.0's venv did not install: $REPORTS/vllm018-install.log ends with:"
    tail -n 25 "$REPORTS/vllm018-install.log" | sed 's/^/[vllm018-install] /' >&2
    failed=1
  fi
fi
set -e

"$VENV/bin/python" -m tests.helpers.suite_report "$REPORTS" || failed=1
exit $failed
