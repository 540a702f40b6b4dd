#!/usr/bin/env python3
"""`make bench`: our VM runtime (io.containerd.kata.v2) next to runc, through a private
containerd, as a user drives it with `ctr`. Prints a table and writes the same figures as
JSON (target/bench/<timestamp>.json and target/bench/latest.json). Measures, never gates.

Figures (median and min-max over BENCH_RUNS runs, kata and runc alternating A/B):
  1. `ctr run --rm IMAGE x echo hi` wall time; the floor (bare boot of our kernel with a
     trivial init under the same accelerator); ours - floor.
  2. kata phase breakdown from the ts fields of the shim's log lines in containerd's log.
  3. stdout throughput (container -> ctr -> host reader) and the vsock ceiling (the
     agent's bench sink on vsock port 1025, read through the sandbox's hybrid vsock UDS;
     enabled by `agent.bench_sink=1` in the configuration's kernel_params).
  4. `ctr task exec ... true` latency into a running container.
  5. PSS of the shim, VMM, virtiofsd and vsock backend of one idle sandbox; runc's shim.
  6. density: BENCH_DENSITY sandboxes started in parallel.
  7. figures that carry over to KVM, from runs of their own (never timed with the rest):
     guest instructions to each phase (QEMU -icount shift=0, read over QMP), device
     accesses per phase (QEMU's trace events), host CPU outside the guest's vCPU thread
     next to runc's, and icount's own cost; 8. the KVM estimate computed from them; 9. the
     goals of issue 30 in those units.
  10. the VM pool: `ctr run --rm ... echo hi` from a pool of BENCH_POOL ready VMs (a factory
     the bench starts and ends), next to a cold start and the floor of the same run; 11.
     BENCH_DENSITY sandboxes at once from a full pool and cold, and what a ready VM costs.

Env: BENCH_RUNS (5), BENCH_DENSITY (10), BENCH_DENSITY_RUNS (BENCH_RUNS),
BENCH_STDOUT_BYTES (268435456), BENCH_CMD_TIMEOUT (s, 120: any single ctr command),
BENCH_STDOUT_TIMEOUT (s, 600: one 256 MiB transfer), BENCH_DENSITY_TIMEOUT (s, 300),
BENCH_DEADLINE (s, 5400: the whole bench), BENCH_OUT (target/bench), BENCH_SKIP (comma list
of: startup,stdout,idle,kvm,density,pool,hold), BENCH_POOL (2: ready VMs for the pool's echo
runs), BENCH_POOL_FILL_TIMEOUT (s, 300), KATA_KERNEL, KATA_INITRD, IMAGE_TAR, KATA_SHIM_DIR.
Only the Python standard library is used. The measurements live in the kata_bench package
next to this file, one module per figure group (kata_bench/__init__.py maps them).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kata_bench.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
