#!/usr/bin/env bash
# Boots the guest kernel with the "floor" initrd (guest/build-floor-initrd.sh) under
# QEMU microvm and prints the wall time from QEMU's start to its exit, in ms: the bare
# boot time of our kernel, against which "agent ready" is measured.
#
#   scripts/boot-floor.sh VMLINUX INITRD [ACCEL]      (ACCEL: tcg (default) | kvm)
#
# stdout: one line "floor-boot-ms: N". The guest's serial output goes to stderr when
# FLOOR_VERBOSE=1, and is printed anyway if the boot fails.
#
# With FLOOR_HOLD=S the guest stays up idle once booted, handing back the memory it frees
# as the runtime's guests do (below): the memory floor. The script prints
# "floor-boot-ms: N" (QEMU's start to the init's line) and "floor-qemu-pid: PID" as soon
# as init is up, keeps QEMU running for S seconds, then kills it and exits 0. Killing
# the script (TERM, INT, or its process group) ends QEMU too.
#
# Env: QEMU (default qemu-system-x86_64), FLOOR_TIMEOUT (s, default 60), FLOOR_CPU,
#      FLOOR_MEMORY (guest MiB, default 512: the runtime's default_memory; pass the
#      configured value, so the floor's VM is the sandboxes' size),
#      FLOOR_MACHINE_OPTS (extra -M microvm options, default below), FLOOR_APPEND (extra cmdline),
#      FLOOR_QEMU_ARGS (extra QEMU arguments, split on blanks: `make bench` counts guest
#      instructions and device accesses with "-icount shift=0 -no-shutdown -qmp ..." and
#      trace options, reads them over QMP once the guest has powered off, then quits QEMU).
set -euo pipefail

prog=boot-floor
die() { echo "$prog: $*" >&2; exit 1; }

[ $# -ge 2 ] && [ $# -le 3 ] || die "usage: $0 VMLINUX INITRD [tcg|kvm]"
vmlinux=$1
initrd=$2
accel=${3:-tcg}
QEMU=${QEMU:-qemu-system-x86_64}
timeout_s=${FLOOR_TIMEOUT:-60}
memory=${FLOOR_MEMORY:-512}
hold=${FLOOR_HOLD:-}
marker='floor-init: up'
case "$memory" in '' | *[!0-9]*) die "FLOOR_MEMORY must be a number of MiB, not '$memory'" ;; esac
case "$hold" in *[!0-9]*) die "FLOOR_HOLD must be a number of seconds, not '$hold'" ;; esac

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
cmdline="console=ttyS0 reboot=t panic=-1 io_delay=none quiet${tcg_params:+ $tcg_params}${FLOOR_APPEND:+ $FLOOR_APPEND}"
# Held up, the VM hands back the memory its guest frees as the runtime's do
# (hypervisor/src/qemu/cmdline.rs: BALLOON and the page_reporting order in BASE_KERNEL_PARAMS),
# so the memory floor counts what a booted guest keeps, not what its boot once touched.
balloon=()
if [ -n "$hold" ]; then
    cmdline="$cmdline page_reporting.page_reporting_order=5 floor_hold=1"
    balloon=(-device virtio-balloon-device,free-page-reporting=on)
fi

log=$(mktemp "${TMPDIR:-/tmp}/boot-floor.XXXXXX")
qpid=""
cleanup() {
    if [ -n "$qpid" ]; then
        kill -KILL "$qpid" 2>/dev/null || true
        wait "$qpid" 2>/dev/null || true
    fi
    rm -f "$log"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

qemu_args=(
    -M "microvm,acpi=off,$machine_opts" -accel "$accel${tcg_params:+,tb-size=64}"
    -cpu "$cpu" -m "${memory}M"
    -object "memory-backend-memfd,id=mem,size=${memory}M,share=on" -machine memory-backend=mem
    -nodefaults -no-user-config -nographic -no-reboot
    -kernel "$vmlinux" -initrd "$initrd"
    -append "$cmdline"
    -serial stdio
    "${balloon[@]}"
)
if [ -n "${FLOOR_QEMU_ARGS:-}" ]; then
    read -r -a extra_args <<<"$FLOOR_QEMU_ARGS"
    qemu_args+=("${extra_args[@]}")
fi

failed() {
    tail -n 40 "$log" | tr -d '\r' >&2
    die "$1"
}

start=$(date +%s%N)
if [ -n "$hold" ]; then
    "$QEMU" "${qemu_args[@]}" </dev/null >"$log" 2>&1 &
    qpid=$!
    deadline=$((SECONDS + timeout_s))
    until grep -q "$marker" "$log"; do
        kill -0 "$qpid" 2>/dev/null || failed "QEMU exited before the guest printed '$marker' (output above)"
        [ $SECONDS -lt $deadline ] || failed "the guest did not print '$marker' within ${timeout_s}s (output above)"
        sleep 0.01
    done
    ms=$((($(date +%s%N) - start) / 1000000))
    echo "floor-boot-ms: $ms"
    echo "floor-qemu-pid: $qpid"
    [ "${FLOOR_VERBOSE:-0}" = 1 ] && tr -d '\r' <"$log" >&2
    sleep "$hold" &
    wait $! || true
    kill -0 "$qpid" 2>/dev/null || failed "QEMU exited while held (output above)"
    exit 0
fi
set +e
timeout --kill-after=5 "$timeout_s" "$QEMU" "${qemu_args[@]}" </dev/null >"$log" 2>&1
rc=$?
set -e
end=$(date +%s%N)
ms=$(((end - start) / 1000000))

[ "${FLOOR_VERBOSE:-0}" = 1 ] && tr -d '\r' <"$log" >&2
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    failed "QEMU did not exit within ${timeout_s}s (guest output above)"
fi
if [ $rc -ne 0 ]; then
    failed "QEMU exited with status $rc (output above)"
fi
if ! grep -q "$marker" "$log"; then
    failed "QEMU exited but the guest never printed '$marker' (output above)"
fi
echo "floor-boot-ms: $ms"
