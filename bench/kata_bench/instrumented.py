"""7: figures that carry over to KVM, from runs of their own, never timed with the rest.

QEMU gets its extra arguments from a wrapper the bench writes (`path` of a configuration
of the bench's own, passed with `ctr run --runtime-config-path`): the runtime and its
configuration stay as users run them. The confined QEMU's minimal root holds /usr and /bin,
so the shell script runs there and execs the real QEMU (same pid). Every mode adds a QMP
socket of the bench's own in the sandbox's run directory (the runtime's own takes one
client at a time); `icount` adds `-icount shift=0` (QEMU counts every guest instruction;
TCG runs them one thread, slower); `trace` adds the device-access trace events on top
(`devices`). The bare-boot floor gets the same through scripts/boot-floor.sh's
FLOOR_QEMU_ARGS, with `-no-shutdown`, so it is read once its guest has powered off.

Per round: kata in `qmp` mode (host CPU), runc (host CPU), kata in `icount` mode (guest
instructions at each phase), kata in `trace` mode (device accesses per phase), kata with
and without icount with nothing polled (icount's own cost), and the floor the same ways."""

import os
import shutil
import subprocess
import time

from . import shimlog
from .kvm_estimate import add_rows
from .procs import reap, run, spawn
from .settings import CMD_TIMEOUT, RUNS, VMDIR, log
from .startup import FLOOR_MS, floor_cmd
from .watch import VmWatch

BENCH_QMP = "bench-qmp.sock"
BENCH_TRACE = "bench-trace.log"
ICOUNT_ARGS = ["-icount", "shift=0"]
TRACE_ARGS = ["-msg", "timestamp=on", "-trace", "enable=memory_region_ops_read",
              "-trace", "enable=memory_region_ops_write"]
MODES = ("qmp", "icount", "trace")


def mode_args(mode):
    return {"qmp": [], "icount": ICOUNT_ARGS, "trace": ICOUNT_ARGS + TRACE_ARGS}[mode]


WRAPPER = """#!/bin/sh
# Written by `make bench` (bench/kata_bench/instrumented.py): QEMU as the runtime runs it,
# plus a QMP socket and the trace file of the bench's own in the sandbox's run directory
# (named by the runtime's "-name sandbox-ID") and the arguments of mode %(mode)s.
id=
prev=
for a in "$@"; do
    [ "$prev" = -name ] && id=${a#sandbox-}
    prev=$a
done
dir=%(vmdir)s/$id
exec %(qemu)s -qmp "unix:$dir/%(qmp)s,server=on,wait=off" %(extra)s "$@"
"""


def write_configs(h):
    """A QEMU wrapper and a configuration per mode, in the bench's work directory; returns
    {mode: configuration path}."""
    qemu = shutil.which("qemu-system-x86_64") or "/usr/bin/qemu-system-x86_64"
    qemu = os.path.realpath(qemu)
    d = os.path.join(h.work, "qemu-wrappers")
    os.makedirs(d, exist_ok=True)
    # The sandbox's uid runs the wrapper: it must reach it.
    os.chmod(h.work, 0o711)
    os.chmod(d, 0o755)
    with open(h.conf) as f:
        base = f.read()
    confs = {}
    for mode in MODES:
        extra = list(mode_args(mode))
        if mode == "trace":
            extra += ["-D", '"$dir/%s"' % BENCH_TRACE]
        w = os.path.join(d, "qemu-" + mode)
        with open(w, "w") as f:
            f.write(WRAPPER % {"mode": mode, "vmdir": VMDIR, "qemu": qemu, "qmp": BENCH_QMP,
                               "extra": " ".join(a if a.startswith('"') else "'%s'" % a
                                                 for a in extra)})
        os.chmod(w, 0o755)
        conf = os.path.join(h.work, "configuration-%s.toml" % mode)
        with open(conf, "w") as f:
            # The bench's configuration has one section, [hypervisor.qemu]: path joins it.
            f.write(base + 'path = "%s"\n' % w)
        confs[mode] = conf
    return confs


def phase_times(h, cid):
    """Wall times (ns) of the shim's phases of sandbox `cid`, by name, or None."""
    first = shimlog.milestones(h.shim_records(cid))
    need = [shimlog.VMM_LAUNCHED, shimlog.AGENT_REACHABLE, shimlog.CONTAINER_STARTED,
            shimlog.PROCESS_EXITED]
    if any(n not in first for n in need):
        log("instrumented run %s: shim records missing: %s" % (
            cid, [n for n in need if n not in first]))
        return None
    return {n: first[n]["_ns"] for n in need}


