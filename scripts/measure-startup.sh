#!/usr/bin/env bash
# Median wall time of `ctr run --rm IMAGE x echo hi` with our runtime and with runc,
# alternating A/B in one run, and of a bare boot of the guest kernel with a trivial init
# under the same QEMU accelerator (the floor). A first measurement, not yet `make bench`.
#   scripts/measure-startup.sh [RUNS]      (needs `make install image` first)
set -euo pipefail
runs=${1:-5}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/kata-measure.XXXXXX)
cleanup() { bash "$here/containerd-private.sh" stop "$dir/ctrd" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
sock=$(bash "$here/containerd-private.sh" start "$dir/ctrd")
ctr -a "$sock" images import "${IMAGE_TAR:-/var/cache/kata-guest/busybox-image.tar}" >/dev/null
ms() { local s e; s=$(date +%s%N); "$@" >/dev/null; e=$(date +%s%N); echo $(((e - s) / 1000000)); }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
floor_initrd="$dir/floor.img"
bash "$here/../guest/build-floor-initrd.sh" "$floor_initrd" >/dev/null
kernel=$(bash "$here/../guest/build-kernel.sh")
for i in $(seq "$runs"); do
    ms ctr -a "$sock" run --fifo-dir "$dir/fifo" --runtime io.containerd.kata.v2 --rm docker.io/library/busybox:latest "k$i" echo hi >>"$dir/kata"
    ms ctr -a "$sock" run --fifo-dir "$dir/fifo" --runtime io.containerd.runc.v2 --rm docker.io/library/busybox:latest "r$i" echo hi >>"$dir/runc"
    bash "$here/boot-floor.sh" "$kernel" "$floor_initrd" tcg 2>/dev/null | grep -o '[0-9]*' | tail -1 >>"$dir/floor"
done
printf 'runs: %s (median, min-max, ms)\n' "$runs"
for f in kata runc floor; do
    printf '%-6s %6s   %s-%s\n' "$f" "$(median <"$dir/$f")" "$(sort -n "$dir/$f" | head -1)" "$(sort -n "$dir/$f" | tail -1)"
done
