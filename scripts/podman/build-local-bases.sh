#!/usr/bin/env bash
# Builds the local base images the Dockerfile's base-image build args point at on a machine
# without a registry:
#   localhost/debian:bookworm        debootstrap --variant=minbase bookworm
#   localhost/python:3.11-bookworm   + Debian's python3 (3.11), python3-venv, pip
# Each is built only when missing (FORCE=1 rebuilds). Needs root, podman, runc, debootstrap.
#   scripts/podman/build-local-bases.sh
# Env: DEBIAN_MIRROR (default: debootstrap's own), FORCE=1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
# debootstrap's own default mirror unless DEBIAN_MIRROR names one.
mirror=${DEBIAN_MIRROR:-}
debian_image=localhost/debian:bookworm
python_image=localhost/python:3.11-bookworm

log() { printf '[bases] %s\n' "$*" >&2; }
have() { [ "${FORCE:-0}" != 1 ] && podman image exists "$1"; }
# The python base is rebuilt when its Containerfile changes (its hash is a label on the image).
recipe_sha=$(sha256sum "$here/python-base.Containerfile" | cut -c1-16)
have_python() {
  have "$1" && [ "$(podman image inspect "$1" --format '{{index .Labels "palmyra.recipe"}}')" = "$recipe_sha" ]
}

for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null || { log "$tool missing (apt-get install podman runc debootstrap)"; exit 1; }
done

if have "$debian_image"; then
  log "$debian_image present"
else
  rootfs=$(mktemp -d /tmp/palmyra-debootstrap.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  log "debootstrap bookworm minbase from ${mirror:-the default mirror of debootstrap} (~30 s)"
  debootstrap --variant=minbase bookworm "$rootfs" ${mirror:+"$mirror"} >/tmp/palmyra-debootstrap.log 2>&1 \
    || { tail -20 /tmp/palmyra-debootstrap.log >&2; exit 1; }
  # Empty the apt lists and caches debootstrap leaves: images start without them.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
  tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$debian_image" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
  log "imported $debian_image"
fi

if have_python "$python_image"; then
  log "$python_image present"
else
  log "building $python_image"
  podman build --network host --format docker \
    --build-arg DEBIAN_BASE="$debian_image" --label "palmyra.recipe=$recipe_sha" \
    -f "$here/python-base.Containerfile" -t "$python_image" "$here"
fi
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E "^localhost/(debian|python):" >&2
