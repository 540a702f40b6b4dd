#!/usr/bin/env bash
# README command 1's last step: runs a busybox container in a VM through a private
# containerd, with the installed runtime, and shows that its kernel is the guest's.
set -euo pipefail
dir=${1:?usage: demo.sh DIR IMAGE_TAR}
image_tar=${2:?usage: demo.sh DIR IMAGE_TAR}
here=$(cd "$(dirname "$0")" && pwd)
export PATH=/usr/local/bin:$PATH
cleanup() { bash "$here/containerd-private.sh" stop "$dir" >/dev/null 2>&1 || true; }
trap cleanup EXIT
sock=$(bash "$here/containerd-private.sh" start "$dir")
ctr -a "$sock" images import "$image_tar" >/dev/null
echo "host kernel:  $(uname -r)"
set +e
guest=$(ctr -a "$sock" run --runtime io.containerd.kata.v2 --rm docker.io/library/busybox:latest kata-demo uname -r)
rc=$?
set -e
echo "guest kernel: $guest (ctr exit code $rc)"
[ $rc = 0 ] && [ -n "$guest" ] && [ "$guest" != "$(uname -r)" ]
