"""3b, 4 and 5 on one idle pair: a kata and a runc `sleep 600` started once, sampled for
memory while fresh, then exec'd into, then (kata) read through the vsock bench sink."""

import time

from . import exec_latency, memory, throughput
from .procs import run
from .settings import log


def start_idle(h):
    ids = {"kata": h.new_id("ki"), "runc": h.new_id("ri")}
    for side, cid in ids.items():
        rc, _, err = run(h.run_args(side, cid, ["sleep", "600"], detach=True, rm=False),
                         env=h.env)
        if rc != 0:
            raise RuntimeError("%s: ctr run -d %s failed: %s" % (side, cid, err[-1000:]))
    if not h.wait_running(list(ids.values()), 60):
        raise RuntimeError("idle containers did not reach RUNNING within 60 s: %s" % h.tasks())
    return ids


def bench_idle(h):
    ids = start_idle(h)
    log("idle containers running: %s" % ids)
    time.sleep(2)  # let the fresh sandboxes settle before sampling memory
    mem = memory.measure(ids)
    ex, exf = exec_latency.measure(h, ids)
    ceil, cfail = throughput.measure_vsock_ceiling(ids["kata"])
    throughput.add_vsock_ceiling_rows(h.report, ceil, cfail)
    exec_latency.add_rows(h.report, ex, exf)
    memory.add_rows(h.report, mem)
    h.remove(list(ids.values()))
