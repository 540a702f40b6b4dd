"""Host inspection through /proc: PSS, process trees, command lines, free memory, and the
sandbox state directories of this bench's sandboxes."""

import json
import os
import time

from .settings import PREFIX, SBS, VMDIR


def rollup_kib(pid):
    """`pid`'s smaps_rollup figures in KiB by name ("Pss"; "Pss_File": the page cache of
    files it maps, shared with every process mapping the same files), or None."""
    out = {}
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    out[parts[0].rstrip(":")] = int(parts[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return out


def pss_kib(pid):
    return (rollup_kib(pid) or {}).get("Pss")


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


def settled_mem_available_kib(timeout=5.0, step=0.25, within_kib=1024):
    """MemAvailable once it has stopped moving (two samples `step` s apart within
    `within_kib`), or the last sample after `timeout` s: what the previous run freed (its
    VMMs' exits, their page cache) is counted before a run starts, not during it."""
    last = mem_available_kib()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(step)
        cur = mem_available_kib()
        if abs(cur - last) <= within_kib:
            return cur
        last = cur
    return last


def busy_cpu_s():
    """CPU seconds the whole host has spent busy since boot (all cores; /proc/stat's first
    line less idle and iowait): the difference over an interval is the work that interval
    cost the machine, whoever did it."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def sandbox_state(cid):
    """The shim's persist.json of sandbox `cid` (its pids), or None if unreadable."""
    try:
        with open(os.path.join(SBS, cid, "persist.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


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



def qemu_memory_kib(pid):
    """QEMU's PSS split by what it holds: the guest's RAM (the memory-backend mapping), TCG's
    translation cache (the anonymous read-write-execute mapping, sized by tb-size; absent
    under KVM), files it maps (its binary, libraries, the guest kernel and initrd: page cache
    shared with every other QEMU) and the rest (its own heap and state)."""
    out = {"guest_ram": 0, "tcg_cache": 0, "files": 0, "other": 0}
    try:
        f = open("/proc/%d/smaps" % pid)
    except OSError:
        return None
    with f:
        role = None
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and ":" not in first:
                parts = line.split()
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                name = parts[5] if len(parts) > 5 else ""
                if "memory-backend" in name:
                    role = "guest_ram"
                elif name.startswith("/"):
                    role = "files"
                elif not name and parts[1].startswith("rwx"):
                    # TCG's code buffer, the one anonymous mapping both writable and
                    # executable (tb-size, 64 MiB from the runtime; its guard pages are
                    # mapped ---p and hold nothing).
                    role = "tcg_cache"
                else:
                    role = "other"
            elif line.startswith("Pss:") and role:
                out[role] += int(line.split()[1])
    return out
