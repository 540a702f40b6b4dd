#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ (what parses guest-controlled bytes), each for a
# bounded time: `bash scripts/fuzz.sh [TARGET...]` (default: every target).
#
# Env: FUZZ_SECONDS (60) per target; KATA_FUZZ_CACHE (/var/cache/kata-fuzz) holds the build,
# the corpora (kept between runs, so each run starts where the last one stopped), the
# crashing inputs (artifacts/TARGET/) and each run's log (logs/TARGET.log);
# CARGO_TOOLS_ROOT (/opt/kata-tools), where `make setup` installs cargo-fuzz.
#
# Works on a stable toolchain: libFuzzer's instrumentation needs unstable rustc flags, which
# RUSTC_BOOTSTRAP=1 allows; AddressSanitizer is used when the toolchain ships its runtime
# (stable rust-std does on x86_64 Linux), otherwise the targets run without a sanitizer.
# Exits non-zero if any target found a crash, a leak or a failed assertion, or did not build.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${KATA_FUZZ_CACHE:-/var/cache/kata-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-60}
TOOLS=${CARGO_TOOLS_ROOT:-/opt/kata-tools}
export PATH="$HOME/.cargo/bin:$PATH"

log() { echo "fuzz: $*" >&2; }

CARGO_FUZZ=$(command -v cargo-fuzz || true)
[ -x "$TOOLS/bin/cargo-fuzz" ] && CARGO_FUZZ=$TOOLS/bin/cargo-fuzz
if [ -z "$CARGO_FUZZ" ]; then
    log "cargo-fuzz is not installed: run \`make setup\` (it installs it into $TOOLS/bin)"
    exit 1
fi

export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR=$CACHE/target
sanitizer=address
sysroot=$(rustc --print sysroot)
if ! ls "$sysroot"/lib/rustlib/x86_64-unknown-linux-gnu/lib/librustc-*_rt.asan.a >/dev/null 2>&1; then
    log "note: $(rustc --version) ships no AddressSanitizer runtime; fuzzing without a sanitizer"
    sanitizer=none
fi

mkdir -p "$CACHE/logs"
# Sockets and disk images of the targets go to a directory of this run's own.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kata-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

cd "$ROOT"
mapfile -t all < <("$CARGO_FUZZ" list)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

# One build of every target (`cargo fuzz build` takes one target or all).
log "building the fuzz targets (sanitizer: $sanitizer, into $CARGO_TARGET_DIR)"
if ! "$CARGO_FUZZ" build --sanitizer "$sanitizer" >"$CACHE/logs/build.log" 2>&1; then
    tail -n 40 "$CACHE/logs/build.log" >&2
    log "the fuzz targets did not build (log: $CACHE/logs/build.log)"
    exit 1
fi

passed=0
failed=()
for t in "${targets[@]}"; do
    corpus=$CACHE/corpus/$t
    artifacts=$CACHE/artifacts/$t
    mkdir -p "$corpus" "$artifacts"
    seeds=()
    [ -d "fuzz/seeds/$t" ] && seeds=("fuzz/seeds/$t")
    log "$t: ${SECONDS_EACH}s (corpus: $corpus)"
    if TMPDIR=$scratch "$CARGO_FUZZ" run --sanitizer "$sanitizer" "$t" "$corpus" "${seeds[@]}" -- \
        -max_total_time="$SECONDS_EACH" -timeout=20 -rss_limit_mb=2048 \
        -artifact_prefix="$artifacts/" -print_final_stats=1 >"$CACHE/logs/$t.log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$CACHE/logs/$t.log" | grep -o '[0-9]*$' || true)
        log "$t: no crash in ${runs:-?} runs"
        passed=$((passed + 1))
    else
        grep -E 'ERROR|panicked|SUMMARY|Test unit written|assert' "$CACHE/logs/$t.log" | head -n 20 >&2 || true
        log "$t FAILED (log: $CACHE/logs/$t.log); reproduce with:"
        log "  RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR=$CARGO_TARGET_DIR $CARGO_FUZZ run --sanitizer $sanitizer $t $artifacts/<crash file>"
        failed+=("$t")
    fi
done

echo "fuzz: ${passed} passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
