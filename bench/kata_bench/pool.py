"""10 + 11: the VM pool (issue 30). A factory (`kata-vm-factory init
--config F`, what `kata-runtime factory init` runs) started by the bench on the bench's
configuration plus `[factory] vm_cache_number`, ended by its pid (SIGTERM: it stops and
removes every VM it still offers), even when a measurement fails.

10. `ctr run --rm ... echo hi` from a pool of BENCH_POOL, next to a cold start and a bare
    boot (the floor) of the same run, with the shim's phases for both. The factory is
    stopped (SIGSTOP) during each timed run, so no refill overlaps it, then continued
    (SIGCONT); the next run waits until the pool is full again, and that wait is the
    refill's time (one VM booted at nice 19 until its agent answered).
11. BENCH_DENSITY sandboxes at once from a full pool of as many, and one alone from the
    pool, next to the same two cold; MemAvailable per running sandbox counted from before
    the factory started (so the pool VMs the sandboxes took are in it), and what a ready
    VM costs while it waits (PSS of its QEMU and helpers).
"""

import glob
import json
import os
import signal
import subprocess
import time

from .density import density_once, ratio
from .host import children_map, cmdline, pss_kib, qemu_memory_kib, sandbox_state, \
    settled_mem_available_kib, with_descendants
from .procs import run
from .report import fmt_num
from .settings import DENSITY, IMAGE, POOL, POOL_FILL_TIMEOUT, RUNS, VMDIR, log
from .startup import floor_boot, phases

CLAIMED = "VM claimed from pool"
HANDED = "VM handed over"
NEEDED = ["shim start", "agent reachable", "container started", "process exited"]


class FactoryFailed(RuntimeError):
    pass


