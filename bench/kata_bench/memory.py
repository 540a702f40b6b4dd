"""5: memory. PSS (/proc/PID/smaps_rollup) of one idle sandbox by role: the shim, the VMM,
virtiofsd and the vsock backend (pids from persist.json, each with its descendants), and
runc's shim with its container processes; and the floor: a bare VM of our kernel, idle."""

import os
import re
import subprocess
import time

from .host import children_map, cmdline, pss_kib, qemu_memory_kib, rollup_kib, sandbox_state, \
    with_descendants
from .procs import kill_group, reap, spawn
from .settings import RUNS, log
from .startup import floor_cmd


def kata_pss(cid, kids):
    """PSS in MiB by role of kata sandbox `cid` (shim, qemu with its split, virtiofsd,
    vsock, their sum with and without TCG's cache), or None without its persist.json."""
    st = sandbox_state(cid)
    if st is None:
        return None
    res = {}
    roles = {"shim": [st.get("shim_pid", 0)], "qemu": [], "virtiofsd": [], "vsock": []}
    if st.get("vmm_pid", 0) > 0:
        roles["qemu"] = with_descendants(st["vmm_pid"], kids)
        parts = qemu_memory_kib(st["vmm_pid"])
        if parts:
            for k, v in parts.items():
                res["qemu_" + k] = v / 1024
    for h in st.get("helper_pids", []):
        name = os.path.basename((cmdline(h) or [""])[0])
        role = "virtiofsd" if "virtiofsd" in name else "vsock"
        roles[role] += with_descendants(h, kids)
    files = res.get("qemu_files") or 0
    for role, pids in roles.items():
        rollups = [r for r in (rollup_kib(p) for p in pids if p > 0) if r and "Pss" in r]
        res[role] = sum(r["Pss"] for r in rollups) / 1024 if rollups else None
        if role != "qemu":
            files += sum(r.get("Pss_File", 0) for r in rollups) / 1024
    res["sum"] = sum(res.get(k) or 0 for k in ("shim", "qemu", "virtiofsd", "vsock"))
    # What the same sandbox would cost under KVM, which has no translation cache.
    res["sum_without_tcg_cache"] = res["sum"] - (res.get("qemu_tcg_cache") or 0)
    # Every process's mapped files (binaries, libraries, the guest kernel and initrd): page
    # cache that every sandbox on the host shares, so a sandbox more adds only the rest.
    res["files_all"] = files
    return res


def sample(ids):
    """PSS in MiB by role of the idle kata sandbox ids["kata"] and of runc's ids["runc"]."""
    kids = children_map()
    res = kata_pss(ids["kata"], kids)
    if res is None:
        log("persist.json of %s could not be read" % ids["kata"])
        return None
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


def measure(ids):
    """RUNS samples, half a second apart."""
    mem = []
    for _ in range(RUNS):
        m = sample(ids)
        if m:
            mem.append(m)
        time.sleep(0.5)
    return mem


# Seconds between the end of the vsock ceiling's transfer and the "after" sample.
AFTER_ACTIVITY_S = 5
# Seconds a fresh VM settles before its first sample (the idle sandboxes' too).
SETTLE_S = 2
FLOOR_PID = re.compile(rb"floor-qemu-pid: (\d+)")


def measure_floor(h):
    """The memory floor: scripts/boot-floor.sh held up idle (a bare VM of the sandboxes' size,
    our kernel, an init that only waits, the balloon's free page reporting as the runtime
    sets it up), sampled like the idle sandbox (SETTLE_S after its init is up, then RUNS
    samples half a second apart): QEMU's PSS split, and its total as "sum"."""
    hold_s = SETTLE_S + RUNS + 30
    p = spawn(floor_cmd(h, hold_s), env=h.env, stdout=subprocess.PIPE)
    samples = []
    try:
        pid = None
        for line in p.stdout:
            m = FLOOR_PID.search(line)
            if m:
                pid = int(m.group(1))
                break
        if pid is None:
            rc, _, err = reap(p, 10)
            log("memory floor: the bare VM did not come up (rc %s): %s" % (rc, err[-500:]))
            return samples
        time.sleep(SETTLE_S)
        for _ in range(RUNS):
            parts = qemu_memory_kib(pid)
            if parts:
                m = {k: v / 1024 for k, v in parts.items()}
                m["sum"] = sum(m.values())
                samples.append(m)
            time.sleep(0.5)
    finally:
        kill_group(p)
        reap(p, 10)
    return samples


