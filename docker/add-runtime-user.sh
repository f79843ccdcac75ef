#!/bin/sh
# Creates the runtime user NAME with uid/gid ID and a home, with an /etc/passwd entry.
# Ascend device nodes belong to HwHiAiUser (uid 1000, mode 0660): the engine must run as exactly
# that uid, and CANN tools look the user up by name, so a bare numeric USER is not enough.
# Some bases already own uid 1000 (Ubuntu 24.04 ships `ubuntu`; CANN images may ship
# HwHiAiUser): an existing user of that name is kept and moved to the id, any other holder of the id is removed.
#   add-runtime-user.sh NAME ID
set -eu
name=$1
id=$2

holder=$(getent passwd "$id" | cut -d: -f1 || true)
if [ -n "$holder" ] && [ "$holder" != "$name" ]; then
  userdel "$holder"
fi
group=$(getent group "$id" | cut -d: -f1 || true)
if [ -n "$group" ] && [ "$group" != "$name" ]; then
  groupdel "$group"
fi
if getent group "$name" >/dev/null; then
  groupmod --gid "$id" "$name"
else
  groupadd --gid "$id" "$name"
fi
if getent passwd "$name" >/dev/null; then
  usermod --uid "$id" --gid "$id" "$name"
else
  useradd --uid "$id" --gid "$id" --create-home --home-dir "/home/$name" --shell /bin/bash "$name"
fi

# Fail the build, not the first start on a real NPU, when the ids came out wrong.
[ "$(id -u "$name")" = "$id" ] && [ "$(id -g "$name")" = "$id" ] || {
  echo "add-runtime-user: $name is $(id "$name"), want uid=gid=$id" >&2
  exit 1
}
