#!/usr/bin/env bash
# Packs a statically linked guest init (the kata-agent) into an uncompressed newc cpio
# initrd. Uncompressed on purpose: the file is ~2.6 MB instead of ~1.1 MB, but the guest
# kernel unpacks it in ~35 ms instead of ~185 ms under TCG (inflate is all guest CPU).
#
#   guest/build-initrd.sh AGENT_BINARY OUTPUT.img [BUSYBOX]
#
# Contents: /init (the binary, 0755), the empty directories the agent mounts on
# (/proc /sys /dev /run /tmp /etc /sys/fs/cgroup) and the device nodes /dev/console (5,1)
# and /dev/null (1,3), all owned by 0:0, names sorted, mtimes fixed (SOURCE_DATE_EPOCH,
# default 0), so the same binary gives the same bytes. Must run as root (mknod).
#
# With BUSYBOX (a static busybox, e.g. Debian's busybox-static /bin/busybox; `make initrd`
# passes it), also /bin/busybox and /bin/sh -> busybox: the shell of the agent's debug
# console (`kata-runtime exec`, off unless [agent.kata] debug_console_enabled = true).
# It costs ~2 MB of initrd and ~25 ms of unpacking per boot under TCG; a guest whose
# console is off deletes it at boot, so it holds no shell and no RAM for it.
# Idempotent: the output is replaced atomically; nothing is written in the repository.
set -euo pipefail

prog=build-initrd
die() { echo "$prog: $*" >&2; exit 1; }

[ $# -eq 2 ] || [ $# -eq 3 ] || die "usage: $0 AGENT_BINARY OUTPUT.img [BUSYBOX]"
agent=$1
output=$2
busybox=${3:-}

for tool in readelf cpio mknod; do
    command -v "$tool" >/dev/null || die "'$tool' not found in PATH"
done
[ "$(id -u)" = 0 ] || die "must run as root (creates device nodes /dev/console and /dev/null)"

# --- the binaries must be static x86-64 ELF executables (no interpreter, no DT_NEEDED) ---
check_static() {
    local bin=$1 what=$2
    [ -f "$bin" ] || die "$what '$bin' does not exist or is not a regular file"
    [ -r "$bin" ] || die "$what '$bin' is not readable"
    local magic hdr phdrs interp dyn libs
    magic=$(head -c 4 "$bin" | od -An -c | tr -d ' ')
    [ "$magic" = '177ELF' ] || die "'$bin' is not an ELF file"
    hdr=$(LC_ALL=C readelf -h "$bin" 2>/dev/null) || die "readelf cannot read '$bin'"
    grep -qE 'Type:[[:space:]]+(EXEC|DYN)' <<<"$hdr" || die "'$bin' is not an executable ELF file"
    grep -q 'Advanced Micro Devices X86-64' <<<"$hdr" || die "'$bin' is not an x86-64 binary"
    # (captured first: with pipefail, `readelf | grep -q` could fail on SIGPIPE)
    phdrs=$(LC_ALL=C readelf -lW "$bin" 2>/dev/null) || die "readelf cannot read the program headers of '$bin'"
    if grep -q 'INTERP' <<<"$phdrs"; then
        interp=$(sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p' <<<"$phdrs")
        die "'$bin' is dynamically linked (interpreter ${interp:-?}); the guest has no libc.
  $3"
    fi
    dyn=$(LC_ALL=C readelf -dW "$bin" 2>/dev/null || true)
    if grep -q '(NEEDED)' <<<"$dyn"; then
        libs=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dyn" | tr '\n' ' ')
        die "'$bin' needs shared libraries ($libs); $3"
    fi
}
check_static "$agent" "agent binary" \
    "Build it statically, e.g. RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target x86_64-unknown-linux-gnu"
if [ -n "$busybox" ]; then
    check_static "$busybox" "busybox" \
        "Use a static busybox: Debian's busybox-static package (apt-get install busybox-static) installs /bin/busybox"
fi

# --- staging directory (caller's TMPDIR), removed on exit ---
stage=$(mktemp -d "${TMPDIR:-/tmp}/kata-initrd.XXXXXX")
out_tmp=""
cleanup() { rm -rf "$stage"; [ -z "$out_tmp" ] || rm -f "$out_tmp"; }
trap cleanup EXIT

root="$stage/root"
mkdir -p "$root"
for d in proc sys sys/fs sys/fs/cgroup dev run tmp etc; do
    mkdir -p "$root/$d"
    chmod 0755 "$root/$d"
done
chmod 1777 "$root/tmp"
install -m 0755 "$agent" "$root/init"
if [ -n "$busybox" ]; then
    mkdir -p "$root/bin"
    chmod 0755 "$root/bin"
    install -m 0755 "$busybox" "$root/bin/busybox"
    ln -s busybox "$root/bin/sh"
fi
mknod -m 0600 "$root/dev/console" c 5 1
mknod -m 0666 "$root/dev/null" c 1 3

epoch=${SOURCE_DATE_EPOCH:-0}
find "$root" -exec touch -h -d "@$epoch" {} +

out_dir=$(dirname -- "$output")
mkdir -p "$out_dir"
out_tmp=$(mktemp "$out_dir/.$(basename -- "$output").XXXXXX")
(
    cd "$root"
    find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
        cpio --quiet -o -H newc -R 0:0 --reproducible
) >"$out_tmp"
chmod 0644 "$out_tmp"
mv -f "$out_tmp" "$output"
out_tmp=""
echo "$prog: wrote $output ($(stat -c %s "$output") bytes) with /init from $agent${busybox:+ and /bin/sh from $busybox}" >&2
