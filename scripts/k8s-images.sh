#!/usr/bin/env bash
# The images the Kubernetes suite (scripts/k8s-suite.sh) needs beyond critest's, added to
# OUT_DIR (written by scripts/critest-images.sh: its busybox image is the base here):
#
#   COREDNS_BIN=... scripts/k8s-images.sh OUT_DIR
#
#   coredns/coredns:v1.14.7   the cluster's DNS (CoreDNS built by scripts/k8s-build.sh),
#                             run by the suite's kube-system Deployment as kubeadm's is
#   kata-k8s/tools:1          e2e-test-images/busybox's files plus usock (scripts/k8s-usock.c,
#                             a unix socket echo: busybox's nc has none) and inotify-watch
#                             (scripts/k8s-inotify.c: busybox-static has no inotifyd)
# Deterministic, like critest-images.sh. Env: COREDNS_BIN (required), COREDNS_VERSION
# (its tag, default v1.14.7), CC, SOURCE_DATE_EPOCH.
set -euo pipefail

prog=k8s-images
here=$(dirname -- "$(realpath -- "$0")")
. "$here/oci-archive.sh"
die() { echo "$prog: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 OUT_DIR"
out=$(realpath -- "$1")
CC=${CC:-gcc}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.7}
[ -x "${COREDNS_BIN:-}" ] || die "COREDNS_BIN (the coredns binary of scripts/k8s-build.sh) is not set or not executable"
[ -f "$out/images.list" ] || die "$out/images.list missing: run scripts/critest-images.sh first"
if LC_ALL=C readelf -lW "$COREDNS_BIN" | grep -q INTERP; then
    die "$COREDNS_BIN is dynamically linked (build it with CGO_ENABLED=0)"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/k8s-images.XXXXXX")
trap 'rm -rf "$work"' EXIT
n=$(ls "$out"/*.tar | wc -l)


# CoreDNS: the binary alone, as upstream's image.
r=$work/coredns
mkdir -p "$r/etc/coredns"
install -m 0755 "$COREDNS_BIN" "$r/coredns"
n=$((n + 1))
file=$out/$n.tar
oci_archive "$r" "$file" "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" \
    '{"Entrypoint":["/coredns"],"ExposedPorts":{"53/tcp":{},"53/udp":{}}}' \
    "k8s-images.sh: CoreDNS $COREDNS_VERSION" coredns etc
echo "coredns/coredns:$COREDNS_VERSION $(basename "$file")" >>"$out/images.list"

# tools: the default busybox image's root filesystem (its one layer) plus usock.
base=$(awk '$1 == "e2e-test-images/busybox:1.29-2" { print $2 }' "$out/images.list")
[ -n "$base" ] || die "no e2e-test-images/busybox:1.29-2 in $out/images.list"
oci_unpack_layer "$out/$base" "$work/tools" "$work/layout"
mkdir -p "$work/tools/usr/local/bin"
"$CC" -static -Os -s -Wall -Wextra -Werror -o "$work/tools/usr/local/bin/usock" "$here/k8s-usock.c" ||
    die "compiling k8s-usock.c failed"
# wget and nslookup of Debian's dynamically linked busybox (the image's /bin/sh), as
# upstream's images have them (busybox 1.35's wget crashes with -T in either build: the
# cases bound it with timeout(1) instead).
for a in wget nslookup; do
    ln -sf /bin/sh "$work/tools/usr/local/bin/$a"
done
"$CC" -static -Os -s -Wall -Wextra -Werror -o "$work/tools/usr/local/bin/inotify-watch" "$here/k8s-inotify.c" ||
    die "compiling k8s-inotify.c failed"
n=$((n + 1))
file=$out/$n.tar
mapfile -t entries < <(ls -A "$work/tools")
oci_archive "$work/tools" "$file" "registry.k8s.io/kata-k8s/tools:1" \
    '{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["sh"]}' \
    "k8s-images.sh: busybox, usock and inotify-watch" "${entries[@]}"
echo "kata-k8s/tools:1 $(basename "$file")" >>"$out/images.list"
echo "$prog: CoreDNS and tools added to $out/images.list" >&2