class Factory:
    """One factory of `count` VMs on the bench configuration, its pool under the bench's
    work directory."""

    def __init__(self, h, count, tag):
        self.h = h
        self.count = count
        self.dir = os.path.join(h.work, "pool-" + tag)
        self.conf = os.path.join(h.work, "configuration-pool-%s.toml" % tag)
        self.logfile = os.path.join(h.work, "factory-%s.log" % tag)
        with open(h.conf) as f:
            base = f.read()
        with open(self.conf, "w") as f:
            f.write(base + '\n[factory]\nvm_cache_number = %d\nvm_cache_dir = "%s"\n'
                    % (count, self.dir))
        self.bin = os.path.join(h.shim_dir, "kata-vm-factory")
        self.proc = None
        self.seen = set()  # ids of every VM the pool offered, for the leftover check

    def start(self):
        with open(self.logfile, "wb") as out:
            self.proc = subprocess.Popen([self.bin, "init", "--config", self.conf],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         env=self.h.env, start_new_session=True)
        log("factory pid %d: %d VMs in %s" % (self.proc.pid, self.count, self.dir))

    def log_tail(self, n=1500):
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def ready(self):
        files = [p for p in glob.glob(os.path.join(self.dir, "*", "ready", "*.json"))
                 if not os.path.basename(p).startswith(".")]
        for p in files:
            self.seen.add(os.path.basename(p)[:-len(".json")])
        return files

    def wait_full(self):
        """Seconds until `count` VMs are ready; FactoryFailed if the factory ended or the
        pool was not full within BENCH_POOL_FILL_TIMEOUT."""
        m0 = time.monotonic()
        while len(self.ready()) < self.count:
            if self.proc.poll() is not None:
                raise FactoryFailed("the factory exited (rc %s): %s"
                                    % (self.proc.returncode, self.log_tail()))
            if time.monotonic() - m0 > POOL_FILL_TIMEOUT:
                raise FactoryFailed("the pool had %d of %d VMs ready after %d s: %s"
                                    % (len(self.ready()), self.count, POOL_FILL_TIMEOUT,
                                       self.log_tail()))
            time.sleep(0.05)
        return time.monotonic() - m0

    def pause(self):
        """No refill while a timed run goes on (claims are renames in the pool directory,
        which need no factory)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def ready_cost(self):
        """Mean PSS (MiB) of a ready VM's QEMU and helpers (virtiofsd, vsock backend, with
        their descendants), with and without TCG's cache; (None, None) if unreadable."""
        kids = children_map()
        sums, less = [], []
        for path in self.ready():
            try:
                with open(path) as f:
                    vm = json.load(f)
            except (OSError, ValueError):
                continue
            info = vm.get("info", {})
            tops = [info.get("vmm_pid", 0)] + list(info.get("helper_pids", [])) + \
                list(vm.get("virtiofsd_pids", []))
            pids = set()
            for p in tops:
                if p and p > 0:
                    pids.update(with_descendants(p, kids))
            vals = [pss_kib(p) for p in pids]
            if not pids or any(v is None for v in vals):
                continue
            total = sum(vals) / 1024
            parts = qemu_memory_kib(info.get("vmm_pid", 0)) or {}
            sums.append(total)
            less.append(total - parts.get("tcg_cache", 0) / 1024)
        if not sums:
            return None, None
        return sum(sums) / len(sums), sum(less) / len(less)

    def ready_pids(self):
        """The processes of every ready VM (QEMU, helpers, their descendants)."""
        kids = children_map()
        pids = set()
        for path in self.ready():
            try:
                with open(path) as f:
                    vm = json.load(f)
            except (OSError, ValueError):
                continue
            info = vm.get("info", {})
            for p in [info.get("vmm_pid", 0)] + list(info.get("helper_pids", [])) + \
                    list(vm.get("virtiofsd_pids", [])):
                if p and p > 0:
                    pids.update(with_descendants(p, kids))
        return pids

    def idle_cpu(self, seconds=3.0):
        """Host CPU (ms per second, per ready VM) the ready VMs spend while they wait:
        utime + stime of their processes (all threads) over `seconds`."""
        pids = self.ready_pids()
        n = len(self.ready())
        c0 = {p: cpu_ticks(p) for p in pids}
        time.sleep(seconds)
        spent = 0
        for p, t0 in c0.items():
            t1 = cpu_ticks(p)
            if t0 is not None and t1 is not None:
                spent += t1 - t0
        if not n:
            return None
        return spent * 1000 / os.sysconf("SC_CLK_TCK") / seconds / n

    def stop(self):
        """Ends the factory by its pid and checks that its VMs are gone; the problems."""
        problems = []
        if self.proc is None:
            return problems
        p = self.proc
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                problems.append("factory %d did not stop within 90 s of SIGTERM; killed"
                                % p.pid)
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        if p.returncode != 0:
            problems.append("factory exited with rc %s: %s" % (p.returncode, self.log_tail(500)))
        self.ready()
        if glob.glob(os.path.join(self.dir, "*", "ready", "*")):
            # What a factory that died left: `destroy` removes it.
            rc, out, err = run([self.bin, "destroy", "--config", self.conf],
                               timeout=120, env=self.h.env)
            problems.append("ready VMs left after the factory stopped; `factory destroy`: "
                            "rc %s %s" % (rc, (err or out)[-300:]))
        with open("/proc/self/mountinfo") as f:
            mounts = [ln.split()[4] for ln in f if self.dir in ln.split()[4]]
        if mounts:
            problems.append("mounts left under the pool: %s" % mounts)
        left = [d for d in self.seen if os.path.exists(os.path.join(VMDIR, d))]
        if left:
            problems.append("pool VM run directories left: %s" % left)
        procs = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                a = " ".join(cmdline(int(d)))
                if any(("/" + i) in a for i in self.seen) or self.dir in a:
                    procs.append("%s: %s" % (d, a[:160]))
        if procs:
            problems.append("pool processes left: %s" % procs)
        self.proc = None
        return problems


def cpu_ticks(pid):
    """utime + stime of a process, all its threads, in clock ticks; None if gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def records_first(h, cid):
    first = {}
    for r in h.shim_records(cid):
        name = r.get("phase") or r.get("msg")
        if name:
            first.setdefault(name, r)
    return first


def pooled(h, cid):
    """Whether sandbox `cid` runs on a pooled VM: its persist.json says so while it exists
    (the shim's records come through containerd's log, which can lose a line when many
    shims write at once); a removed sandbox's records say whether it claimed one."""
    st = sandbox_state(cid)
    if st is not None:
        return bool(st.get("pooled"))
    return CLAIMED in records_first(h, cid)


def why_cold(h, cid):
    """What the shim of `cid` logged about not using the pool (its 'booting cold' lines,
    warnings and errors), for the report's notes."""
    out = []
    for r in h.shim_records(cid):
        msg = r.get("msg", "")
        if "cold" in msg or r.get("level") in ("warn", "WARN", "error", "ERRO", "WARNING",
                                                   "ERROR"):
            extra = {k: v for k, v in r.items()
                     if k not in ("msg", "ts", "_ns", "sandbox", "level", "pid")}
            out.append("%s %s" % (msg, json.dumps(extra)[:300]))
    return "; ".join(out) or "no 'booting cold' line"


