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
out_tmp=""
cleanup() { rm -rf "$work"; [ -z "$out_tmp" ] || rm -f "$out_tmp"; }
trap cleanup EXIT

# Fixed, sorted, root-owned tar of a directory's listed entries.
det_tar() { # DIR OUT ENTRY...
    local dir=$1 out=$2
    shift 2
    find "$dir" -exec touch -h -d "@$epoch" {} +
    tar -C "$dir" --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
        --format=gnu -cf "$out" "$@"
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

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

layout="$work/layout"
mkdir -p "$layout/blobs/sha256"
det_tar "$rootfs" "$work/layer.tar" bin etc home root tmp
diff_id=$(sha "$work/layer.tar")
gzip -n -9 <"$work/layer.tar" >"$work/layer.tar.gz"
layer_digest=$(sha "$work/layer.tar.gz")
layer_size=$(size "$work/layer.tar.gz")
mv "$work/layer.tar.gz" "$layout/blobs/sha256/$layer_digest"

# ---- image config ----
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
bb_version=$("$BUSYBOX" 2>/dev/null | head -n 1 | sed -n 's/^BusyBox \(v[^ ]*\).*/\1/p' || true)
jq -cn --arg created "$created" --arg diff "sha256:$diff_id" --arg ver "${bb_version:-unknown}" '{
  created: $created,
  architecture: "amd64",
  os: "linux",
  config: {
    Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    Cmd: ["sh"]
  },
  rootfs: { type: "layers", diff_ids: [$diff] },
  history: [ { created: $created, created_by: ("busybox-image.sh: Debian busybox-static " + $ver) } ]
}' >"$work/config.json"
config_digest=$(sha "$work/config.json")
config_size=$(size "$work/config.json")
mv "$work/config.json" "$layout/blobs/sha256/$config_digest"

# ---- manifest ----
jq -cn --arg cd "sha256:$config_digest" --argjson cs "$config_size" \
    --arg ld "sha256:$layer_digest" --argjson ls "$layer_size" '{
  schemaVersion: 2,
  mediaType: "application/vnd.oci.image.manifest.v1+json",
  config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs },
  layers: [ { mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $ld, size: $ls } ]
}' >"$work/manifest.json"
manifest_digest=$(sha "$work/manifest.json")
manifest_size=$(size "$work/manifest.json")
mv "$work/manifest.json" "$layout/blobs/sha256/$manifest_digest"

# ---- index + layout marker ----
tag=${IMAGE_NAME##*:}
case "$tag" in */*) tag=latest ;; esac
jq -cn --arg md "sha256:$manifest_digest" --argjson ms "$manifest_size" \
    --arg name "$IMAGE_NAME" --arg tag "$tag" '{
  schemaVersion: 2,
  mediaType: "application/vnd.oci.image.index.v1+json",
  manifests: [ {
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    digest: $md, size: $ms,
    annotations: { "io.containerd.image.name": $name, "org.opencontainers.image.ref.name": $tag },
    platform: { architecture: "amd64", os: "linux" }
  } ]
}' >"$layout/index.json"
printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
chmod 0644 "$layout/index.json" "$layout/oci-layout" "$layout"/blobs/sha256/*
chmod 0755 "$layout" "$layout/blobs" "$layout/blobs/sha256"

out_dir=$(dirname -- "$output")
mkdir -p "$out_dir"
out_tmp=$(mktemp "$out_dir/.$(basename -- "$output").XXXXXX")
det_tar "$layout" "$out_tmp" oci-layout index.json blobs
chmod 0644 "$out_tmp"
mv -f "$out_tmp" "$output"
out_tmp=""
echo "$prog: wrote $output: $IMAGE_NAME manifest sha256:$manifest_digest ($n applets, layer diff_id sha256:$diff_id)" >&2
