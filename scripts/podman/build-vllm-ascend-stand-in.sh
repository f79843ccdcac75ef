#!/usr/bin/env bash
# Builds localhost/palmyra-stand-in/vllm-ascend:v0.18.0, a LOCAL STAND-IN for vllm-ascend's
# published v0.18.0 image with the CANN file layout (see vllm-ascend-stand-in.Containerfile), on
# the local Python base from build-local-bases.sh. Only for rehearsing the engine-ascend layer here:
#   scripts/podman/build-vllm-ascend-stand-in.sh "pydantic==X huggingface-hub==Y modelscope==Z"
# The packages are the versions upstream's set resolves to (tests pass them in).
# Env: PALMYRA_CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt), PALMYRA_WHEELS_DIR.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 'PACKAGE==VERSION ...'" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
image=${PALMYRA_STAND_IN_IMAGE:-localhost/palmyra-stand-in/vllm-ascend:v0.18.0}
args=(--format docker --network host -t "$image" -f "$here/vllm-ascend-stand-in.Containerfile"
      --build-arg "PYTHON_BASE=${PALMYRA_PYTHON_BASE:-localhost/python:3.11-bookworm}"
      --build-arg "STAND_IN_PACKAGES=$1")
ca=${PALMYRA_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ -s "$ca" ] && args+=(--secret "id=ca,src=$ca")
wheels=${PALMYRA_WHEELS_DIR:-/opt/wheels}
[ -d "$wheels" ] && args+=(--volume "$wheels:/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels)
echo "[stand-in] podman build ${args[*]} $here" >&2
exec podman build "${args[@]}" "$here"