def pool_phases(h, cid, t0, t1):
    """The rows' phases of one `ctr run --rm ... echo hi` (pool or cold), ms; None if the
    shim's records lack one."""
    f = records_first(h, cid)
    if any(n not in f for n in NEEDED):
        log("sandbox %s: log records missing: %s" % (cid, [n for n in NEEDED if n not in f]))
        return None
    t = {n: f[n]["_ns"] for n in NEEDED}

    def ms(a, b):
        return (b - a) / 1e6
    out = {
        "ctr_to_shim": ms(t0, t["shim start"]),
        "shim_to_agent": ms(t["shim start"], t["agent reachable"]),
        "agent_to_started": ms(t["agent reachable"], t["container started"]),
        "started_to_exited": ms(t["container started"], t["process exited"]),
        "exited_to_ctr_end": ms(t["process exited"], t1),
    }
    if CLAIMED in f and HANDED in f:
        out["shim_to_claimed"] = ms(t["shim start"], f[CLAIMED]["_ns"])
        out["claimed_to_handed"] = ms(f[CLAIMED]["_ns"], f[HANDED]["_ns"])
        out["handed_to_agent"] = ms(f[HANDED]["_ns"], t["agent reachable"])
    if "VMM launched" in f:
        out["shim_to_vmm"] = ms(t["shim start"], f["VMM launched"]["_ns"])
        out["vmm_to_agent"] = ms(f["VMM launched"]["_ns"], t["agent reachable"])
    return out


def timed_echo(h, tag, config=None):
    cid = h.new_id(tag)
    t0 = time.time_ns()
    m0 = time.monotonic()
    rc, out, err = run(h.run_args("kata", cid, ["echo", "hi"], config=config), env=h.env)
    ms = (time.monotonic() - m0) * 1000
    t1 = time.time_ns()
    if rc != 0 or out.strip() != "hi":
        log("%s echo run %s failed (rc %s): %s" % (tag, cid, rc, (err or out)[-500:]))
        h.remove([cid], timeout=30)
        return None, cid, t0, t1
    return ms, cid, t0, t1


PHASE_ROWS = [
    ("ctr_to_shim", "ctr spawned -> shim start"),
    ("shim_to_agent", "shim start -> agent reachable"),
    ("shim_to_claimed", "  of which: -> VM claimed from pool"),
    ("claimed_to_handed", "  of which: claimed -> VM handed over"),
    ("handed_to_agent", "  of which: handed over -> agent reachable"),
    ("shim_to_vmm", "  of which: -> VMM launched"),
    ("vmm_to_agent", "  of which: VMM launched -> agent reachable"),
    ("agent_to_started", "agent reachable -> container started"),
    ("started_to_exited", "container started -> process exited"),
    ("exited_to_ctr_end", "process exited -> ctr returned"),
]


