#!/usr/bin/env bash
# Builds the "floor" initrd: guest/floor-init.c compiled static (gcc -static -Os) as /init,
# packed exactly like the agent initrd (guest/build-initrd.sh). Used by scripts/boot-floor.sh
# to measure the bare boot time of the guest kernel.
#
#   guest/build-floor-initrd.sh OUTPUT.img
#
# The compiled binary is cached under ${KATA_GUEST_CACHE:-/var/cache/kata-guest}/floor-<hash>/
# (hash of the source and of gcc's version), so reruns are instant. Nothing is written in the repo.
set -euo pipefail

prog=build-floor-initrd
die() { echo "$prog: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 OUTPUT.img"
output=$1
here=$(cd "$(dirname "$0")" && pwd)
src="$here/floor-init.c"
[ -f "$src" ] || die "$src missing"
CC=${CC:-gcc}
command -v "$CC" >/dev/null || die "C compiler '$CC' not found (apt-get install build-essential)"

CACHE=${KATA_GUEST_CACHE:-/var/cache/kata-guest}
key=$( (sha256sum "$src" | cut -d' ' -f1; "$CC" --version | head -n 1) | sha256sum | cut -c1-16)
bin="$CACHE/floor-$key/floor-init"
if [ ! -x "$bin" ]; then
    mkdir -p "$CACHE/floor-$key"
    tmp=$(mktemp "$CACHE/floor-$key/.floor-init.XXXXXX")
    trap 'rm -f "$tmp"' EXIT
    "$CC" -static -Os -s -Wall -Werror -o "$tmp" "$src" ||
        die "compiling $src failed (static glibc: apt-get install libc6-dev)"
    chmod 0755 "$tmp"
    mv -f "$tmp" "$bin"
    trap - EXIT
fi
exec "$here/build-initrd.sh" "$bin" "$output"
