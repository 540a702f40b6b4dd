"""6: density. BENCH_DENSITY sandboxes started at once: time until all run, host memory
used, how many were lost; then all are removed. Next to it, the same count of bare boots
of our kernel at once (the floor, as in `startup`), and one sandbox and one bare boot
alone, so the table shows how much of the slow-down under load is the machine's and how
much ours."""

import json
import resource
import subprocess
import time

from .host import busy_cpu_s, children_map, mem_available_kib, our_sandboxes, \
    settled_mem_available_kib
from .memory import kata_pss
from .procs import reap, spawn
from .settings import DENSITY, DENSITY_RUNS, DENSITY_TIMEOUT, ab_order, log
from .startup import FLOOR_MS, floor_cmd


def density_once(h, side, count=DENSITY, remove=True, detail=True, config=None):
    """`count` sandboxes of `side` started at once; removed again unless `remove` is
    false (their ids are then in the result's "ids", for the caller to remove). With
    `detail`, host memory is first left to settle (see `settled_mem_available_kib`) and
    kata's sandboxes' PSS is read once they run; `hold` turns it off, as its waves would
    only wait for it. `config`: a configuration file for `ctr run --runtime-config-path`
    (`pool` passes its factory's)."""
    ids = [h.new_id(side[0] + "d") for _ in range(count)]
    before = settled_mem_available_kib() if detail else mem_available_kib()
    cpu0 = busy_cpu_s()
    poll_cpu = 0.0
    m0 = time.monotonic()
    procs = {cid: spawn(h.run_args(side, cid, ["sleep", "600"], detach=True, rm=False,
                                   config=config),
                        env=h.env) for cid in ids}
    failed = set()
    running = set()
    deadline = m0 + DENSITY_TIMEOUT
    t_all = None
    while True:
        for cid, p in procs.items():
            if cid not in failed and p.poll() is not None and p.returncode != 0:
                failed.add(cid)
        st, spent = children_cpu(h.tasks)
        poll_cpu += spent
        running = {c for c in ids if st.get(c) == "RUNNING"}
        if len(running) + len(failed - running) >= count and \
                all(p.poll() is not None for p in procs.values()):
            t_all = (time.monotonic() - m0) * 1000
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    cpu = busy_cpu_s() - cpu0 - poll_cpu
    after = mem_available_kib()
    pss, pss_less_tcg = pss_per_sandbox(running) if detail and side == "kata" else (None, None)
    for cid, p in procs.items():
        rc, _, err = reap(p, 5)
        if rc != 0:
            log("%s density: ctr run -d %s failed (rc %s): %s" % (side, cid, rc, err.strip()[-300:]))
    lost = count - len(running)
    used = (before - after) / 1024
    if not remove:
        return {"ids": ids, "lost": lost, "all_running_ms": t_all, "mem_mib": used,
                "mem_per_mib": used / len(running) if running else None,
                "pss_per_mib": pss, "pss_per_less_tcg_mib": pss_less_tcg,
                "mem_after_kib": after,
                "cpu_per_ms": cpu * 1000 / count if t_all is not None and lost == 0
                else None}
    h.remove(ids)
    left = [d for d in our_sandboxes() if any(d.endswith("/" + c) for c in ids)]
    deadline = time.monotonic() + 30
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = [d for d in our_sandboxes() if any(d.endswith("/" + c) for c in ids)]
    if left:
        log("%s density: left behind after removal: %s" % (side, left))
    return {"all_running_ms": t_all if lost == 0 else None, "lost": lost, "mem_mib": used,
            "mem_per_mib": used / len(running) if running else None,
            "pss_per_mib": pss, "pss_per_less_tcg_mib": pss_less_tcg,
            "cpu_per_ms": cpu * 1000 / count if t_all is not None and lost == 0 else None}


def children_cpu(fn):
    """fn()'s result and the CPU seconds its child processes spent (the bench's own `ctr
    task ls` polls, which the host-CPU figure leaves out)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = fn()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime


def pss_per_sandbox(cids):
    """Mean PSS (MiB) of kata sandboxes `cids`, all their processes, with and without the
    VMMs' TCG caches; (None, None) if any could not be read."""
    kids = children_map()
    got = [kata_pss(cid, kids) for cid in cids]
    if not got or any(g is None for g in got):
        return None, None
    return (sum(g["sum"] for g in got) / len(got),
            sum(g["sum_without_tcg_cache"] for g in got) / len(got))


def floor_at_once(h, count):
    """`count` bare boots (scripts/boot-floor.sh) spawned at once: ms until the last one
    powered off and the host's busy CPU ms per boot meanwhile, or (None, None) if any
    failed."""
    m0 = time.monotonic()
    cpu0 = busy_cpu_s()
    procs = [spawn(floor_cmd(h), env=h.env, stdout=subprocess.PIPE) for _ in range(count)]
    ok = True
    for p in procs:
        rc, out, err = reap(p, DENSITY_TIMEOUT)
        if rc != 0 or not FLOOR_MS.search(out):
            log("floor boot (%d at once) failed (rc %s): %s" % (count, rc, err[-300:]))
            ok = False
    if not ok:
        return None, None
    return (time.monotonic() - m0) * 1000, (busy_cpu_s() - cpu0) * 1000 / count


