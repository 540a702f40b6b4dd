"""The shim's JSON log lines in containerd's log, and the start-up phases they mark.

A phase is read from the record's structured `phase` field, which the shim writes on each
phase line; message text is never parsed. Two milestones are plain events, not phases: the
"process exited" line and the "delete" line.
"""

import datetime
import json
import re

SHIM_START = "shim start"
VMM_LAUNCHED = "VMM launched"
AGENT_REACHABLE = "agent reachable"
CONTAINER_CREATED = "container created"
CONTAINER_STARTED = "container started"
PHASES = [SHIM_START, VMM_LAUNCHED, AGENT_REACHABLE, CONTAINER_CREATED, CONTAINER_STARTED]
PROCESS_EXITED = "process exited"  # an event: the shim saw the container's process exit
DELETE = "delete"  # an event: the Delete request arrived


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


def sandbox_records(logfile, sandbox):
    """The shim's JSON log lines of one sandbox, each with `_ns` (its ts in ns)."""
    out = []
    try:
        with open(logfile, errors="replace") as f:
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


def phase_of(rec):
    """The phase a record marks, or None."""
    return rec.get("phase") or None


def milestones(records):
    """The first record of each phase and event, by name."""
    first = {}
    for r in records:
        name = phase_of(r) or r.get("msg")
        if name in PHASES or name in (PROCESS_EXITED, DELETE):
            first.setdefault(name, r)
    return first


def phase_timings(first, t_ctr0, t_ctr1):
    """Milliseconds between the milestones of one `ctr run --rm ... echo` (t_ctr0 and t_ctr1:
    ctr's start and end, ns); None if a phase or the exit is missing."""
    need = PHASES + [PROCESS_EXITED]
    if any(n not in first for n in need):
        return None

    def ms(a, b):
        return (b - a) / 1e6
    t = {n: first[n]["_ns"] for n in need}
    d = first.get(DELETE)
    return {
        "ctr_to_shim": ms(t_ctr0, t[SHIM_START]),
        "shim_to_vmm": ms(t[SHIM_START], t[VMM_LAUNCHED]),
        "vmm_to_agent": ms(t[VMM_LAUNCHED], t[AGENT_REACHABLE]),
        "agent_to_started": ms(t[AGENT_REACHABLE], t[CONTAINER_STARTED]),
        "agent_to_created": ms(t[AGENT_REACHABLE], t[CONTAINER_CREATED]),
        "created_to_started": ms(t[CONTAINER_CREATED], t[CONTAINER_STARTED]),
        "started_to_exited": ms(t[CONTAINER_STARTED], t[PROCESS_EXITED]),
        "exited_to_ctr_end": ms(t[PROCESS_EXITED], t_ctr1),
        "exited_to_delete": ms(t[PROCESS_EXITED], d["_ns"]) if d else None,
        "delete_to_ctr_end": ms(d["_ns"], t_ctr1) if d else None,
    }


def missing(first):
    """The phases and events a run's records lack, for the log."""
    return [n for n in PHASES + [PROCESS_EXITED] if n not in first]