PHASES = [("agent", shimlog.AGENT_REACHABLE), ("started", shimlog.CONTAINER_STARTED),
          ("exited", shimlog.PROCESS_EXITED)]


def kata_run(h, cg, mode, watch=True):
    """One `ctr run --rm ... echo hi` under configuration `mode`: a dict of what was
    measured, or None if the run failed. Without `watch` nothing is polled (icount's cost)."""
    cid = h.new_id("k" + mode[0])
    run_dir = os.path.join(VMDIR, cid)
    w = VmWatch(os.path.join(run_dir, BENCH_QMP),
                os.path.join(run_dir, BENCH_TRACE) if mode == "trace" else None,
                icount=mode != "qmp")
    u0, n0 = cg.usage_ns(), cg.ns_usage_ns()
    m0 = time.monotonic()
    p = spawn(h.run_args("kata", cid, ["echo", "hi"], config=h.instrumented_confs[mode]),
              env=h.env, stdout=subprocess.PIPE)
    if watch:
        w.start()
    rc, out, err = reap(p, CMD_TIMEOUT)
    wall = (time.monotonic() - m0) * 1000
    if watch:
        w.finish()
    # The shim exits just after ctr returns; its last CPU belongs to this run.
    time.sleep(0.3)
    u1, n1 = cg.usage_ns(), cg.ns_usage_ns()
    if rc != 0 or out.strip() != "hi":
        log("instrumented kata run %s (%s) failed (rc %s): %s" % (cid, mode, rc, err[-300:]))
        h.remove([cid], timeout=30)
        return None
    if not watch:
        return {"wall_ms": wall}
    if w.error:
        log("instrumented kata run %s (%s): watch failed: %s" % (cid, mode, w.error))
        return None
    t = phase_times(h, cid)
    if t is None:
        return None
    res = {"wall_ms": wall}
    if mode == "qmp":
        if None in (u0, u1, n0, n1, w.vcpu_ns):
            log("instrumented kata run %s: host CPU not read (cgroup: %s, vCPU: %s)" % (
                cid, cg.error or "ok", w.vcpu_ns))
            return None
        res.update({
            "cpu_containerd_shim_ms": (u1 - u0) / 1e6,
            "cpu_qemu_helpers_ms": (n1 - n0 - w.vcpu_ns) / 1e6,
            "cpu_vcpu_ms": w.vcpu_ns / 1e6,
            "vcpu_wait_ms": (w.vcpu_wait_ns or 0) / 1e6,
            "cpu_outside_vcpu_ms": (u1 - u0 + n1 - n0 - w.vcpu_ns) / 1e6,
        })
    else:
        spread = 0
        for key, name in PHASES:
            n, s = w.icount_at(t[name])
            res["insn_" + key] = n
            spread = max(spread, s or 0)
        res["insn_spread"] = spread
        if mode == "trace":
            bounds = [None] + [t[name] for _, name in PHASES]
            for (key, _), a, b in zip(PHASES, bounds, bounds[1:]):
                res["dev_" + key] = w.trace.between(a, b)
            res["dev_total"] = w.trace.between(None, t[shimlog.PROCESS_EXITED])
            res["dev_regions"] = w.trace.by_region
            res["dev_virtio"] = w.trace.virtio()
            res["dev_virtio_devices"] = w.trace.virtio_devices()
    return res


def runc_run(h, cg):
    """Host CPU of one runc `ctr run --rm ... echo hi`: containerd and its shim (their
    cgroup) and the container's own cgroup (/NS's usage over the run)."""
    cid = h.new_id("rq")
    u0, n0 = cg.usage_ns(), cg.ns_usage_ns()
    rc, out, err = run(h.run_args("runc", cid, ["echo", "hi"]), env=h.env)
    time.sleep(0.3)
    u1, n1 = cg.usage_ns(), cg.ns_usage_ns()
    if rc != 0 or out.strip() != "hi" or None in (u0, u1, n0, n1):
        log("instrumented runc run %s failed (rc %s, cgroup: %s): %s" % (
            cid, rc, cg.error or "ok", err[-300:]))
        h.remove([cid], timeout=30)
        return None
    return {"cpu_containerd_shim_ms": (u1 - u0) / 1e6, "cpu_container_ms": (n1 - n0) / 1e6,
            "cpu_total_ms": (u1 - u0 + n1 - n0) / 1e6}


