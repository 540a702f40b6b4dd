#!/usr/bin/env bash
# Boots the guest kernel with the "floor" initrd (guest/build-floor-initrd.sh) under
# QEMU microvm and prints the wall time from QEMU's start to its exit, in ms: the bare
# boot time of our kernel, against which "agent ready" is measured.
#
#   scripts/boot-floor.sh VMLINUX INITRD [ACCEL]      (ACCEL: tcg (default) | kvm)
#
# stdout: one line "floor-boot-ms: N". The guest's serial output goes to stderr when
# FLOOR_VERBOSE=1, and is printed anyway if the boot fails.
# Env: QEMU (default qemu-system-x86_64), FLOOR_TIMEOUT (s, default 60), FLOOR_CPU,
#      FLOOR_MACHINE_OPTS (extra -M microvm options, default below), FLOOR_APPEND (extra cmdline).
set -euo pipefail

prog=boot-floor
die() { echo "$prog: $*" >&2; exit 1; }

[ $# -ge 2 ] && [ $# -le 3 ] || die "usage: $0 VMLINUX INITRD [tcg|kvm]"
vmlinux=$1
initrd=$2
accel=${3:-tcg}
QEMU=${QEMU:-qemu-system-x86_64}
timeout_s=${FLOOR_TIMEOUT:-60}
marker='floor-init: up'

[ -f "$vmlinux" ] || die "kernel '$vmlinux' not found (build it with guest/build-kernel.sh)"
[ -f "$initrd" ] || die "initrd '$initrd' not found (build it with guest/build-floor-initrd.sh)"
command -v "$QEMU" >/dev/null || die "'$QEMU' not found (scripts/setup-host.sh installs QEMU 10 from bookworm-backports)"
# -cpu max under TCG; under KVM "max" sets MSRs a nested KVM may refuse (QEMU aborts with
# "failed to set MSR 0x10a"), so KVM gets -cpu host. FLOOR_CPU overrides.
tcg_params=""
case "$accel" in
tcg)
    # The runtime's TCG CPU (cmdline.rs, TCG_CPU): "max" without the fast-string hints.
    cpu=${FLOOR_CPU:-max,erms=off,fsrm=off,fzrm=off,fsrs=off,fsrc=off}
    # As the runtime boots under TCG (hypervisor/src/qemu/cmdline.rs, TCG_KERNEL_PARAMS),
    # with the host TSC frequency the runtime measured for this boot, if it did
    # (hypervisor/src/accel/tsc.rs: "<boot id> <kHz>").
    tcg_params="virtiofs.clear_reply_pages=1 nolapic_timer keep_initmem"
    tsc_cache=/run/kata-containers/tsc-khz
    if [ -r "$tsc_cache" ] && read -r tsc_boot tsc_khz <"$tsc_cache" &&
        [ "$tsc_boot" = "$(cat /proc/sys/kernel/random/boot_id)" ]; then
        tcg_params="$tcg_params tsc_early_khz=$tsc_khz tsc=reliable"
    fi
    ;;
kvm)
    [ -r /dev/kvm ] && [ -w /dev/kvm ] || die "accel kvm asked for but /dev/kvm is not usable"
    cpu=${FLOOR_CPU:-host}
    ;;
*) die "unknown accelerator '$accel' (tcg or kvm)" ;;
esac

# microvm, as the runtime's QEMU backend runs it: no ACPI (so QEMU appends the
# virtio_mmio.device= entries itself), no option ROMs (the kernel is loaded directly
# through its PVH note), the ISA serial port for ttyS0. The legacy PIT/PIC/RTC stay at their
# defaults. Measured with QEMU 10/TCG and our kernel: pit=off panics ("IO-APIC + timer
# doesn't work"), pit=off,pic=off hangs, rtc=off adds about 1 s, pic=off changes nothing.
machine_opts=${FLOOR_MACHINE_OPTS:-x-option-roms=off,isa-serial=on}
cmdline="console=ttyS0 reboot=t panic=-1 quiet${tcg_params:+ $tcg_params}${FLOOR_APPEND:+ $FLOOR_APPEND}"

log=$(mktemp "${TMPDIR:-/tmp}/boot-floor.XXXXXX")
trap 'rm -f "$log"' EXIT

start=$(date +%s%N)
set +e
timeout --kill-after=5 "$timeout_s" "$QEMU" \
    -M "microvm,acpi=off,$machine_opts" -accel "$accel${tcg_params:+,tb-size=64}" \
    -cpu "$cpu" -m 256M \
    -object memory-backend-memfd,id=mem,size=256M,share=on -machine memory-backend=mem \
    -nodefaults -no-user-config -nographic -no-reboot \
    -kernel "$vmlinux" -initrd "$initrd" \
    -append "$cmdline" \
    -serial stdio </dev/null >"$log" 2>&1
rc=$?
set -e
end=$(date +%s%N)
ms=$(((end - start) / 1000000))

[ "${FLOOR_VERBOSE:-0}" = 1 ] && tr -d '\r' <"$log" >&2
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    tail -n 40 "$log" | tr -d '\r' >&2
    die "QEMU did not exit within ${timeout_s}s (guest output above)"
fi
if [ $rc -ne 0 ]; then
    tail -n 40 "$log" | tr -d '\r' >&2
    die "QEMU exited with status $rc (output above)"
fi
if ! grep -q "$marker" "$log"; then
    tail -n 40 "$log" | tr -d '\r' >&2
    die "QEMU exited but the guest never printed '$marker' (output above)"
fi
echo "floor-boot-ms: $ms"