def bench_echo(h, problems):
    v = {"pool": [], "cold": [], "floor": [], "ratio": [], "minus_floor": [], "refill": [],
         "fill": []}
    fails = {"pool": 0, "cold": 0, "floor": 0, "not_pooled": 0}
    ph = {"pool": [], "cold": []}
    f = Factory(h, POOL, "echo")
    try:
        f.start()
        v["fill"].append(f.wait_full() * 1000)
        log("pool of %d full after %.0f ms" % (POOL, v["fill"][0]))
        for i in range(RUNS):
            got = {}
            for side in (["pool", "cold"] if i % 2 == 0 else ["cold", "pool"]):
                if side == "pool":
                    f.pause()
                    try:
                        ms, cid, t0, t1 = timed_echo(h, "kp", config=f.conf)
                    finally:
                        f.resume()
                    v["refill"].append(f.wait_full() * 1000)
                    if ms is not None and not pooled(h, cid):
                        h.report.notes.append("pool: echo run %s booted cold: %s"
                                              % (cid, why_cold(h, cid)))
                        fails["not_pooled"] += 1
                        ms = None
                else:
                    ms, cid, t0, t1 = timed_echo(h, "kc")
                got[side] = ms
                if ms is None:
                    fails[side] += 1
                    continue
                v[side].append(ms)
                p = pool_phases(h, cid, t0, t1)
                if p:
                    ph[side].append(p)
                if side == "cold" and h.accel is None:
                    phases(h, cid, t0, t1)  # learns the accelerator for the floor
            fl = floor_boot(h)
            if fl is None:
                fails["floor"] += 1
            else:
                v["floor"].append(fl)
            if got.get("pool") is not None and got.get("cold"):
                v["ratio"].append(got["pool"] / got["cold"])
            if got.get("pool") is not None and fl is not None:
                v["minus_floor"].append(got["pool"] - fl)
            log("pool run %d/%d: pool %s ms, cold %s ms, floor %s ms, refill %s ms" % (
                i + 1, RUNS, fmt_num(got.get("pool"), "ms"), fmt_num(got.get("cold"), "ms"),
                fmt_num(fl, "ms"), fmt_num(v["refill"][-1] if v["refill"] else None, "ms")))
    finally:
        problems += f.stop()
    R = h.report
    sec = ("10. VM pool: ctr run --rm %s x echo hi from a pool of %d (BENCH_POOL), next to "
           "a cold start and a bare boot of the same run" % (IMAGE, POOL))
    R.add(sec, "pool_run_echo_ms", "from the pool: ctr run --rm ... echo hi", "ms",
          "wall time of the ctr command (spawned to exited), output checked, with "
          "--runtime-config-path = the bench configuration + [factory] vm_cache_number = "
          "%d; the factory SIGSTOPped during the run (no refill overlaps it); runs the shim "
          "booted cold count as failed" % POOL,
          kata=v["pool"], failed={"kata": fails["pool"] + fails["not_pooled"]}, single=True)
    R.add(sec, "pool_cold_echo_ms", "cold, same runs", "ms",
          "the same without [factory] (a boot per sandbox), alternating with the pool runs",
          kata=v["cold"], failed={"kata": fails["cold"]}, single=True)
    R.add(sec, "pool_floor_ms", "floor: bare boot, same runs", "ms",
          "scripts/boot-floor.sh after each pair, as in 1.", kata=v["floor"],
          failed={"kata": fails["floor"]}, single=True)
    R.add(sec, "pool_over_cold", "  pool / cold", "x",
          "per run (the goal: 0.5 or less)", kata=v["ratio"], single=True)
    R.add(sec, "pool_minus_floor_ms", "  pool - floor", "ms",
          "per run (the goal: below 0, i.e. faster than a bare boot)", kata=v["minus_floor"],
          single=True)
    R.add(sec, "pool_refill_ms", "refill: one VM until ready again", "ms",
          "from SIGCONT of the factory after a pool run until %d VMs are ready again (one "
          "boot at nice 19, agent Check, ready file); the next run waits for it" % POOL,
          kata=v["refill"], single=True)
    R.add(sec, "pool_fill_ms", "first fill: %d VMs" % POOL, "ms",
          "factory started until %d ready (one boot at a time)" % POOL, kata=v["fill"],
          single=True)
    for side in ("pool", "cold"):
        for key, label in PHASE_ROWS:
            vals = [p[key] for p in ph[side] if p.get(key) is not None]
            if not vals:
                continue
            R.add(sec, "pool_phase_%s_%s_ms" % (side, key), "%s: %s" % (side, label), "ms",
                  "ts of the shim's phase records (see 2.); pool: 'VM claimed from pool' "
                  "and 'VM handed over' replace 'VMM launched'", kata=vals, single=True)
    if fails["not_pooled"]:
        R.notes.append("pool: %d run(s) booted cold although the pool was full"
                       % fails["not_pooled"])


