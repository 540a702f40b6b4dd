#!/usr/bin/env bash
# Builds the pod sandbox ("pause") image of the CRI end-to-end tests, with no registry:
#
#   scripts/pause-image.sh OUTPUT.tar
#
# Compiles scripts/pause.c statically (gcc -static) and packages it as an OCI image layout
# archive (oci-layout, index.json, blobs/sha256/...) with one gzip'd layer holding /pause
# only, entrypoint ["/pause"]. `ctr -n k8s.io images import OUTPUT.tar` names it IMAGE_NAME;
# the tests give the same name to containerd's CRI as its sandbox image.
# Env: IMAGE_NAME (default localhost/kata-e2e-pause:latest), CC (default gcc),
#      SOURCE_DATE_EPOCH (mtime of every file, default 0). Nothing is written in the repo.
set -euo pipefail

prog=pause-image
. "$(dirname -- "$(realpath -- "$0")")/oci-archive.sh"
die() { echo "$prog: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 OUTPUT.tar"
output=$1
IMAGE_NAME=${IMAGE_NAME:-localhost/kata-e2e-pause:latest}
CC=${CC:-gcc}
epoch=${SOURCE_DATE_EPOCH:-0}
src="$(dirname -- "$(realpath -- "$0")")/pause.c"

[ -f "$src" ] || die "$src not found"
for tool in "$CC" tar gzip sha256sum jq readelf; do
    command -v "$tool" >/dev/null || die "'$tool' not found in PATH (apt-get install build-essential jq)"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/pause-image.XXXXXX")
trap 'rm -rf "$work"' EXIT

rootfs="$work/rootfs"
mkdir -p "$rootfs"
chmod 0755 "$rootfs"
"$CC" -static -Os -s -Wall -Wextra -Werror -o "$rootfs/pause" "$src" ||
    die "compiling $src failed (static glibc comes with libc6-dev)"
if LC_ALL=C readelf -lW "$rootfs/pause" | grep -q INTERP; then
    die "$rootfs/pause is dynamically linked; the image has no libc"
fi
chmod 0755 "$rootfs/pause"

export SOURCE_DATE_EPOCH=$epoch
oci_archive "$rootfs" "$output" "$IMAGE_NAME" '{"Entrypoint":["/pause"]}' \
    "pause-image.sh: scripts/pause.c, gcc -static" pause
echo "$prog: wrote $output: $IMAGE_NAME manifest $OCI_MANIFEST_DIGEST (layer diff_id $OCI_DIFF_ID)" >&2