def floor_plain(h, icount):
    """One bare boot as the timed floor runs it, with or without -icount shift=0 and nothing
    polled: its floor-boot-ms (icount's cost)."""
    cmd = floor_cmd(h)
    if icount:
        cmd.insert(1, "FLOOR_QEMU_ARGS=" + " ".join(ICOUNT_ARGS))
    rc, out, err = run(cmd, timeout=120)
    m = FLOOR_MS.search(out)
    if rc != 0 or not m:
        log("floor boot (icount %s) failed (rc %s): %s" % (icount, rc, err[-300:]))
        return None
    return {"wall_ms": float(m.group(1))}


def floor_run(h, mode):
    """One bare boot (scripts/boot-floor.sh) under `mode`, read once its guest has powered
    off: wall ms to then, instructions, device accesses, vCPU and QEMU CPU."""
    sock = os.path.join(h.work, "floor-" + BENCH_QMP)
    trace = os.path.join(h.work, "floor-" + BENCH_TRACE)
    for f in (sock, trace):
        if os.path.exists(f):
            os.unlink(f)
    extra = ["-no-shutdown", "-qmp", "unix:%s,server=on,wait=off" % sock,
             "-name", "debug-threads=on"] + mode_args(mode)
    if mode == "trace":
        extra += ["-D", trace]
    cmd = floor_cmd(h)
    cmd.insert(1, "FLOOR_QEMU_ARGS=" + " ".join(extra))
    w = VmWatch(sock, trace if mode == "trace" else None, icount=mode != "qmp",
                stop_on_shutdown=True)
    m0 = time.monotonic()
    p = spawn(cmd, env=h.env, stdout=subprocess.PIPE)
    w.start()
    rc, out, err = reap(p, 120)
    w.finish()
    if rc != 0 or not FLOOR_MS.search(out) or not w.shut_down or w.error:
        log("instrumented floor boot (%s) failed (rc %s, watch %s): %s" % (
            mode, rc, w.error, err[-300:]))
        return None
    res = {"wall_ms": (w.shut_down - m0) * 1000}
    if mode == "qmp":
        if w.vcpu_ns is None or w.proc_ns is None:
            return None
        res.update({"cpu_vcpu_ms": w.vcpu_ns / 1e6, "vcpu_wait_ms": (w.vcpu_wait_ns or 0) / 1e6,
                    "cpu_outside_vcpu_ms": (w.proc_ns - w.vcpu_ns) / 1e6})
    else:
        res["insn_total"] = w.last_icount()
        if mode == "trace":
            res["dev_total"] = w.trace.between(None, None)
            res["dev_regions"] = w.trace.by_region
    return res


def bench_instrumented(h):
    if h.accel == "kvm":
        # -icount is TCG's; under KVM the timed rows are the figures themselves.
        h.report.notes.append("sections 7 to 9 skipped: the sandboxes run under KVM, where "
                              "QEMU cannot count instructions (-icount is TCG's) and the "
                              "timed rows need no estimate")
        return
    cg = h.cgroup
    h.instrumented_confs = write_configs(h)
    kinds = (("kata_qmp", lambda: kata_run(h, cg, "qmp")),
             ("runc", lambda: runc_run(h, cg)),
             ("kata_icount", lambda: kata_run(h, cg, "icount")),
             ("kata_trace", lambda: kata_run(h, cg, "trace")),
             # icount's own cost: the same command with and without it, nothing polled.
             ("kata_plain", lambda: kata_run(h, cg, "qmp", watch=False)),
             ("kata_icount_quiet", lambda: kata_run(h, cg, "icount", watch=False)),
             ("floor_qmp", lambda: floor_run(h, "qmp")),
             ("floor_icount", lambda: floor_run(h, "icount")),
             ("floor_trace", lambda: floor_run(h, "trace")),
             ("floor_plain", lambda: floor_plain(h, False)),
             ("floor_icount_quiet", lambda: floor_plain(h, True)))
    runs = {k: [] for k, _ in kinds}
    for i in range(RUNS):
        for key, fn in kinds:
            runs[key].append(fn())  # None for a failed run: rounds stay aligned
        log("instrumented run %d/%d: %s" % (i + 1, RUNS, {
            k: sum(1 for r in v if r is not None) for k, v in runs.items()}))
    add_rows(h, runs)
