"""Host inspection through /proc: PSS, process trees, command lines, free memory, and the
sandbox state directories of this bench's sandboxes."""

import os

from .settings import PREFIX, SBS, VMDIR


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

