#!/usr/bin/env bash
# Builds the guest kernel (vmlinux, ELF with a PVH note) from Debian's linux-source-6.12
# with guest/patches/*.patch applied in order and tinyconfig + guest/kernel.fragment.
# Cached outside the repo by the hash of the fragment, the patches, this script and the
# source tarball's size; prints the path of the cached vmlinux.
#
# The vmlinux VMs boot is stripped of its symbol table (the same loadable segments and
# notes): QEMU's ELF loader reads every symbol of the kernel it loads, sorts them and
# keeps them for its disassembler, ~7 ms of every VM's start and 1.2 MiB of every QEMU's
# heap with our kernel's 36 thousand symbols. The unstripped image stays beside it as
# vmlinux.debug, for reading addresses from a guest's oops.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
SRC_TAR=/usr/src/linux-source-6.12.tar.xz
STRINGOPS="-mstringop-strategy=libcall"
CACHE=${KATA_GUEST_CACHE:-/var/cache/kata-guest}
[ -f "$SRC_TAR" ] || { echo "build-kernel: $SRC_TAR missing; run scripts/setup-host.sh" >&2; exit 1; }

patches=("$here"/patches/*.patch)
key=$( (sha256sum "$here/kernel.fragment" "$here/build-kernel.sh" "${patches[@]}" | cut -d' ' -f1
        stat -c %s "$SRC_TAR") | sha256sum | cut -c1-16)
out="$CACHE/kernel-$key"
if [ -f "$out/vmlinux" ]; then
    echo "$out/vmlinux"
    exit 0
fi
mkdir -p "$CACHE"
work="$CACHE/build-$key"
rm -rf "$work"
mkdir -p "$work"
echo "build-kernel: building guest kernel $key (several minutes)" >&2
tar -xf "$SRC_TAR" -C "$work"
ksrc="$work/linux-source-6.12"
cd "$ksrc"
for p in "${patches[@]}"; do
    patch -s -p1 --forward <"$p" >&2 || { echo "build-kernel: $p does not apply" >&2; exit 1; }
done
make -s tinyconfig >&2
./scripts/kconfig/merge_config.sh -m .config "$here/kernel.fragment" >/dev/null
make -s olddefconfig >&2
# Every fragment option must have survived olddefconfig (a missing dependency drops it).
missing=0
while IFS= read -r line; do
    case "$line" in CONFIG_*=y) grep -qx "$line" .config || { echo "build-kernel: $line did not stick" >&2; missing=1; } ;; esac
done <"$here/kernel.fragment"
[ $missing = 0 ] || { echo "build-kernel: fix guest/kernel.fragment (dependencies above)" >&2; exit 1; }
# -mstringop-strategy=libcall: every memset and memcpy GCC does not do in a few moves
# becomes a call to the kernel's own (which picks the CPU's best method at boot) instead
# of tinyconfig's -Os default, a one-byte `rep stosb`/`rep movsb` in place (1030 of them).
# Real CPUs run those fast, but QEMU's TCG runs each byte as a pass of its own and
# -icount counts each byte as an instruction: they were 16 of the 28 million translated
# blocks run in a sandbox's start (initrd unpacking and freeing, page, object and
# virtio-fs reply zeroing; bench/README.md). It adds 25 KB of kernel text; -O2 would
# avoid them too, with 1.4 MB more text in every VM's memory.
make -s -j"$(nproc)" KCFLAGS="$STRINGOPS" vmlinux >&2
mkdir -p "$out.tmp"
cp vmlinux "$out.tmp/vmlinux.debug"
objcopy --strip-all vmlinux "$out.tmp/vmlinux"
cp .config "$out.tmp/config"
make -s kernelrelease >"$out.tmp/release"
rm -rf "$out"
mv "$out.tmp" "$out"
cd /
rm -rf "$work"
echo "$out/vmlinux"
