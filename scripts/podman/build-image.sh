#!/usr/bin/env bash
# Builds one Dockerfile target with podman on this kind of machine (no registry, local bases,
# local wheel folder and file:// indexes, TLS through a local CA bundle):
#   scripts/podman/build-image.sh TARGET TAG [PODMAN_BUILD_ARGS...]   e.g. engine-cpu localhost/palmyra-serve-engine:cpu
#   (further arguments go to podman build as they are, e.g. --build-arg VLLM_ASCEND_BASE=...)
# What it adds to `podman build`, each only when present on the host:
#   --secret id=ca           the CA bundle (PALMYRA_CA_BUNDLE, default /etc/ssl/certs/ca-certificates.crt)
#   --volume WHEELS:/wheels  pip's local wheel folder (PALMYRA_WHEELS_DIR, default /opt/wheels) + PIP_FIND_LINKS
#   --volume DIR:DIR:ro      every file:// extra index of the host's pip config + PIP_EXTRA_INDEX_URL
# Base images default to the local ones from build-local-bases.sh (PALMYRA_PYTHON_BASE overrides).
# Pip's cache persists between builds through the Dockerfile's cache mounts.
# Run it under `flock /tmp/palmyra-engine.lock` on a shared machine: builds are heavy.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 TARGET TAG [PODMAN_BUILD_ARGS...]" >&2; exit 2; }
target=$1 tag=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}

args=(--target "$target" -t "$tag" --format docker --network host
      --build-arg "PYTHON_BASE=${PALMYRA_PYTHON_BASE:-localhost/python:3.11-bookworm}"
      --build-arg "TORCH_CPU_INDEX_URL=${PALMYRA_TORCH_CPU_INDEX_URL:-}"
      --build-arg "REVISION=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)")

ca=${PALMYRA_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ -s "$ca" ] && args+=(--secret "id=ca,src=$ca")

wheels=${PALMYRA_WHEELS_DIR:-/opt/wheels}
if [ -d "$wheels" ]; then
  args+=(--volume "$wheels:/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels)
fi

extra=()
for url in $(pip config get global.extra-index-url 2>/dev/null || true); do
  case "$url" in
    file://*) dir=${url#file://}; dir=${dir%/simple}; dir=${dir%/}
              [ -d "$dir" ] && { args+=(--volume "$dir:$dir:ro"); extra+=("$url"); } ;;
    *) extra+=("$url") ;;
  esac
done
[ ${#extra[@]} -gt 0 ] && args+=(--build-arg "PIP_EXTRA_INDEX_URL=${extra[*]}")

args+=("$@")
echo "[build] podman build ${args[*]} $repo" >&2
exec podman build "${args[@]}" "$repo"
