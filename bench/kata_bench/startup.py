"""1 + 2: start-up. `ctr run --rm IMAGE x echo hi` on both sides, the floor (a bare boot of
our kernel with a trivial init under the same accelerator), ours - floor, and the kata
phase breakdown from the shim's log records (see `shimlog`)."""

import os
import re
import time

from . import shimlog
from .procs import run
from .report import fmt_num
from .settings import IMAGE, REPO, RUNS, ab_order, log

# (key, label, how) of each phase row, in table order.
PHASE_ROWS = [
    ("ctr_to_shim", "ctr spawned -> shim start", "ctr's start time to phase 'shim start' "
     "(containerd, shim spawn, Create request, config load)"),
    ("shim_to_vmm", "shim start -> VMM launched", "phase 'shim start' to phase 'VMM launched' "
     "(mounts, virtiofsd, vsock backend, QEMU spawned)"),
    ("vmm_to_agent", "VMM launched -> agent reachable", "phase 'VMM launched' to phase "
     "'agent reachable' (guest kernel boot + agent start + dial)"),
    ("agent_to_started", "agent reachable -> container started", "phase 'agent reachable' to "
     "phase 'container started'"),
    ("agent_to_created", "  of which: -> container created", "phase 'agent reachable' to "
     "phase 'container created' (CreateContainer)"),
    ("created_to_started", "  of which: created -> started", "phase 'container created' to "
     "phase 'container started' (Start)"),
    ("started_to_exited", "container started -> process exited", "phase 'container started' "
     "to msg 'process exited' (echo runs, stdout drained)"),
    ("exited_to_ctr_end", "process exited -> ctr returned", "msg 'process exited' to ctr's exit "
     "time (ctr sees the exit, deletes task (VM teardown) and container: --rm)"),
    ("exited_to_delete", "  of which: -> delete request", "msg 'process exited' to the shim's "
     "'delete' line (not a phase): ctr has seen the exit and asks to delete"),
    ("delete_to_ctr_end", "  of which: delete -> ctr returned", "shim's 'delete' line to ctr's "
     "exit time (VM stop, container rm, ctr exits)"),
]


def timed_echo(h, side, config=None):
    cid = h.new_id(side[0] + "s")
    t0 = time.time_ns()
    m0 = time.monotonic()
    rc, out, err = run(h.run_args(side, cid, ["echo", "hi"], config=config), env=h.env)
    ms = (time.monotonic() - m0) * 1000
    t1 = time.time_ns()
    if rc != 0 or out.strip() != "hi":
        log("%s echo run %s failed (rc %s): %s" % (side, cid, rc, (err or out)[-500:]))
        h.remove([cid], timeout=30)
        return None, cid, t0, t1
    return ms, cid, t0, t1


def floor_cmd(h, hold_s=None):
    """scripts/boot-floor.sh: a bare boot of our kernel under the shim's accelerator, in a VM
    of the sandboxes' size; with `hold_s`, it stays up idle that long (the memory floor)."""
    env = ["FLOOR_MEMORY=%d" % h.memory_mib]
    if hold_s is not None:
        env.append("FLOOR_HOLD=%d" % hold_s)
    return ["env"] + env + ["bash", os.path.join(REPO, "scripts/boot-floor.sh"), h.kernel,
                            h.floor_initrd, h.accel or "tcg"]


FLOOR_MS = re.compile(r"floor-boot-ms: (\d+)")


def floor_boot(h):
    rc, out, err = run(floor_cmd(h), timeout=120)
    m = FLOOR_MS.search(out)
    if rc != 0 or not m:
        log("floor boot failed (rc %s): %s" % (rc, err[-500:]))
        return None
    return float(m.group(1))


def phases(h, cid, t_ctr0, t_ctr1):
    """The phase timings of one kata run; learns the accelerator from its first run."""
    first = shimlog.milestones(h.shim_records(cid))
    timings = shimlog.phase_timings(first, t_ctr0, t_ctr1)
    if timings is None:
        log("sandbox %s: log records missing: %s" % (cid, shimlog.missing(first)))
        return None
    if h.accel is None:
        h.accel = first[shimlog.VMM_LAUNCHED].get("accelerator")
    return timings


def bench_startup(h):
    vals = {"kata": [], "runc": [], "floor": [], "diff": []}
    fails = {"kata": 0, "runc": 0, "floor": 0}
    ph = []
    for i in range(RUNS):
        got = {}
        for side in ab_order(i):
            ms, cid, t0, t1 = timed_echo(h, side)
            got[side] = ms
            if ms is None:
                fails[side] += 1
                continue
            vals[side].append(ms)
            if side == "kata":
                p = phases(h, cid, t0, t1)
                if p:
                    ph.append(p)
        fl = floor_boot(h)
        if fl is None:
            fails["floor"] += 1
        else:
            vals["floor"].append(fl)
            if got.get("kata") is not None:
                vals["diff"].append(got["kata"] - fl)
        log("start-up run %d/%d: kata %s ms, runc %s ms, floor %s ms" % (
            i + 1, RUNS, fmt_num(got.get("kata"), "ms"), fmt_num(got.get("runc"), "ms"),
            fmt_num(fl, "ms")))
    accel = h.accel or "tcg"
    R = h.report
    sec = "1. start-up: ctr run --rm %s x echo hi" % IMAGE
    R.add(sec, "run_echo_ms", "ctr run --rm ... echo hi", "ms",
          "wall time of the ctr command (spawned to exited), output checked",
          kata=vals["kata"], runc=vals["runc"], failed=fails)
    R.add(sec, "floor_boot_ms", "floor: bare boot, trivial init", "ms",
          "scripts/boot-floor.sh: QEMU microvm accel=%s, %d MiB like the sandboxes, our "
          "kernel, init that powers off; QEMU start to exit" % (accel, h.memory_mib),
          kata=vals["floor"], failed={"kata": fails["floor"]}, single=True)
    R.add(sec, "ours_minus_floor_ms", "ours - floor", "ms",
          "per run: kata echo time minus the floor boot of the same run", kata=vals["diff"],
          single=True)
    sec = "2. kata phases (shim log ts, RFC3339 ns; same clock as ctr's start/end)"
    for key, label, how in PHASE_ROWS:
        R.add(sec, "phase_" + key + "_ms", label, "ms", how,
              kata=[p[key] for p in ph if p.get(key) is not None], single=True)
    if len(ph) < len(vals["kata"]):
        R.notes.append("phase breakdown available for %d of %d kata runs" % (len(ph), len(vals["kata"])))
