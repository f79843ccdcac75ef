#!/bin/sh
# Creates the runtime user NAME with uid UID and primary group gid GID (default: UID) and a home,
# with an /etc/passwd entry.
# Ascend device nodes belong to HwHiAiUser (mode 0660) with whatever uid/gid the node's driver
# install gave it (1000 is common, not fixed): the engine must run as exactly those ids, and CANN
# tools look the user up by name, so a bare numeric USER is not enough.
# Some bases already own the ids (Ubuntu 24.04 ships `ubuntu` as 1000; CANN images may ship
# HwHiAiUser): an existing user of that name is kept and moved to the ids, any other holder of
# the uid or gid is removed.
#   add-runtime-user.sh NAME UID [GID]
set -eu
name=$1
uid=$2
gid=${3:-$2}

holder=$(getent passwd "$uid" | cut -d: -f1 || true)
if [ -n "$holder" ] && [ "$holder" != "$name" ]; then
  userdel "$holder"
fi
group=$(getent group "$gid" | cut -d: -f1 || true)
if [ -n "$group" ] && [ "$group" != "$name" ]; then
  groupdel "$group"
fi
if getent group "$name" >/dev/null; then
  groupmod --gid "$gid" "$name"
else
  groupadd --gid "$gid" "$name"
fi
if getent passwd "$name" >/dev/null; then
  usermod --uid "$uid" --gid "$gid" "$name"
else
  useradd --uid "$uid" --gid "$gid" --create-home --home-dir "/home/$name" --shell /bin/bash "$name"
fi

# Fail the build, not the first start on a real NPU, when the ids came out wrong.
[ "$(id -u "$name")" = "$uid" ] && [ "$(id -g "$name")" = "$gid" ] || {
  echo "add-runtime-user: $name is $(id "$name"), want uid=$uid gid=$gid" >&2
  exit 1
}