def bench_density_pool(h, problems):
    sec = ("11. VM pool: %d sandboxes at once (ctr run -d ... sleep 600), from a full pool "
           "of %d and cold" % (DENSITY, DENSITY))
    R = h.report
    # Cold first, with no pool VM on the host.
    one_cold = density_once(h, "kata", count=1)
    many_cold = density_once(h, "kata")
    log("pool density cold: one %s, %d at once %s" % (one_cold["all_running_ms"], DENSITY,
                                                        json.dumps(many_cold)))
    base = settled_mem_available_kib(timeout=10)
    f = Factory(h, DENSITY, "density")
    res = {}
    try:
        f.start()
        fill = f.wait_full() * 1000
        time.sleep(2)  # the ready VMs settle (free page reporting), as the idle row does
        full = settled_mem_available_kib(timeout=10)
        cost, cost_less = f.ready_cost()
        idle_cpu = f.idle_cpu()
        log("pool of %d full after %.0f ms; ready VM PSS %s MiB (%s without TCG's cache); "
            "MemAvailable drop %.1f MiB per ready VM" % (
                DENSITY, fill, fmt_num(cost, "MiB"), fmt_num(cost_less, "MiB"),
                (base - full) / 1024 / DENSITY))
        f.pause()
        try:
            one = density_once(h, "kata", count=1, remove=False, config=f.conf)
        finally:
            f.resume()
        one_pooled = all(pooled(h, c) for c in one["ids"])
        h.remove(one["ids"])
        f.wait_full()
        time.sleep(2)
        f.pause()
        try:
            many = density_once(h, "kata", remove=False, config=f.conf)
            left_ready = len(f.ready())
        finally:
            f.resume()
        n_pooled = sum(1 for c in many["ids"] if pooled(h, c))
        for c in many["ids"]:
            if not pooled(h, c):
                R.notes.append("pool: %s of the %d at once booted cold: %s"
                               % (c, DENSITY, why_cold(h, c)))
            elif CLAIMED not in records_first(h, c):
                R.notes.append("pool: containerd's log lacks the claim record of %s, which "
                               "persist.json says runs on a pooled VM" % c)
        h.remove(many["ids"])
        res = {"fill": fill, "cost": cost, "cost_less": cost_less, "idle_cpu": idle_cpu,
               "per_ready": (base - full) / 1024 / DENSITY, "one": one, "many": many,
               "one_pooled": one_pooled, "n_pooled": n_pooled, "left_ready": left_ready,
               "base": base, "full": full}
        log("pool density: one %s (pooled %s), %d at once %s (%d pooled, %d ready left)" % (
            one["all_running_ms"], one_pooled, DENSITY, json.dumps(
                {k: many[k] for k in ("all_running_ms", "lost", "mem_mib", "pss_per_mib")}),
            n_pooled, left_ready))
    finally:
        problems += f.stop()
    one, many = res["one"], res["many"]
    t_many = many["all_running_ms"] if many["lost"] == 0 else None
    t_one = one["all_running_ms"] if one["lost"] == 0 and res["one_pooled"] else None
    t_many_cold = many_cold["all_running_ms"]
    running = DENSITY - many["lost"]
    honest = (res["base"] - many["mem_after_kib"]) / 1024 / running if running else None
    if honest is not None and (honest <= 0 or res["per_ready"] <= 0):
        R.notes.append("pool: MemAvailable rose while the pool filled or the sandboxes "
                       "started (other processes on this host freed memory): the MemAvailable "
                       "rows of 11. do not measure the pool in this run; PSS rows do")
    R.add(sec, "pool_density_all_running_ms", "from the pool: time until all RUNNING", "ms",
          "as 6. (spawning the %d ctr run -d to all RUNNING in `ctr task ls`), with the "
          "pool's configuration, from %d ready VMs, the factory SIGSTOPped (no refill)"
          % (DENSITY, DENSITY), kata=[t_many], single=True)
    R.add(sec, "pool_density_one_ms", "  one alone from the pool", "ms",
          "the same for one ctr run -d from the full pool, just before", kata=[t_one],
          single=True)
    R.add(sec, "pool_density_ratio", "  all at once / one alone", "x",
          "(the goal: 3 or less)", kata=[ratio(t_many, t_one)], single=True)
    R.add(sec, "pool_density_pooled", "  sandboxes that got a pooled VM", "count",
          "of %d: shim records with phase 'VM claimed from pool'" % DENSITY,
          kata=[res["n_pooled"]], single=True)
    R.add(sec, "pool_density_lost", "  lost (not RUNNING)", "count",
          "of %d, as 6." % DENSITY, kata=[many["lost"]], single=True)
    cpu_many, cpu_one = many.get("cpu_per_ms"), one.get("cpu_per_ms")
    ncpu = os.cpu_count() or 1
    floor_ratio = (cpu_many * DENSITY / ncpu / t_one
                   if cpu_many is not None and t_one else None)
    R.add(sec, "pool_density_cpu_per_ms", "  host CPU per sandbox, all at once", "ms",
          "busy CPU time of the whole host (every process, /proc/stat) from spawning the "
          "%d ctr run -d until all RUNNING, less the bench's own polls, over %d"
          % (DENSITY, DENSITY), kata=[cpu_many], single=True)
    R.add(sec, "pool_density_cpu_one_ms", "    one alone", "ms",
          "the same for the one started alone", kata=[cpu_one], single=True)
    R.add(sec, "pool_density_cpu_floor_ratio", "  this machine's floor for all at once / one",
          "x", "the least ratio the %d CPUs allow: the CPU that %d starts spent (the row "
          "two above, times %d) spread evenly over every CPU, over one alone's time; a "
          "ratio goal below it cannot be shown on this machine" % (ncpu, DENSITY, DENSITY),
          kata=[floor_ratio], single=True)
    R.add(sec, "pool_density_mem_per_mib", "  MemAvailable drop per sandbox, pool counted",
          "MiB", "MemAvailable before the factory started minus with all %d RUNNING (the "
          "pool empty then: every ready VM was claimed, the factory stopped), over the "
          "running count: the full cost of a pooled sandbox (the goal: 40 or less)" % DENSITY,
          kata=[honest], single=True)
    R.add(sec, "pool_density_mem_claim_mib", "    of which after the claim", "MiB",
          "MemAvailable with the pool full minus with all %d RUNNING, per sandbox: what a "
          "start from the pool adds to a ready VM" % DENSITY,
          kata=[many["mem_per_mib"]], single=True)
    R.add(sec, "pool_density_pss_mib", "  PSS per running sandbox", "MiB",
          "as 6.", kata=[many["pss_per_mib"]], single=True)
    R.add(sec, "pool_density_pss_less_tcg_mib", "    of which not TCG's cache", "MiB",
          "as 6.", kata=[many["pss_per_less_tcg_mib"]], single=True)
    R.add(sec, "pool_ready_vm_pss_mib", "a ready VM, idle: PSS", "MiB",
          "QEMU + virtiofsds + vsock backend (+ descendants) of each ready VM (pids from "
          "its ready file), with the pool of %d full and settled, averaged: what each VM "
          "the factory keeps costs while nobody uses it" % DENSITY,
          kata=[res["cost"]], single=True)
    R.add(sec, "pool_ready_vm_pss_less_tcg_mib", "  of which not TCG's cache", "MiB",
          "the same less QEMU's translation cache", kata=[res["cost_less"]], single=True)
    R.add(sec, "pool_ready_vm_cpu_ms_per_s", "  host CPU of a ready VM, idle", "ms/s",
          "utime + stime of every ready VM's processes (all threads) over 3 s with the "
          "pool of %d full, per VM per second: what waiting costs the host's CPUs "
          "(the guest's timer ticks, translated under TCG)" % DENSITY,
          kata=[res["idle_cpu"]], single=True)
    R.add(sec, "pool_ready_vm_mem_mib", "  MemAvailable drop per ready VM", "MiB",
          "MemAvailable before the factory started minus with the pool full, over %d"
          % DENSITY, kata=[res["per_ready"]], single=True)
    R.add(sec, "pool_density_fill_ms", "  filling the pool of %d" % DENSITY, "ms",
          "factory started until %d VMs ready" % DENSITY, kata=[res["fill"]], single=True)
    R.add(sec, "pool_density_cold_ms", "cold: time until all RUNNING", "ms",
          "as 6., without a pool, in this run", kata=[t_many_cold], single=True)
    R.add(sec, "pool_density_cold_one_ms", "  one alone, cold", "ms", "as 6.",
          kata=[one_cold["all_running_ms"]], single=True)
    R.add(sec, "pool_density_cold_ratio", "  all at once / one alone", "x", "as 6.",
          kata=[ratio(t_many_cold, one_cold["all_running_ms"])], single=True)
    R.add(sec, "pool_density_cold_lost", "  lost (not RUNNING)", "count", "as 6.",
          kata=[many_cold["lost"]], single=True)
    R.add(sec, "pool_density_cold_mem_per_mib", "  MemAvailable drop per sandbox", "MiB",
          "as 6.", kata=[many_cold["mem_per_mib"]], single=True)
    R.add(sec, "pool_density_cold_pss_mib", "  PSS per running sandbox", "MiB", "as 6.",
          kata=[many_cold["pss_per_mib"]], single=True)
    R.add(sec, "pool_density_cold_pss_less_tcg_mib", "    of which not TCG's cache", "MiB",
          "as 6.", kata=[many_cold["pss_per_less_tcg_mib"]], single=True)


def bench_pool(h):
    problems = []
    try:
        bench_echo(h, problems)
        bench_density_pool(h, problems)
    finally:
        for p in problems:
            log("pool problem: " + p)
            h.report.notes.append("pool: " + p)
