"""12: what a resize ceiling costs (issue 43). The same `echo hi` and idle `sleep 600` as rows 1
and 5, on a kata configuration with pod_resize_vcpus = 1 and pod_resize_memory = 1280 beside
the default one, interleaved: the VM boots with one more vCPU (offline) and 1280 MiB more
memory, which the balloon takes at boot (BENCH_RESIZE_CEILING changes the ceiling)."""

import os
import sys
import time

from . import memory
from .procs import run
from .settings import RUNS, log
from .startup import timed_echo

def ceiling():
    """BENCH_RESIZE_CEILING: "VCPUS,MIB" (1,1280)."""
    v = os.environ.get("BENCH_RESIZE_CEILING", "1,1280")
    try:
        vcpus, mib = (int(x) for x in v.split(","))
    except ValueError:
        sys.exit("bench: BENCH_RESIZE_CEILING=%r is not VCPUS,MIB" % v)
    return vcpus, mib


VCPUS, MIB = ceiling()
SECTION = "12. a resize ceiling (pod_resize_vcpus = %d, pod_resize_memory = %d)" % (VCPUS, MIB)
CEILING = "pod_resize_vcpus = %d\npod_resize_memory = %d\n" % (VCPUS, MIB)
# Seconds an idle VM with a ceiling settles before its samples: the balloon takes the
# ceiling's memory while the guest boots, then QEMU has discarded it.
SETTLE_S = 5


def bench_resize(h):
    with open(h.conf) as f:
        base = f.read()
    with open(h.conf_resize, "w") as f:
        f.write(base + CEILING)
    echo = {"kata": [], "kata_resize": []}
    fails = {"kata": 0, "kata_resize": 0}
    for i in range(RUNS):
        order = ["kata", "kata_resize"] if i % 2 == 0 else ["kata_resize", "kata"]
        for side in order:
            ms, _, _, _ = timed_echo(h, "kata", config=h.conf_resize if side != "kata" else None)
            if ms is None:
                fails[side] += 1
            else:
                echo[side].append(ms)
        log("resize ceiling run %d/%d: %s" % (i + 1, RUNS, {k: v[-1:] for k, v in echo.items()}))
    ids = {"kata": h.new_id("kr"), "kata_resize": h.new_id("kr")}
    for side, cid in ids.items():
        args = h.run_args("kata", cid, ["sleep", "600"], detach=True, rm=False,
                          config=h.conf_resize if side != "kata" else None)
        rc, _, err = run(args, env=h.env)
        if rc != 0:
            h.remove(list(ids.values()), timeout=60)
            raise RuntimeError("%s: ctr run -d %s failed: %s" % (side, cid, err[-1000:]))
    if not h.wait_running(list(ids.values()), 60):
        h.remove(list(ids.values()), timeout=60)
        raise RuntimeError("idle containers did not reach RUNNING within 60 s: %s" % h.tasks())
    time.sleep(SETTLE_S)
    kids = memory.children_map()
    pss = {"kata": [], "kata_resize": []}
    ram = {"kata": [], "kata_resize": []}
    for _ in range(RUNS):
        for side, cid in ids.items():
            m = memory.kata_pss(cid, kids)
            if m:
                pss[side].append(m["sum"])
                ram[side].append(m.get("qemu_guest_ram"))
        time.sleep(0.5)
    h.remove(list(ids.values()))
    R = h.report
    R.add(SECTION, "resize_echo_default_ms", "ctr run --rm ... echo hi, default", "ms",
          "as row 1, interleaved with the next", kata=echo["kata"],
          failed={"kata": fails["kata"]}, single=True)
    R.add(SECTION, "resize_echo_ceiling_ms", "  with the ceiling", "ms",
          "the same on the configuration with the ceiling", kata=echo["kata_resize"],
          failed={"kata": fails["kata_resize"]}, single=True)
    R.add(SECTION, "resize_pss_default_mib", "idle sandbox PSS sum, default", "MiB",
          "as row 5's sum, %d s after RUNNING" % SETTLE_S, kata=pss["kata"], single=True)
    R.add(SECTION, "resize_pss_ceiling_mib", "  with the ceiling", "MiB",
          "the same on the configuration with the ceiling", kata=pss["kata_resize"], single=True)
    R.add(SECTION, "resize_guest_ram_default_mib", "  guest RAM, default", "MiB",
          "the memory-backend mapping of QEMU", kata=[v for v in ram["kata"] if v is not None],
          single=True)
    R.add(SECTION, "resize_guest_ram_ceiling_mib", "  guest RAM, with the ceiling", "MiB",
          "the same with the ceiling (the balloon's pages discarded)",
          kata=[v for v in ram["kata_resize"] if v is not None], single=True)
