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

Env: BENCH_RUNS (5), BENCH_DENSITY (10), BENCH_DENSITY_RUNS (BENCH_RUNS),
BENCH_STDOUT_BYTES (268435456), BENCH_CMD_TIMEOUT (s, 120: any single ctr command),
BENCH_STDOUT_TIMEOUT (s, 600: one 256 MiB transfer), BENCH_DENSITY_TIMEOUT (s, 300),
BENCH_DEADLINE (s, 5400: the whole bench), BENCH_OUT (target/bench), BENCH_SKIP (comma list
of: startup,stdout,idle,density), KATA_KERNEL, KATA_INITRD, IMAGE_TAR, KATA_SHIM_DIR.
Only the Python standard library is used.
"""

import datetime
import json
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = "docker.io/library/busybox:latest"
RT = {"kata": "io.containerd.kata.v2", "runc": "io.containerd.runc.v2"}
NS = "bench"
PREFIX = "kb%d" % os.getpid()  # every container id this bench makes starts with this
SBS = "/run/vc/sbs"
VMDIR = "/run/vc/vm"
BENCH_SINK_PORT = 1025
BENCH_SINK_PARAM = "agent.bench_sink=1"  # kernel_params word that turns the sink on
MB = 1e6


def env_int(name, default):
    v = os.environ.get(name, "")
    try:
        return int(v) if v else default
    except ValueError:
        sys.exit("bench: %s=%r is not an integer" % (name, v))


RUNS = max(1, env_int("BENCH_RUNS", 5))
DENSITY = max(1, env_int("BENCH_DENSITY", 10))
DENSITY_RUNS = max(1, env_int("BENCH_DENSITY_RUNS", RUNS))
# Whole MiB: the container writes with `dd bs=1M` (busybox `head -c` costs more guest CPU
# per byte than the channel does under TCG, so it would measure itself, not the channel).
STDOUT_BYTES = max(1, env_int("BENCH_STDOUT_BYTES", 256 << 20) >> 20) << 20
CMD_TIMEOUT = env_int("BENCH_CMD_TIMEOUT", 120)
STDOUT_TIMEOUT = env_int("BENCH_STDOUT_TIMEOUT", 600)
DENSITY_TIMEOUT = env_int("BENCH_DENSITY_TIMEOUT", 300)
DEADLINE = env_int("BENCH_DEADLINE", 5400)
SKIP = set(s.strip() for s in os.environ.get("BENCH_SKIP", "").split(",") if s.strip())


def log(msg):
    print("bench: " + msg, file=sys.stderr, flush=True)


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted("signal %d" % signum)


def on_alarm(_signum, _frame):
    raise Interrupted("BENCH_DEADLINE of %d s reached" % DEADLINE)


# ---------------------------------------------------------------------------------------
# Child processes: each in its own session (process group = its pid), remembered until it
# ends, so cleanup can kill whatever is still running by pid.
LIVE = {}


def spawn(cmd, env=None, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE):
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                         stderr=stderr, start_new_session=True)
    LIVE[p.pid] = p
    return p


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap(p, timeout):
    """Waits for p up to timeout s (then kills its group); returns (rc or None, out, err)."""
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        kill_group(p)
        out, err = p.communicate()
        rc = None
    finally:
        LIVE.pop(p.pid, None)
    return rc, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")


def run(cmd, timeout=None, env=None):
    p = spawn(cmd, env=env, stdout=subprocess.PIPE)
    return reap(p, timeout or CMD_TIMEOUT)


# ---------------------------------------------------------------------------------------
# Statistics and reporting.
def summary(values):
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "n": len(vals), "values": vals}


class Report:
    def __init__(self):
        self.rows = []  # (section, key, label, unit, {side: summary or None}, failures, how)
        self.notes = []

    def add(self, section, key, label, unit, how, kata=None, runc=None, failed=None,
            single=False):
        sides = {}
        if kata is not None:
            sides["kata"] = summary(kata)
        if runc is not None:
            sides["runc"] = summary(runc)
        self.rows.append({"section": section, "key": key, "label": label, "unit": unit,
                          "how": how, "figures": sides, "failed": failed or {},
                          "single_side": single})


def fmt_num(v, unit):
    if v is None:
        return "-"
    if unit in ("ms",):
        return "%.0f" % v
    if unit in ("count",):
        return "%.0f" % v
    return "%.1f" % v


def fmt_cell(s, unit, failed):
    if s is None:
        txt = "n/a"
    else:
        lo, mid, hi = (fmt_num(s[k], unit) for k in ("min", "median", "max"))
        txt = mid if lo == hi else "%s [%s..%s]" % (mid, lo, hi)
    if failed:
        txt += " (%d failed)" % failed
    return txt


def print_table(report, header):
    """The table, one row per figure, each pointing at a footnote that says how it was measured."""
    cells = []
    for r in report.rows:
        f = r["figures"]
        kc = fmt_cell(f["kata"], r["unit"], r["failed"].get("kata")) if "kata" in f else ""
        uc = fmt_cell(f["runc"], r["unit"], r["failed"].get("runc")) if "runc" in f else ""
        cells.append(("%s (%s)" % (r["label"], r["unit"]), kc, uc))
    w = [max([len(h)] + [len(c[i]) for c in cells])
         for i, h in enumerate(("figure", "kata (ours)", "runc"))]
    fmt = "%%-%ds  %%-%ds  %%-%ds  %%s" % tuple(w)
    out = [header, "", fmt % ("figure", "kata (ours)", "runc", "how")]
    section = None
    for n, (r, c) in enumerate(zip(report.rows, cells), 1):
        if r["section"] != section:
            section = r["section"]
            out.append("-- " + section)
        out.append((fmt % (c + ("[%d]" % n,))).rstrip())
    out.append("")
    out.append("median [min..max] over the runs; MB = 10^6 bytes, MiB = 2^20 bytes; how:")
    for n, r in enumerate(report.rows, 1):
        out.append("[%d] %s" % (n, r["how"]))
    for n in report.notes:
        out.append("note: " + n)
    text = "\n".join(out)
    print(text, flush=True)
    return text


# ---------------------------------------------------------------------------------------
# Host inspection.
def parse_ts(ts):
    """RFC3339 with up to nanoseconds -> ns since the epoch (int)."""
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", ts)
    if not m:
        raise ValueError("bad ts %r" % ts)
    base = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")
    if m.group(3) == "Z":
        off = 0
    else:
        sign = 1 if m.group(3)[0] == "+" else -1
        off = sign * (int(m.group(3)[1:3]) * 3600 + int(m.group(3)[4:6]) * 60)
    secs = int(base.replace(tzinfo=datetime.timezone.utc).timestamp()) - off
    frac = (m.group(2) or "0")[:9].ljust(9, "0")
    return secs * 1_000_000_000 + int(frac)


def pss_kib(pid):
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def children_map():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
        except OSError:
            continue
        ppid = int(st.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def with_descendants(pid, kids):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def mem_available_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def our_sandboxes():
    found = set()
    for root in (SBS, VMDIR):
        try:
            found.update("%s/%s" % (root, d) for d in os.listdir(root) if d.startswith(PREFIX))
        except FileNotFoundError:
            pass
    return sorted(found)


def listing(root):
    try:
        return sorted(os.listdir(root))
    except FileNotFoundError:
        return []


# ---------------------------------------------------------------------------------------
class Bench:
    def __init__(self):
        self.work = tempfile.mkdtemp(prefix="kata-bench.", dir="/tmp")
        self.cdir = os.path.join(self.work, "c")
        self.sock = os.path.join(self.cdir, "containerd.sock")
        self.fifo = os.path.join(self.work, "fifo")
        self.logfile = os.path.join(self.cdir, "containerd.log")
        self.kernel = os.environ.get("KATA_KERNEL") or ""
        self.initrd = os.environ.get("KATA_INITRD", "/var/cache/kata-guest/kata-initrd.img")
        self.image_tar = os.environ.get("IMAGE_TAR", "/var/cache/kata-guest/busybox-image.tar")
        shim_dir = os.environ.get("KATA_SHIM_DIR", os.path.join(REPO, "target", "release"))
        self.shim_dir = shim_dir
        self.conf = os.path.join(self.work, "configuration.toml")
        self.env = dict(os.environ)
        self.env["PATH"] = shim_dir + ":" + os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        self.env["KATA_CONF_FILE"] = self.conf
        self.containerd_started = False
        self.seq = 0
        self.accel = None
        self.report = Report()
        self.sbs_before = listing(SBS)
        self.vm_before = listing(VMDIR)

    # -- helpers ------------------------------------------------------------------------
    def new_id(self, tag):
        self.seq += 1
        return "%s-%s%d" % (PREFIX, tag, self.seq)

    def ctr_cmd(self, *args):
        return ["ctr", "-a", self.sock, "-n", NS] + list(args)

    def ctr(self, *args, timeout=None):
        return run(self.ctr_cmd(*args), timeout=timeout, env=self.env)

    def run_args(self, side, cid, cmd, detach=False, rm=True):
        a = ["run", "--runtime", RT[side], "--fifo-dir", self.fifo]
        if detach:
            a.append("-d")
        if rm:
            a.append("--rm")
        return self.ctr_cmd(*(a + [IMAGE, cid] + cmd))

    def log_lines(self, sandbox):
        """The shim's JSON log lines of one sandbox, from containerd's log."""
        out = []
        try:
            with open(self.logfile, errors="replace") as f:
                for line in f:
                    if '"sandbox"' not in line or not line.startswith("{"):
                        continue
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if rec.get("sandbox") == sandbox and "ts" in rec:
                        rec["_ns"] = parse_ts(rec["ts"])
                        out.append(rec)
        except FileNotFoundError:
            pass
        return out

    def tasks(self):
        rc, out, _ = self.ctr("task", "ls", timeout=30)
        st = {}
        if rc == 0:
            for line in out.splitlines()[1:]:
                f = line.split()
                if len(f) >= 3:
                    st[f[0]] = f[2]
        return st

    def wait_running(self, ids, timeout):
        deadline = time.monotonic() + timeout
        while True:
            st = self.tasks()
            if all(st.get(i) == "RUNNING" for i in ids):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def remove(self, ids, timeout=None):
        """Kills and deletes tasks and containers, in parallel, bounded."""
        procs = [spawn(self.ctr_cmd("task", "rm", "-f", i), env=self.env) for i in ids]
        for p in procs:
            reap(p, timeout or CMD_TIMEOUT)
        procs = [spawn(self.ctr_cmd("container", "rm", i), env=self.env) for i in ids]
        for p in procs:
            reap(p, timeout or CMD_TIMEOUT)

    # -- set-up -----------------------------------------------------------------------
    def setup(self):
        if not self.kernel:
            rc, out, err = run(["bash", os.path.join(REPO, "guest/build-kernel.sh")], timeout=60)
            if rc != 0:
                raise RuntimeError("guest/build-kernel.sh failed: " + err[-2000:])
            self.kernel = out.strip().splitlines()[-1]
        for what, path in (("kernel", self.kernel), ("initrd", self.initrd),
                           ("image", self.image_tar)):
            if not os.path.isfile(path):
                raise RuntimeError("%s %s missing (run `make bench`, which builds it)" % (what, path))
        # The agent starts its bench sink (vsock port 1025, read by vsock_ceiling) only when
        # the kernel command line asks for it; production sandboxes have no such port.
        with open(self.conf, "w") as f:
            f.write('[hypervisor.qemu]\nkernel = "%s"\ninitrd = "%s"\nvsock_backend = "%s/kata-vsock"\n'
                    'kernel_params = "%s"\n[runtime]\nenable_debug = true\n'
                    % (self.kernel, self.initrd, self.shim_dir, BENCH_SINK_PARAM))
        self.floor_initrd = os.path.join(self.work, "floor.img")
        rc, _, err = run(["bash", os.path.join(REPO, "guest/build-floor-initrd.sh"),
                          self.floor_initrd], timeout=300)
        if rc != 0:
            raise RuntimeError("guest/build-floor-initrd.sh failed: " + err[-2000:])
        self.containerd_started = True  # from here on, cleanup stops it (harmless if absent)
        rc, out, err = run(["bash", os.path.join(REPO, "scripts/containerd-private.sh"), "start",
                            self.cdir], timeout=60, env=self.env)
        if rc != 0:
            raise RuntimeError("starting the private containerd failed: " + err[-2000:])
        rc, _, err = self.ctr("images", "import", self.image_tar, timeout=120)
        if rc != 0:
            raise RuntimeError("importing %s failed: %s" % (self.image_tar, err[-2000:]))
        log("private containerd at %s, image imported" % self.sock)

    # -- 1 + 2: start-up ----------------------------------------------------------------
    def timed_echo(self, side):
        cid = self.new_id(side[0] + "s")
        t0 = time.time_ns()
        m0 = time.monotonic()
        rc, out, err = run(self.run_args(side, cid, ["echo", "hi"]), env=self.env)
        ms = (time.monotonic() - m0) * 1000
        t1 = time.time_ns()
        if rc != 0 or out.strip() != "hi":
            log("%s echo run %s failed (rc %s): %s" % (side, cid, rc, (err or out)[-500:]))
            self.remove([cid], timeout=30)
            return None, cid, t0, t1
        return ms, cid, t0, t1

    def floor_boot(self):
        accel = self.accel or "tcg"
        rc, out, err = run(["bash", os.path.join(REPO, "scripts/boot-floor.sh"), self.kernel,
                            self.floor_initrd, accel], timeout=120)
        m = re.search(r"floor-boot-ms: (\d+)", out)
        if rc != 0 or not m:
            log("floor boot failed (rc %s): %s" % (rc, err[-500:]))
            return None
        return float(m.group(1))

    def phases(self, cid, t_ctr0, t_ctr1):
        recs = self.log_lines(cid)
        first = {}
        for r in recs:
            first.setdefault(r["msg"], r)
        need = ["phase: shim start", "phase: VMM launched", "phase: agent reachable",
                "phase: container created", "phase: container started", "process exited"]
        missing = [n for n in need if n not in first]
        if missing:
            log("sandbox %s: log lines missing: %s" % (cid, missing))
            return None
        if self.accel is None:
            self.accel = first["phase: VMM launched"].get("accelerator")

        def ms(a, b):
            return (b - a) / 1e6
        t = {n: first[n]["_ns"] for n in need}
        d = first.get("delete")
        res = {
            "ctr_to_shim": ms(t_ctr0, t["phase: shim start"]),
            "shim_to_vmm": ms(t["phase: shim start"], t["phase: VMM launched"]),
            "vmm_to_agent": ms(t["phase: VMM launched"], t["phase: agent reachable"]),
            "agent_to_started": ms(t["phase: agent reachable"], t["phase: container started"]),
            "agent_to_created": ms(t["phase: agent reachable"], t["phase: container created"]),
            "created_to_started": ms(t["phase: container created"], t["phase: container started"]),
            "started_to_exited": ms(t["phase: container started"], t["process exited"]),
            "exited_to_ctr_end": ms(t["process exited"], t_ctr1),
            "exited_to_delete": ms(t["process exited"], d["_ns"]) if d else None,
            "delete_to_ctr_end": ms(d["_ns"], t_ctr1) if d else None,
        }
        return res

    def bench_startup(self):
        vals = {"kata": [], "runc": [], "floor": [], "diff": []}
        fails = {"kata": 0, "runc": 0, "floor": 0}
        ph = []
        for i in range(RUNS):
            order = ["kata", "runc"] if i % 2 == 0 else ["runc", "kata"]
            got = {}
            for side in order:
                ms, cid, t0, t1 = self.timed_echo(side)
                got[side] = ms
                if ms is None:
                    fails[side] += 1
                    continue
                vals[side].append(ms)
                if side == "kata":
                    p = self.phases(cid, t0, t1)
                    if p:
                        ph.append(p)
            fl = self.floor_boot()
            if fl is None:
                fails["floor"] += 1
            else:
                vals["floor"].append(fl)
                if got.get("kata") is not None:
                    vals["diff"].append(got["kata"] - fl)
            log("start-up run %d/%d: kata %s ms, runc %s ms, floor %s ms" % (
                i + 1, RUNS, fmt_num(got.get("kata"), "ms"), fmt_num(got.get("runc"), "ms"),
                fmt_num(fl, "ms")))
        accel = self.accel or "tcg"
        R = self.report
        sec = "1. start-up: ctr run --rm %s x echo hi" % IMAGE
        R.add(sec, "run_echo_ms", "ctr run --rm ... echo hi", "ms",
              "wall time of the ctr command (spawned to exited), output checked",
              kata=vals["kata"], runc=vals["runc"], failed=fails)
        R.add(sec, "floor_boot_ms", "floor: bare boot, trivial init", "ms",
              "scripts/boot-floor.sh: QEMU microvm accel=%s, our kernel, init that powers off; "
              "QEMU start to exit" % accel, kata=vals["floor"], failed={"kata": fails["floor"]},
              single=True)
        R.add(sec, "ours_minus_floor_ms", "ours - floor", "ms",
              "per run: kata echo time minus the floor boot of the same run", kata=vals["diff"],
              single=True)
        sec = "2. kata phases (shim log ts, RFC3339 ns; same clock as ctr's start/end)"
        rows = [
            ("ctr_to_shim", "ctr spawned -> shim start", "ctr's start time to msg 'phase: shim start' "
             "(containerd, shim spawn, Create request, config load)"),
            ("shim_to_vmm", "shim start -> VMM launched", "'phase: shim start' to 'phase: VMM launched' "
             "(mounts, virtiofsd, vsock backend, QEMU spawned)"),
            ("vmm_to_agent", "VMM launched -> agent reachable", "'phase: VMM launched' to 'phase: "
             "agent reachable' (guest kernel boot + agent start + dial)"),
            ("agent_to_started", "agent reachable -> container started", "'phase: agent reachable' to "
             "'phase: container started'"),
            ("agent_to_created", "  of which: -> container created", "'phase: agent reachable' to "
             "'phase: container created' (CreateContainer)"),
            ("created_to_started", "  of which: created -> started", "'phase: container created' to "
             "'phase: container started' (Start)"),
            ("started_to_exited", "container started -> process exited", "'phase: container started' "
             "to msg 'process exited' (echo runs, stdout drained)"),
            ("exited_to_ctr_end", "process exited -> ctr returned", "msg 'process exited' to ctr's exit "
             "time (ctr sees the exit, deletes task (VM teardown) and container: --rm)"),
            ("exited_to_delete", "  of which: -> delete request", "msg 'process exited' to the shim's "
             "'delete' line (not a phase line): ctr has seen the exit and asks to delete"),
            ("delete_to_ctr_end", "  of which: delete -> ctr returned", "shim's 'delete' line to ctr's "
             "exit time (VM stop, container rm, ctr exits)"),
        ]
        for key, label, how in rows:
            R.add(sec, "phase_" + key + "_ms", label, "ms", how,
                  kata=[p[key] for p in ph if p.get(key) is not None], single=True)
        if len(ph) < len(vals["kata"]):
            R.notes.append("phase breakdown available for %d of %d kata runs" % (len(ph), len(vals["kata"])))

    # -- 3a: stdout throughput ----------------------------------------------------------
    def stdout_run(self, side):
        cid = self.new_id(side[0] + "t")
        cmd = self.run_args(side, cid, ["dd", "if=/dev/zero", "bs=1M", "count=%d" % (STDOUT_BYTES >> 20)])
        p = spawn(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        fd = p.stdout.fileno()
        n, t_first, t_last = 0, None, None
        deadline = time.monotonic() + STDOUT_TIMEOUT
        timed_out = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            r, _, _ = select.select([fd], [], [], min(left, 5))
            if not r:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                t_last = time.monotonic()
                break
            if t_first is None:
                t_first = time.monotonic()
            n += len(chunk)
        if timed_out:
            kill_group(p)
        try:
            rc = p.wait(timeout=CMD_TIMEOUT)
        except subprocess.TimeoutExpired:
            kill_group(p)
            rc = p.wait()
        p.stdout.close()
        LIVE.pop(p.pid, None)
        if timed_out or rc != 0 or n != STDOUT_BYTES or t_first is None:
            log("%s stdout run %s failed: rc %s, %d of %d bytes%s" % (
                side, cid, rc, n, STDOUT_BYTES, ", timed out" if timed_out else ""))
            self.remove([cid], timeout=30)
            return None
        return n / (t_last - t_first) / MB

    def bench_stdout(self):
        vals = {"kata": [], "runc": []}
        fails = {"kata": 0, "runc": 0}
        for i in range(RUNS):
            order = ["kata", "runc"] if i % 2 == 0 else ["runc", "kata"]
            got = {}
            for side in order:
                v = self.stdout_run(side)
                got[side] = v
                if v is None:
                    fails[side] += 1
                else:
                    vals[side].append(v)
            log("stdout run %d/%d: kata %s MB/s, runc %s MB/s" % (
                i + 1, RUNS, fmt_num(got.get("kata"), "MB/s"), fmt_num(got.get("runc"), "MB/s")))
        self.report.add(
            "3. throughput", "stdout_mbps", "stdout %d MiB via ctr" % (STDOUT_BYTES >> 20), "MB/s",
            "ctr run --rm ... dd if=/dev/zero bs=1M (%d bytes); stdout piped to a Python reader; bytes / "
            "(first byte to EOF), byte count checked" % STDOUT_BYTES,
            kata=vals["kata"], runc=vals["runc"], failed=fails)

    # -- 3b, 4, 5: one idle container each -----------------------------------------------
    def start_idle(self):
        ids = {"kata": self.new_id("ki"), "runc": self.new_id("ri")}
        for side, cid in ids.items():
            rc, _, err = run(self.run_args(side, cid, ["sleep", "600"], detach=True, rm=False),
                             env=self.env)
            if rc != 0:
                raise RuntimeError("%s: ctr run -d %s failed: %s" % (side, cid, err[-1000:]))
        if not self.wait_running(list(ids.values()), 60):
            raise RuntimeError("idle containers did not reach RUNNING within 60 s: %s" % self.tasks())
        return ids

    def vsock_ceiling(self, sandbox):
        path = os.path.join(VMDIR, sandbox, "kata.hvsock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        try:
            s.connect(path)
            s.sendall(b"CONNECT %d\n" % BENCH_SINK_PORT)
            buf = b""
            while b"\n" not in buf:
                c = s.recv(256)
                if not c:
                    raise RuntimeError("hybrid vsock closed before the OK line (got %r)" % buf)
                buf += c
                if len(buf) > 256:
                    raise RuntimeError("no OK line: %r" % buf[:256])
            line, _, rest = buf.partition(b"\n")
            if not line.upper().startswith(b"OK"):
                raise RuntimeError("CONNECT %d answered %r" % (BENCH_SINK_PORT, line))
            n = len(rest)
            mv = memoryview(bytearray(1 << 20))
            t0 = time.monotonic()
            deadline = t0 + STDOUT_TIMEOUT
            while n < STDOUT_BYTES:
                if time.monotonic() > deadline:
                    raise RuntimeError("timed out after %d bytes" % n)
                k = s.recv_into(mv, min(len(mv), STDOUT_BYTES - n))
                if not k:
                    raise RuntimeError("sink closed after %d bytes" % n)
                n += k
            return n / (time.monotonic() - t0) / MB
        finally:
            s.close()

    def memory(self, ids):
        kids = children_map()
        res = {}
        try:
            with open(os.path.join(SBS, ids["kata"], "persist.json")) as f:
                st = json.load(f)
        except (OSError, ValueError) as e:
            log("reading persist.json of %s: %s" % (ids["kata"], e))
            return None
        roles = {"shim": [st.get("shim_pid", 0)], "qemu": [], "virtiofsd": [], "vsock": []}
        if st.get("vmm_pid", 0) > 0:
            roles["qemu"] = with_descendants(st["vmm_pid"], kids)
        for h in st.get("helper_pids", []):
            name = os.path.basename((cmdline(h) or [""])[0])
            role = "virtiofsd" if "virtiofsd" in name else "vsock"
            roles[role] += with_descendants(h, kids)
        for role, pids in roles.items():
            vals = [pss_kib(p) for p in pids if p > 0]
            vals = [v for v in vals if v is not None]
            res[role] = sum(vals) / 1024 if vals else None
        res["sum"] = sum(v for k, v in res.items() if v is not None)
        runc_shim = None
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            a = cmdline(int(d))
            if a and "containerd-shim-runc-v2" in a[0] and "-id" in a:
                i = a.index("-id")
                if i + 1 < len(a) and a[i + 1] == ids["runc"]:
                    runc_shim = int(d)
                    break
        res["runc_shim"] = (pss_kib(runc_shim) or 0) / 1024 if runc_shim else None
        if runc_shim:
            others = [p for p in with_descendants(runc_shim, kids) if p != runc_shim]
            vals = [pss_kib(p) for p in others]
            res["runc_container"] = sum(v for v in vals if v is not None) / 1024
        return res

    def bench_idle(self):
        ids = self.start_idle()
        log("idle containers running: %s" % ids)
        time.sleep(2)  # let the fresh sandboxes settle before sampling memory
        mem = []
        for i in range(RUNS):
            m = self.memory(ids)
            if m:
                mem.append(m)
            time.sleep(0.5)
        ex = {"kata": [], "runc": []}
        exf = {"kata": 0, "runc": 0}
        for i in range(RUNS):
            order = ["kata", "runc"] if i % 2 == 0 else ["runc", "kata"]
            for side in order:
                m0 = time.monotonic()
                rc, _, err = self.ctr("task", "exec", "--fifo-dir", self.fifo, "--exec-id",
                                      "e%d" % (i + 1), ids[side], "true")
                ms = (time.monotonic() - m0) * 1000
                if rc != 0:
                    exf[side] += 1
                    log("%s exec failed (rc %s): %s" % (side, rc, err[-300:]))
                else:
                    ex[side].append(ms)
        ceil, cfail = [], 0
        for i in range(RUNS):
            try:
                v = self.vsock_ceiling(ids["kata"])
                ceil.append(v)
                log("vsock ceiling run %d/%d: %.1f MB/s" % (i + 1, RUNS, v))
            except (OSError, RuntimeError) as e:
                cfail += 1
                log("vsock ceiling run %d/%d failed: %s" % (i + 1, RUNS, e))
        R = self.report
        R.add("3. throughput", "vsock_ceiling_mbps", "vsock ceiling %d MiB" % (STDOUT_BYTES >> 20),
              "MB/s", "idle kata sandbox: host reads zeros from the agent's bench sink (vsock port "
              "%d) via /run/vc/vm/<id>/kata.hvsock 'CONNECT %d'; bytes / (OK line to last byte)"
              % (BENCH_SINK_PORT, BENCH_SINK_PORT), kata=ceil, failed={"kata": cfail}, single=True)
        R.add("4. exec", "exec_true_ms", "ctr task exec ... true", "ms",
              "wall time of `ctr task exec --exec-id eN CONTAINER true` into a running `sleep 600`",
              kata=ex["kata"], runc=ex["runc"], failed=exf)
        sec = "5. memory (PSS, /proc/PID/smaps_rollup, one idle `sleep 600`)"
        how_pids = "pids from /run/vc/sbs/<id>/persist.json"
        R.add(sec, "pss_shim_mib", "shim", "MiB",
              "kata: shim_pid; runc: containerd-shim-runc-v2 whose cmdline has -id <id>",
              kata=[m["shim"] for m in mem], runc=[m["runc_shim"] for m in mem])
        R.add(sec, "pss_qemu_mib", "VMM (qemu)", "MiB", "vmm_pid and its descendants; " + how_pids,
              kata=[m["qemu"] for m in mem], single=True)
        R.add(sec, "pss_virtiofsd_mib", "virtiofsd", "MiB",
              "helper_pids entry named virtiofsd and its descendants (sandbox child)",
              kata=[m["virtiofsd"] for m in mem], single=True)
        R.add(sec, "pss_vsock_mib", "vsock backend", "MiB",
              "the other helper_pids entry (the vsock backend, kata-vsock by default) and its descendants",
              kata=[m["vsock"] for m in mem], single=True)
        R.add(sec, "pss_sum_mib", "sum", "MiB",
              "kata: shim + VMM + virtiofsd + vsock backend; runc: shim + container processes",
              kata=[m["sum"] for m in mem],
              runc=[(m["runc_shim"] or 0) + (m.get("runc_container") or 0) for m in mem])
        if not mem:
            R.notes.append("memory: persist.json could not be read; no PSS figures")
        self.remove(list(ids.values()))

    # -- 6: density -------------------------------------------------------------------
    def density_once(self, side):
        ids = [self.new_id(side[0] + "d") for _ in range(DENSITY)]
        before = mem_available_kib()
        m0 = time.monotonic()
        procs = {cid: spawn(self.run_args(side, cid, ["sleep", "600"], detach=True, rm=False),
                            env=self.env) for cid in ids}
        failed = set()
        running = set()
        deadline = m0 + DENSITY_TIMEOUT
        t_all = None
        while True:
            for cid, p in procs.items():
                if cid not in failed and p.poll() is not None and p.returncode != 0:
                    failed.add(cid)
            st = self.tasks()
            running = {c for c in ids if st.get(c) == "RUNNING"}
            if len(running) + len(failed - running) >= DENSITY and \
                    all(p.poll() is not None for p in procs.values()):
                t_all = (time.monotonic() - m0) * 1000
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        after = mem_available_kib()
        for cid, p in procs.items():
            rc, _, err = reap(p, 5)
            if rc != 0:
                log("%s density: ctr run -d %s failed (rc %s): %s" % (side, cid, rc, err.strip()[-300:]))
        lost = DENSITY - len(running)
        used = (before - after) / 1024
        self.remove(ids)
        left = [d for d in our_sandboxes() if any(d.endswith("/" + c) for c in ids)]
        deadline = time.monotonic() + 30
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = [d for d in our_sandboxes() if any(d.endswith("/" + c) for c in ids)]
        if left:
            log("%s density: left behind after removal: %s" % (side, left))
        return {"all_running_ms": t_all if lost == 0 else None, "lost": lost, "mem_mib": used,
                "mem_per_mib": used / len(running) if running else None}

    def bench_density(self):
        res = {"kata": [], "runc": []}
        for i in range(DENSITY_RUNS):
            order = ["kata", "runc"] if i % 2 == 0 else ["runc", "kata"]
            for side in order:
                r = self.density_once(side)
                res[side].append(r)
                log("density run %d/%d %s: %s" % (i + 1, DENSITY_RUNS, side, json.dumps(r)))
        sec = "6. density: %d sandboxes started in parallel (ctr run -d ... sleep 600)" % DENSITY
        R = self.report

        def col(side, k):
            return [r[k] for r in res[side] if r[k] is not None]
        R.add(sec, "density_all_running_ms", "time until all RUNNING", "ms",
              "from spawning the %d ctr run -d to `ctr task ls` showing all RUNNING (polled every "
              "~0.1 s); runs with losses excluded" % DENSITY,
              kata=col("kata", "all_running_ms"), runc=col("runc", "all_running_ms"))
        R.add(sec, "density_mem_mib", "host memory used, total", "MiB",
              "MemAvailable (/proc/meminfo) before spawning minus when all were RUNNING; "
              "includes page cache and anything else on the host",
              kata=col("kata", "mem_mib"), runc=col("runc", "mem_mib"))
        R.add(sec, "density_mem_per_mib", "  per running sandbox", "MiB", "total / running",
              kata=col("kata", "mem_per_mib"), runc=col("runc", "mem_per_mib"))
        R.add(sec, "density_lost", "lost (not RUNNING)", "count",
              "of %d: ctr run -d failed or not RUNNING within %d s" % (DENSITY, DENSITY_TIMEOUT),
              kata=col("kata", "lost"), runc=col("runc", "lost"))

    # -- cleanup ----------------------------------------------------------------------
    def cleanup(self):
        problems = []
        for p in list(LIVE.values()):
            kill_group(p)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                problems.append("child %d survived SIGKILL" % p.pid)
            LIVE.pop(p.pid, None)
        if self.containerd_started:
            # Kills and deletes every task (VMs stop), then containerd, leftover shims and
            # their descendants, and removes the directory.
            rc, _, err = run(["bash", os.path.join(REPO, "scripts/containerd-private.sh"), "stop",
                              self.cdir], timeout=180, env=self.env)
            if rc != 0:
                problems.append("stopping the private containerd: rc %s: %s" % (rc, err[-1000:]))
        deadline = time.monotonic() + 20
        left = our_sandboxes()
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = our_sandboxes()
        if left:
            problems.append("sandbox state left behind: %s" % left)
        sbs_new = [d for d in listing(SBS) if d not in self.sbs_before]
        if sbs_new:
            others = [d for d in sbs_new if not d.startswith(PREFIX)]
            if others:
                log("note: %s has new entries not made by this bench (another user?): %s"
                    % (SBS, others))
        procs = []
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != os.getpid():
                a = " ".join(cmdline(int(d)))
                if self.work in a or ("sandbox-" + PREFIX) in a or ("/run/vc/vm/" + PREFIX) in a:
                    procs.append("%s: %s" % (d, a[:200]))
        if procs:
            problems.append("processes left behind: %s" % procs)
        shutil.rmtree(self.work, ignore_errors=True)
        if not problems:
            log("cleaned up: private containerd stopped, %s back to what it was" % SBS)
        return problems


def main():
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (containerd, QEMU, mounts)")
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(DEADLINE)
    started = datetime.datetime.now(datetime.timezone.utc)
    load0 = os.getloadavg()
    b = Bench()
    err = None
    try:
        b.setup()
        if "startup" not in SKIP:
            b.bench_startup()
        if "stdout" not in SKIP:
            b.bench_stdout()
        if "idle" not in SKIP:
            b.bench_idle()
        if "density" not in SKIP:
            b.bench_density()
    except Interrupted as e:
        err = "interrupted: %s" % e
    except Exception as e:  # report what was measured so far, then clean up
        err = "%s: %s" % (type(e).__name__, e)
    finally:
        signal.alarm(0)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        log("cleaning up")
        problems = b.cleanup()
    if err:
        log("bench stopped early: " + err)
        b.report.notes.append("bench stopped early: " + err)
    for p in problems:
        log("cleanup problem: " + p)
        b.report.notes.append("cleanup problem: " + p)
    load1 = os.getloadavg()
    b.report.notes.append(
        "accelerator %s; %d CPUs; load average %.2f at start, %.2f at end: numbers are only "
        "meaningful on an otherwise idle machine" % (b.accel or "unknown", os.cpu_count(),
                                                     load0[0], load1[0]))
    header = "make bench, %s: %d runs, kata/runc alternating; density %d x %d" % (
        started.strftime("%Y-%m-%d %H:%M:%S UTC"), RUNS, DENSITY, DENSITY_RUNS)
    text = print_table(b.report, header) if b.report.rows else header
    out_dir = os.environ.get("BENCH_OUT", os.path.join(REPO, "target", "bench"))
    os.makedirs(out_dir, exist_ok=True)
    doc = {
        "started": started.isoformat(), "runs": RUNS, "density": DENSITY,
        "density_runs": DENSITY_RUNS, "stdout_bytes": STDOUT_BYTES, "accelerator": b.accel,
        "cpus": os.cpu_count(), "loadavg_start": load0, "loadavg_end": load1,
        "kernel": b.kernel, "initrd": b.initrd, "image": IMAGE,
        "figures": b.report.rows, "notes": b.report.notes, "error": err,
        "cleanup_problems": problems, "table": text,
    }
    path = os.path.join(out_dir, started.strftime("%Y%m%dT%H%M%SZ") + ".json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    shutil.copyfile(path, os.path.join(out_dir, "latest.json"))
    log("wrote %s and latest.json" % path)
    return 1 if (err or problems) else 0


if __name__ == "__main__":
    sys.exit(main())
