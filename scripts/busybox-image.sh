#!/usr/bin/env bash
# Builds an OCI image archive of busybox from Debian's busybox-static, with no registry:
#
#   scripts/busybox-image.sh OUTPUT.tar
#
# The archive is an OCI image layout (oci-layout, index.json, blobs/sha256/...) that
# `ctr images import OUTPUT.tar` names docker.io/library/busybox:latest (annotation
# io.containerd.image.name; org.opencontainers.image.ref.name=latest for other tools).
# One gzip'd layer: /bin/busybox + a symlink per applet in /bin, /etc/passwd, /etc/group,
# /tmp (1777), /root, /home. Deterministic: same busybox binary -> same bytes and digests.
# Env: BUSYBOX (default /bin/busybox), IMAGE_NAME (default docker.io/library/busybox:latest),
#      SOURCE_DATE_EPOCH (mtime of every file, default 0). Nothing is written in the repo.
set -euo pipefail

prog=busybox-image
. "$(dirname -- "$(realpath -- "$0")")/oci-archive.sh"
die() { echo "$prog: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 OUTPUT.tar"
output=$1
BUSYBOX=${BUSYBOX:-/bin/busybox}
IMAGE_NAME=${IMAGE_NAME:-docker.io/library/busybox:latest}
epoch=${SOURCE_DATE_EPOCH:-0}

[ -x "$BUSYBOX" ] || die "$BUSYBOX not found (apt-get install busybox-static)"
for tool in tar gzip sha256sum jq; do
    command -v "$tool" >/dev/null || die "'$tool' not found in PATH"
done
phdrs=$(LC_ALL=C readelf -lW "$BUSYBOX" 2>/dev/null || true)
if grep -q INTERP <<<"$phdrs"; then
    die "$BUSYBOX is dynamically linked; the image has no libc (use busybox-static's /bin/busybox)"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/busybox-image.XXXXXX")
trap 'rm -rf "$work"' EXIT


# ---- the root filesystem layer ----
rootfs="$work/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp" "$rootfs/root" "$rootfs/home"
chmod 0755 "$rootfs" "$rootfs/bin" "$rootfs/etc" "$rootfs/home"
chmod 0700 "$rootfs/root"
chmod 1777 "$rootfs/tmp"
install -m 0755 "$BUSYBOX" "$rootfs/bin/busybox"
applets=$("$BUSYBOX" --list) || die "'$BUSYBOX --list' failed"
n=0
while IFS= read -r a; do
    case "$a" in "" | busybox | */*) continue ;; esac
    ln -s busybox "$rootfs/bin/$a"
    n=$((n + 1))
done <<<"$applets"
[ "$n" -gt 100 ] || die "'$BUSYBOX --list' gave only $n applets"
printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/home:/bin/false' >"$rootfs/etc/passwd"
printf '%s\n' 'root:x:0:' 'nobody:x:65534:' >"$rootfs/etc/group"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"

bb_version=$("$BUSYBOX" 2>/dev/null | head -n 1 | sed -n 's/^BusyBox \(v[^ ]*\).*/\1/p' || true)
export SOURCE_DATE_EPOCH=$epoch
oci_archive "$rootfs" "$output" "$IMAGE_NAME" \
    '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["sh"]}' \
    "busybox-image.sh: Debian busybox-static ${bb_version:-unknown}" bin etc home root tmp
echo "$prog: wrote $output: $IMAGE_NAME manifest $OCI_MANIFEST_DIGEST ($n applets, layer diff_id $OCI_DIFF_ID)" >&2
