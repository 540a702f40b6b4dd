"""Host CPU by who spends it: the private containerd in a CPU-accounting cgroup of the
bench's own (so its shims and everything they start without moving it count there), a
sandbox's or container's own cgroup, and one thread's CPU from /proc.

cgroup v1 (cpuacct, hybrid hosts such as this one) or v2 (cpu.stat's usage_usec, which
every v2 cgroup has)."""

import os
import time

from .settings import NS, PREFIX


def _mounts():
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4:
                out.append((parts[1], parts[2], parts[3].split(",")))
    return out


def hierarchy():
    """("v1", mount of the cpuacct hierarchy) or ("v2", mount of the unified one) or None.
    v1's cpuacct first: on a hybrid host the shim and runc place sandboxes there."""
    v2 = None
    for mnt, fstype, opts in _mounts():
        if fstype == "cgroup" and "cpuacct" in opts:
            return ("v1", mnt)
        if fstype == "cgroup2" and v2 is None:
            v2 = ("v2", mnt)
    return v2


def usage_ns(kind, path):
    """CPU ns a cgroup (directory `path`) and its descendants have used, or None."""
    try:
        if kind == "v1":
            with open(os.path.join(path, "cpuacct.usage")) as f:
                return int(f.read().strip())
        with open(os.path.join(path, "cpu.stat")) as f:
            for line in f:
                k, v = line.split()
                if k == "usage_usec":
                    return int(v) * 1000
    except (OSError, ValueError):
        return None
    return None


def thread_cpu_ns(tid, base="/proc"):
    """CPU time of one thread, ns (/proc/TID/schedstat's first field, the scheduler's own
    count; utime + stime of /proc/TID/stat, in clock ticks, where schedstat is missing),
    or None once it is gone."""
    try:
        with open("%s/%d/schedstat" % (base, tid)) as f:
            return int(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open("%s/%d/stat" % (base, tid)) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def thread_wait_ns(tid):
    """Time a thread has spent runnable but waiting for a CPU, ns (/proc/TID/schedstat's
    second field), or None."""
    try:
        with open("/proc/%d/schedstat" % tid) as f:
            return int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


def process_cpu_ns(tid, skip=()):
    """CPU time of every live thread of the process thread `tid` belongs to, ns, or None;
    threads whose name (comm) is in `skip` left out."""
    try:
        with open("/proc/%d/status" % tid) as f:
            tgid = next(int(line.split()[1]) for line in f if line.startswith("Tgid:"))
        tids = [int(t) for t in os.listdir("/proc/%d/task" % tgid)]
    except (OSError, StopIteration, ValueError):
        return None
    total = 0
    for t in tids:
        try:
            with open("/proc/%d/task/%d/comm" % (tgid, t)) as f:
                if f.read().strip() in skip:
                    continue
        except OSError:
            continue
        total += thread_cpu_ns(t, "/proc/%d/task" % tgid) or 0
    return total


class ContainerdCgroup:
    """A cgroup of the bench's own that the private containerd is moved into right after it
    starts: its usage is containerd's CPU plus that of every shim and helper it starts
    (which inherit it) until they join a cgroup of their own: a sandbox's VMM and helpers
    and a runc container's processes go to ctr's cgroupsPath /NS/ID. A cgroup's usage
    counts its descendants', those removed since included, so /NS's usage over a run is
    what the run's sandbox or container spent there, read after it is gone (the bench
    makes /NS if it is missing, so that the shim, which removes the cgroups it made,
    leaves it)."""

    def __init__(self):
        self.h = hierarchy()
        self.path = os.path.join(self.h[1], "kata-bench-" + PREFIX) if self.h else None
        self.ns_path = os.path.join(self.h[1], NS) if self.h else None
        self.made = False
        self.made_ns = False
        self.error = None if self.h else "no cpuacct (v1) or unified (v2) cgroup hierarchy"

    def adopt(self, pid):
        if not self.path:
            return
        try:
            if not os.path.isdir(self.ns_path):
                os.makedirs(self.ns_path)
                self.made_ns = True
            os.makedirs(self.path, exist_ok=True)
            self.made = True
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(pid))
        except OSError as e:
            self.error = "cannot move containerd (pid %d) into %s: %s" % (pid, self.path, e)

    def usage_ns(self):
        if not self.made or self.error:
            return None
        return usage_ns(self.h[0], self.path)

    def ns_usage_ns(self):
        """Usage of /NS, the parent of every sandbox's and container's cgroup."""
        if not self.made or self.error:
            return None
        return usage_ns(self.h[0], self.ns_path)

    def remove(self):
        """Removes the cgroup once containerd and its children are gone; a problem or None."""
        if self.made_ns:
            try:
                os.rmdir(self.ns_path)
            except OSError:
                pass  # another user's cgroups under it, or already gone: left as found
        if not self.made:
            return None
        deadline = time.monotonic() + 10
        while True:
            try:
                os.rmdir(self.path)
                return None
            except FileNotFoundError:
                return None
            except OSError as e:  # busy until the last of containerd's children is gone
                if time.monotonic() > deadline:
                    return "cannot remove %s: %s" % (self.path, e)
            time.sleep(0.2)