def ratio(many, one):
    return many / one if many is not None and one else None


def bench_density(h):
    res = {"kata": [], "runc": []}
    alone = {"kata": [], "runc": []}
    floor = {"one": [], "many": [], "ratio": [], "cpu": []}
    for i in range(DENSITY_RUNS):
        for side in ab_order(i):
            one = density_once(h, side, count=1)["all_running_ms"]
            r = density_once(h, side)
            r["ratio"] = ratio(r["all_running_ms"], one)
            res[side].append(r)
            alone[side].append(one)
            log("density run %d/%d %s: %s (one alone %s ms)" % (
                i + 1, DENSITY_RUNS, side, json.dumps(r), one))
        f1, _ = floor_at_once(h, 1)
        fn, fn_cpu = floor_at_once(h, DENSITY)
        floor["one"].append(f1)
        floor["many"].append(fn)
        floor["cpu"].append(fn_cpu)
        floor["ratio"].append(ratio(fn, f1))
        log("density run %d/%d floor: one %s ms, %d at once %s ms" % (
            i + 1, DENSITY_RUNS, f1, DENSITY, fn))
    sec = "6. density: %d sandboxes started in parallel (ctr run -d ... sleep 600)" % DENSITY
    R = h.report

    def col(side, k):
        return [r[k] for r in res[side] if r[k] is not None]
    R.add(sec, "density_all_running_ms", "time until all RUNNING", "ms",
          "from spawning the %d ctr run -d to `ctr task ls` showing all RUNNING (polled every "
          "~0.1 s); runs with losses excluded" % DENSITY,
          kata=col("kata", "all_running_ms"), runc=col("runc", "all_running_ms"))
    R.add(sec, "density_one_alone_ms", "  one sandbox alone", "ms",
          "the same for a single ctr run -d, just before the %d of each run" % DENSITY,
          kata=[v for v in alone["kata"] if v is not None],
          runc=[v for v in alone["runc"] if v is not None])
    R.add(sec, "density_ratio", "  all at once / one alone", "x",
          "per run (the goal: 3 or less)",
          kata=col("kata", "ratio"), runc=col("runc", "ratio"))
    R.add(sec, "density_floor_ms", "floor: %d bare boots at once" % DENSITY, "ms",
          "scripts/boot-floor.sh spawned %d times at once, until the last powered off: what "
          "booting the kernel alone costs when %d VMs share this host's cores" % (DENSITY, DENSITY),
          kata=[v for v in floor["many"] if v is not None])
    R.add(sec, "density_floor_ratio", "  / one bare boot", "x",
          "per run: the %d at once over one bare boot just before; the machine's own "
          "slow-down, below which ours cannot go" % DENSITY,
          kata=[v for v in floor["ratio"] if v is not None])
    R.add(sec, "density_mem_mib", "host memory used, total", "MiB",
          "MemAvailable (/proc/meminfo) before spawning minus when all were RUNNING; "
          "includes page cache and anything else on the host",
          kata=col("kata", "mem_mib"), runc=col("runc", "mem_mib"))
    R.add(sec, "density_mem_per_mib", "  per running sandbox", "MiB", "total / running",
          kata=col("kata", "mem_per_mib"), runc=col("runc", "mem_per_mib"))
    R.add(sec, "density_pss_per_mib", "  PSS per running sandbox", "MiB",
          "the PSS of every process of the running sandboxes (shim, VMM, virtiofsds, vsock "
          "backend; as in 5.), summed, over their count, when all were RUNNING: shared "
          "pages (QEMU's libraries, the kernel and initrd) split among them",
          kata=col("kata", "pss_per_mib"))
    R.add(sec, "density_pss_per_less_tcg_mib", "    of which not TCG's translation cache", "MiB",
          "the same less the VMMs' TCG caches (see 5.): about what these sandboxes would "
          "hold under KVM, which translates nothing (and has no TCG state in QEMU's own)",
          kata=col("kata", "pss_per_less_tcg_mib"))
    R.add(sec, "density_cpu_per_ms", "host CPU per sandbox", "ms",
          "the whole host's busy CPU time (/proc/stat, all cores) from spawning the %d to all "
          "RUNNING, less the bench's own `ctr task ls` polls, divided by %d: what starting "
          "one costs the machine, whoever spends it (VMM, guest, containerd, ctr run, ...); "
          "runs with losses excluded" % (DENSITY, DENSITY),
          kata=col("kata", "cpu_per_ms"), runc=col("runc", "cpu_per_ms"))
    R.add(sec, "density_floor_cpu_ms", "  floor: host CPU per bare boot", "ms",
          "the same over the %d bare boots at once" % DENSITY,
          kata=[v for v in floor["cpu"] if v is not None])
    R.add(sec, "density_lost", "lost (not RUNNING)", "count",
          "of %d: ctr run -d failed or not RUNNING within %d s" % (DENSITY, DENSITY_TIMEOUT),
          kata=col("kata", "lost"), runc=col("runc", "lost"))
