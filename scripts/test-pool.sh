#!/usr/bin/env bash
# A VM factory for running the end-to-end suites from the pool (issue 30): its
# configuration is the one the tests write (tests/src/runtime_config.rs, QEMU), so its VMs
# have the pool key the tests' sandboxes look for.
#
#   source /tmp/testenv.sh   # KATA_TEST_KERNEL, KATA_TEST_INITRD, KATA_TEST_SHIM_DIR
#   scripts/test-pool.sh start DIR   -> starts `kata-runtime factory init` (KATA_TEST_POOL_SIZE
#                                       ready VMs, default 2), prints the export
#   KATA_TEST_POOL_DIR=DIR/pool cargo test -p e2e-tests --test ctr
#   scripts/test-pool.sh stop DIR    -> `kata-runtime factory destroy` (nothing left)
#
# Layout under DIR: configuration.toml, factory.log, pool/ (the vm_cache_dir).
set -euo pipefail

cmd=${1:?usage: $0 start|stop DIR}
dir=${2:?usage: $0 start|stop DIR}
bin=${KATA_TEST_SHIM_DIR:?source /tmp/testenv.sh first}
conf=$dir/configuration.toml

case $cmd in
start)
    : "${KATA_TEST_KERNEL:?}" "${KATA_TEST_INITRD:?}"
    mkdir -p "$dir"
    # The same keys, in the same order, as RuntimeConfig::qemu() with KATA_TEST_POOL_DIR.
    cat >"$conf" <<TOML
[runtime]
enable_debug = true
[factory]
vm_cache_number = ${KATA_TEST_POOL_SIZE:-2}
vm_cache_dir = "$dir/pool"
[hypervisor.qemu]
kernel = "$KATA_TEST_KERNEL"
initrd = "$KATA_TEST_INITRD"
vsock_backend = "$bin/kata-vsock"
TOML
    nohup "$bin/kata-runtime" --config "$conf" factory init >"$dir/factory.log" 2>&1 &
    echo "factory pid $!; log $dir/factory.log"
    echo "export KATA_TEST_POOL_DIR=$dir/pool"
    ;;
stop)
    "$bin/kata-runtime" --config "$conf" factory destroy
    ;;
*)
    echo "usage: $0 start|stop DIR" >&2
    exit 64
    ;;
esac
