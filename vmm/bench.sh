#!/usr/bin/env bash
# bench-vmm: start-up latency and memory footprint of kata-vmm, next to QEMU microvm.
#
#   vmm/bench.sh            (from the workspace root; builds kata-vmm in release mode)
#
# Measures, for the same tiny PVH test guest (prints its command line on COM1, then spins):
#   * exec -> first serial byte, median of $RUNS runs;
#   * RSS of the VMM process with a 128 MiB guest, once the guest has printed.
# QEMU runs `-M microvm,accel=kvm`; if QEMU cannot use this host's KVM it is measured with
# accel=tcg and the table says so. Not a test: it prints numbers and asserts nothing.
set -euo pipefail

RUNS=${RUNS:-5}
MEM_MIB=${MEM_MIB:-128}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/bench-vmm.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

cargo build --release -p vmm --bin kata-vmm --manifest-path "$ROOT/Cargo.toml" >&2
VMM=${KATA_VMM:-$ROOT/target/release/kata-vmm}

# The guest: 32-bit PVH entry, prints "X" then the command line, then spins.
cat >"$WORK/guest.S" <<'ASM'
    .code32
    .text
    .globl _start
_start:
    mov $0x3f8, %dx
    mov $'X', %al
    out %al, %dx
    mov 24(%ebx), %ebx
1:  movb (%ebx), %al
    test %al, %al
    jz 2f
    out %al, %dx
    inc %ebx
    jmp 1b
2:  jmp 2b
    .section .note.Xen, "a", @note
    .align 4
    .long 4
    .long 8
    .long 18
    .asciz "Xen"
    .align 4
    .quad _start
ASM
as --64 -o "$WORK/guest.o" "$WORK/guest.S"
ld -m elf_x86_64 -nostdlib -static -Ttext=0x100000 -e _start -o "$WORK/guest" "$WORK/guest.o"

now_ns() { date +%s%N; }

# run_one NAME LOG CMD...: starts CMD, waits for the first byte in LOG (30 s at most),
# prints "<latency_ms> <rss_kib>", kills CMD by pid.
run_one() {
    local log=$2; shift 2
    rm -f "$log"
    local t0; t0=$(now_ns)
    "$@" >/dev/null 2>"$WORK/stderr" &
    local pid=$!
    PIDS+=("$pid")
    local deadline=$(( t0 + 30000000000 ))
    while [ ! -s "$log" ]; do
        if ! kill -0 "$pid" 2>/dev/null || [ "$(now_ns)" -gt "$deadline" ]; then
            echo "FAILED $(head -c 300 "$WORK/stderr" | tr '\n' ' ')"
            kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
            return
        fi
    done
    local t1; t1=$(now_ns)
    sleep 0.3   # let the guest settle before reading RSS
    local rss; rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    echo "$(( (t1 - t0) / 1000000 )) $rss"
}

median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) print "-"; else print a[int((NR+1)/2)]}'; }

measure() {   # measure LABEL LOG CMD...
    local label=$1 log=$2; shift 2
    local lat=() rss=() out
    for _ in $(seq "$RUNS"); do
        out=$(run_one x "$log" "$@")
        if [[ $out == FAILED* ]]; then
            printf '%-34s %s\n' "$label" "$out"
            return 1
        fi
        lat+=("${out% *}"); rss+=("${out#* }")
    done
    printf '%-34s %10s ms %10s KiB\n' "$label" \
        "$(printf '%s\n' "${lat[@]}" | median)" "$(printf '%s\n' "${rss[@]}" | median)"
}

cat >"$WORK/vmm.json" <<JSON
{"kernel": "$WORK/guest", "cmdline": "console=ttyS0", "vcpus": 1, "memory_mib": $MEM_MIB,
 "serial_log": "$WORK/vmm.log", "rng": true}
JSON

echo "exec -> first serial byte (median of $RUNS), RSS with a $MEM_MIB MiB guest"
printf '%-34s %13s %14s\n' "VMM" "first byte" "RSS"
measure "kata-vmm (KVM)" "$WORK/vmm.log" "$VMM" --config "$WORK/vmm.json" || true

QEMU=${QEMU:-qemu-system-x86_64}
if command -v "$QEMU" >/dev/null; then
    qemu_args=(-m "$MEM_MIB" -smp 1 -nodefaults -no-user-config -nographic -display none
        -kernel "$WORK/guest" -append console=ttyS0 -serial "file:$WORK/qemu.log")
    if ! measure "qemu microvm (accel=kvm)" "$WORK/qemu.log" \
        "$QEMU" -M microvm,accel=kvm,acpi=off "${qemu_args[@]}"; then
        echo "  (QEMU could not run the guest with KVM on this host; falling back to TCG)"
    fi
    measure "qemu microvm (accel=tcg)" "$WORK/qemu.log" \
        "$QEMU" -M microvm,accel=tcg,acpi=off "${qemu_args[@]}" || true
else
    echo "qemu-system-x86_64 not found: no comparison"
fi
"$VMM" check || true
