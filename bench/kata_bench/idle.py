"""3b, 4 and 5 on one idle pair: a kata and a runc `sleep 600` started once, sampled for
memory while fresh, then exec'd into (with a third, kata with one virtio-fs share for
volumes and root filesystems, started for the execs alone), then (kata) read through the
vsock bench sink."""

import time

from . import exec_latency, memory, throughput
from .procs import run
from .settings import log


def start_idle(h, ids):
    """`sleep 600` in each of `ids` (side -> id); "kata_one_share" is a kata one without
    the rootfs share (its root filesystem comes through the volumes' share, cache auto)."""
    for side, cid in ids.items():
        config = h.conf_one_share if side == "kata_one_share" else None
        args = h.run_args(side.split("_")[0], cid, ["sleep", "600"], detach=True, rm=False,
                          config=config)
        rc, _, err = run(args, env=h.env)
        if rc != 0:
            raise RuntimeError("%s: ctr run -d %s failed: %s" % (side, cid, err[-1000:]))
    if not h.wait_running(list(ids.values()), 60):
        raise RuntimeError("idle containers did not reach RUNNING within 60 s: %s" % h.tasks())
    return ids


def bench_idle(h):
    ids = start_idle(h, {"kata": h.new_id("ki"), "runc": h.new_id("ri")})
    log("idle containers running: %s" % ids)
    time.sleep(memory.SETTLE_S)  # let the fresh sandboxes settle before sampling memory
    mem = memory.measure(ids)
    # Started after the memory samples, which it would change (shared pages count less).
    ids.update(start_idle(h, {"kata_one_share": h.new_id("ko")}))
    ex, exf = exec_latency.measure(h, ids)
    h.remove([ids.pop("kata_one_share")])  # gone before the vsock ceiling, which it would share
    ceil, cfail = throughput.measure_vsock_ceiling(ids["kata"])
    # Free page reporting hands freed memory back a few seconds after the guest frees it.
    time.sleep(memory.AFTER_ACTIVITY_S)
    after = memory.measure(ids)
    throughput.add_vsock_ceiling_rows(h.report, ceil, cfail)
    exec_latency.add_rows(h.report, ex, exf)
    h.remove(list(ids.values()))
    # Alone, as the sandbox was sampled (another QEMU would share its mapped files).
    floor = memory.measure_floor(h)
    memory.add_rows(h.report, mem, after, floor)