def add_rows(R, mem, after=(), floor=()):
    sec = "5. memory (PSS, /proc/PID/smaps_rollup, one idle `sleep 600`)"
    how_pids = "pids from /run/vc/sbs/<id>/persist.json"
    R.add(sec, "pss_shim_mib", "shim", "MiB",
          "kata: shim_pid; runc: containerd-shim-runc-v2 whose cmdline has -id <id>",
          kata=[m["shim"] for m in mem], runc=[m["runc_shim"] for m in mem])
    R.add(sec, "pss_qemu_mib", "VMM (qemu)", "MiB", "vmm_pid and its descendants; " + how_pids,
          kata=[m["qemu"] for m in mem], single=True)
    for key, label, how in [
            ("guest_ram", "  of which: guest RAM", "the memory-backend mapping: what the guest has touched and not handed back (free page reporting)"),
            ("tcg_cache", "  of which: TCG translation cache", "the large anonymous mapping TCG generates host code into (capped by tb-size); none under KVM"),
            ("files", "  of which: mapped files", "QEMU's binary and libraries, the guest kernel and initrd: page cache shared by every QEMU"),
            ("other", "  of which: QEMU's own", "heap, thread stacks, device state")]:
        R.add(sec, "pss_qemu_%s_mib" % key, label, "MiB", how,
              kata=[m.get("qemu_" + key) for m in mem if m.get("qemu_" + key) is not None], single=True)
    R.add(sec, "pss_qemu_guest_ram_after_mib", "  guest RAM after 256 MiB through vsock", "MiB",
          "the memory-backend mapping again, %d s after the vsock ceiling read 256 MiB from "
          "the same sandbox: what activity leaves touched once the guest has handed back "
          "what it freed" % AFTER_ACTIVITY_S,
          kata=[m.get("qemu_guest_ram") for m in after if m.get("qemu_guest_ram") is not None],
          single=True)
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
    R.add(sec, "pss_sum_no_tcg_mib", "sum without TCG's cache", "MiB",
          "the sum less the TCG translation cache: the same sandbox's cost under KVM, which translates nothing",
          kata=[m["sum_without_tcg_cache"] for m in mem], single=True)
    how_floor = ("scripts/boot-floor.sh held up idle: QEMU microvm, the sandboxes' memory "
                 "size, our kernel, an init that only waits, virtio-balloon with free page "
                 "reporting as the runtime sets it up; no agent, no helpers, no other "
                 "device; sampled alone, like the sandbox")
    R.add(sec, "pss_floor_mib", "floor: bare VM, idle (QEMU)", "MiB", how_floor,
          kata=[f["sum"] for f in floor], single=True)
    for key, label in [("guest_ram", "  of which: guest RAM"),
                       ("tcg_cache", "  of which: TCG translation cache"),
                       ("files", "  of which: mapped files"),
                       ("other", "  of which: QEMU's own")]:
        R.add(sec, "pss_floor_%s_mib" % key, label, "MiB",
              "the floor's QEMU split like the sandbox's",
              kata=[f[key] for f in floor], single=True)
    pairs = list(zip(mem, floor))
    R.add(sec, "pss_minus_floor_mib", "ours - floor", "MiB",
          "sample by sample: the sum minus the floor's QEMU; what the runtime adds to a bare VM",
          kata=[m["sum"] - f["sum"] for m, f in pairs], single=True)
    R.add(sec, "pss_minus_floor_no_tcg_mib", "  without TCG's caches", "MiB",
          "the same, each side less its translation cache",
          kata=[m["sum_without_tcg_cache"] - (f["sum"] - f["tcg_cache"]) for m, f in pairs],
          single=True)
    R.add(sec, "pss_minus_floor_no_tcg_files_mib", "  and without QEMU's mapped files", "MiB",
          "the same, each side's QEMU also less its mapped files, whose PSS depends on how "
          "many other QEMUs map them at the moment (on a shared host, not the same for both)",
          kata=[m["sum_without_tcg_cache"] - (m.get("qemu_files") or 0)
                - (f["sum"] - f["tcg_cache"] - f["files"]) for m, f in pairs], single=True)
    R.add(sec, "pss_minus_floor_private_mib", "  and without any process's mapped files",
          "MiB", "the same, each side also less the mapped files of every process (the "
          "shim's, virtiofsd's and the vsock backend's binaries and libraries: Pss_File of "
          "smaps_rollup): what one sandbox more adds on a host where many run, as their "
          "text pages are shared page cache",
          kata=[m["sum_without_tcg_cache"] - m["files_all"]
                - (f["sum"] - f["tcg_cache"] - f["files"]) for m, f in pairs], single=True)
    if not mem:
        R.notes.append("memory: persist.json could not be read; no PSS figures")
    if not floor:
        R.notes.append("memory: the floor's bare VM could not be sampled")
