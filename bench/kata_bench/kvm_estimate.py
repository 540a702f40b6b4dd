"""7 + 8 + 9: the rows of the instrumented runs (`instrumented`), the KVM estimate computed
from them, and the goals of issue 30 (item 2) in these units.

The estimate (bench/README.md, "KVM estimate"), for a time T measured under TCG whose
guest part ran on the one vCPU thread, on the critical path:

    T_kvm = T_tcg - vCPU_tcg + I / R + N_vmm * c_vmm + N_kernel * c_kernel

T_tcg a run's wall time, vCPU_tcg its vCPU thread's CPU plus the time that thread waited,
runnable, for a host CPU (TCG's translating and running guest code, none of which KVM
does, and its queueing behind the host's other work), I the guest instructions,
R the rate a KVM guest runs them at, N_vmm the device accesses that exit to the VMM in
user space and N_kernel those KVM handles in the kernel (PIT accesses left out: see
`devices`). Host CPU per sandbox under KVM: the host CPU outside the vCPU as measured, plus
I / R + the exits' cost. Two ends: fast (R 3 G/s, 5 us per exit to the VMM, 1 us in the
kernel) and slow (1 G/s, 10 us, 2 us)."""

import statistics

ENDS = {"fast": (3e9, 5e-6, 1e-6), "slow": (1e9, 10e-6, 2e-6)}


def med(rows, key, sub=None):
    vals = [(r[key][sub] if sub else r[key]) for r in rows
            if r.get(key) is not None and (sub is None or r[key].get(sub) is not None)]
    return statistics.median(vals) if vals else None


def report_median(R, key, side="kata"):
    for row in R.rows:
        if row["key"] == key:
            s = row["figures"].get(side)
            return s["median"] if s else None
    return None


def estimate(t_ms, vcpu_ms, insn, n_vmm, n_kernel, end):
    if None in (t_ms, vcpu_ms, insn, n_vmm, n_kernel):
        return None
    rate, c_vmm, c_kernel = ENDS[end]
    return t_ms - vcpu_ms + (insn / rate + n_vmm * c_vmm + n_kernel * c_kernel) * 1000


def guest_cost_ms(insn, n_vmm, n_kernel, end):
    if None in (insn, n_vmm, n_kernel):
        return None
    rate, c_vmm, c_kernel = ENDS[end]
    return (insn / rate + n_vmm * c_vmm + n_kernel * c_kernel) * 1000


def add_rows(h, runs):
    """`runs`: a list per kind of run, one entry per round, None where the run failed."""
    R = h.report

    def pairs(a, b):
        return [(x, y) for x, y in zip(runs[a], runs[b]) if x is not None and y is not None]
    kq, ki, kt, rc, fq, fi, ft = ([r for r in runs[k] if r is not None] for k in (
        "kata_qmp", "kata_icount", "kata_trace", "runc", "floor_qmp", "floor_icount",
        "floor_trace"))
    M = 1e6
    sec = ("7. KVM-portable figures: ctr run --rm ... echo hi and the bare boot in runs of "
           "their own (QEMU -icount shift=0, trace events; never in the timed rows)")
    for key, label in (("agent", "guest instructions: VM start -> agent reachable"),
                       ("started", "  -> container started"),
                       ("exited", "  -> process exited")):
        R.add(sec, "insn_%s_m" % key, label, "M",
              "QMP query-replay's icount (QEMU -icount shift=0), polled every ~2 ms from the "
              "bench, interpolated at the shim's phase record (ts)",
              kata=[r["insn_" + key] / M for r in ki if r.get("insn_" + key) is not None],
              single=True)
    R.add(sec, "insn_floor_m", "floor: VM start -> poweroff", "M",
          "the bare boot under -icount shift=0 -no-shutdown, icount once its guest has "
          "powered off", kata=[r["insn_total"] / M for r in fi if r.get("insn_total")],
          single=True)
    insn_diff = [(a["insn_exited"] - b["insn_total"]) / M
                 for a, b in pairs("kata_icount", "floor_icount")
                 if a.get("insn_exited") is not None and b.get("insn_total")]
    R.add(sec, "insn_minus_floor_m", "ours (process exited) - floor", "M", "round by round",
          kata=insn_diff, single=True)
    for key, label in (("agent", "device accesses to the VMM: -> agent reachable"),
                       ("started", "  agent reachable -> container started"),
                       ("exited", "  container started -> process exited"),
                       ("total", "  per start (VM start -> process exited)")):
        R.add(sec, "dev_vmm_%s" % key, label, "count",
              "memory_region_ops_read/write trace events (MMIO and port I/O) of regions that "
              "exit to QEMU under KVM: serial, RTC, fw_cfg, virtio-mmio registers, unassigned "
              "ports; queue notifications to vhost-user devices are not seen (ioeventfd)",
              kata=[r["dev_" + key]["vmm"] for r in kt], single=True)
    R.add(sec, "dev_kernel_total", "  in KVM's kernel instead (LAPIC, IOAPIC, PIC)", "count",
          "the same events of regions KVM's in-kernel irqchip handles: exits, but not to "
          "user space", kata=[r["dev_total"]["kernel"] for r in kt], single=True)
    R.add(sec, "dev_pit_total", "  PIT (TSC calibration; left out of the estimate)", "count",
          "the PIT, in KVM's kernel too; a KVM guest reads the TSC rate from kvmclock",
          kata=[r["dev_total"]["pit"] for r in kt], single=True)
    for c, label in (("vmm", "floor: device accesses to the VMM"),
                     ("kernel", "  floor: in KVM's kernel"), ("pit", "  floor: PIT")):
        R.add(sec, "dev_floor_%s" % c, label, "count", "the bare boot, VM start to poweroff",
              kata=[r["dev_total"][c] for r in ft], single=True)
    R.add(sec, "cpu_outside_vcpu_ms", "host CPU outside the vCPU, per sandbox", "ms",
          "kata: the usage of containerd's cgroup (containerd, the shim and what it starts "
          "there) over the run plus that of ctr's /bench cgroup, the parent of the sandbox's "
          "(QEMU, virtiofsd, kata-vsock), less QEMU's vCPU thread (/proc/TID/schedstat, "
          "read every ~2 ms until it ends); runc: containerd's cgroup (containerd, its shim, "
          "runc) plus /bench (the container's processes); ctr not counted",
          kata=[r["cpu_outside_vcpu_ms"] for r in kq], runc=[r["cpu_total_ms"] for r in rc])
    R.add(sec, "cpu_containerd_shim_ms", "  of which containerd + shim", "ms",
          "containerd's cgroup alone (runc: with runc's own runs)",
          kata=[r["cpu_containerd_shim_ms"] for r in kq],
          runc=[r["cpu_containerd_shim_ms"] for r in rc])
    R.add(sec, "cpu_qemu_helpers_ms", "  of which QEMU's other threads + helpers", "ms",
          "/bench's usage less the vCPU thread (runc: /bench's, the container's processes)",
          kata=[r["cpu_qemu_helpers_ms"] for r in kq], runc=[r["cpu_container_ms"] for r in rc])
    R.add(sec, "cpu_vcpu_ms", "QEMU's vCPU thread (the guest under TCG)", "ms",
          "not counted above: under KVM the guest's own time, see the estimate",
          kata=[r["cpu_vcpu_ms"] for r in kq], single=True)
    R.add(sec, "vcpu_wait_ms", "  vCPU thread waiting for a host CPU", "ms",
          "runnable, not running (/proc/TID/schedstat): the host's load; 0 on an idle host",
          kata=[r["vcpu_wait_ms"] for r in kq], single=True)
    R.add(sec, "cpu_floor_vcpu_ms", "floor: vCPU thread", "ms", "the bare boot's, to poweroff",
          kata=[r["cpu_vcpu_ms"] for r in fq], single=True)
    R.add(sec, "cpu_floor_outside_ms", "  floor: QEMU outside its vCPU", "ms",
          "every other thread of the bare boot's QEMU", kata=[r["cpu_outside_vcpu_ms"] for r in fq],
          single=True)
    # icount's cost: each icount run against the QMP-only run of the same round (same
    # command, same load, no icount).
    R.add(sec, "icount_run_ms", "icount's cost: ctr run --rm ... echo hi under -icount", "ms",
          "wall time, nothing polled (the QMP socket of the other runs there, unused)",
          kata=[r["wall_ms"] for r in runs["kata_icount_quiet"] if r], single=True)
    R.add(sec, "icount_run_ratio", "  / the same without icount", "x",
          "round by round, over the same run without -icount just before it",
          kata=[a["wall_ms"] / b["wall_ms"] for a, b in pairs("kata_icount_quiet", "kata_plain")],
          single=True)
    R.add(sec, "icount_floor_ms", "  floor under -icount", "ms",
          "the bare boot as the timed floor row runs it, with -icount shift=0",
          kata=[r["wall_ms"] for r in runs["floor_icount_quiet"] if r], single=True)
    R.add(sec, "icount_floor_ratio", "  / the same without icount", "x",
          "round by round, over a bare boot without -icount just before it",
          kata=[a["wall_ms"] / b["wall_ms"] for a, b in pairs("floor_icount_quiet", "floor_plain")],
          single=True)
    traced = [r["insn_exited"] for r in kt if r.get("insn_exited") is not None]
    plain = [r["insn_exited"] for r in ki if r.get("insn_exited") is not None]
    if traced and plain:
        R.notes.append(
            "guest instructions to 'process exited': %.2f M under icount, %.2f M with the trace "
            "events on too (medians): tracing slows the host, not the guest's count; the "
            "icount samples around a phase were at most %.2f M apart"
            % (statistics.median(plain) / M, statistics.median(traced) / M,
               max(r.get("insn_spread") or 0 for r in ki) / M))
    for name, rows in (("kata, VM start to poweroff of the run", kt), ("floor", ft)):
        if rows:
            regions = {}
            for r in rows:
                for k, v in r["dev_regions"].items():
                    regions.setdefault(k, []).append(v)
            R.notes.append("device accesses by QEMU memory region (%s; medians, every access "
                           "traced): %s" % (name, ", ".join(
                               "%s %d" % (k, statistics.median(v)) for k, v in
                               sorted(regions.items(), key=lambda kv: -statistics.median(kv[1])))))
    virtio = [r for r in kt if r.get("dev_virtio")]
    if virtio:
        counts, devices = {}, virtio[0].get("dev_virtio_devices", {})
        for r in virtio:
            for k, v in r["dev_virtio"].items():
                counts.setdefault(k, []).append(v)
        R.notes.append(
            "virtio-mmio accesses by device and purpose (kata, VM start to poweroff; medians; "
            "devices: %s): %s; 'interrupt' is InterruptStatus + InterruptACK, two exits per "
            "interrupt, 'config' the config space a byte per access" % (
                ", ".join("%s x%d" % kv for kv in sorted(devices.items())),
                ", ".join("%s %d" % (k, statistics.median(v)) for k, v in
                          sorted(counts.items(), key=lambda kv: -statistics.median(kv[1])))))

    # 8. The estimate, run by run: each host-CPU run's own wall time and vCPU time, with the
    # medians of the instructions and device accesses (which barely move between runs).
    sec = ("8. KVM estimate (computed, not measured: T_tcg - vCPU_tcg (CPU + wait) + I/R + "
           "exits x cost; "
           "fast: 3 G instructions/s, 5 us per exit to the VMM, 1 us in KVM; slow: 1 G/s, "
           "10 us, 2 us)")
    insn = med(ki, "insn_exited")
    n_vmm, n_kernel = med(kt, "dev_total", "vmm"), med(kt, "dev_total", "kernel")
    f_insn = med(fi, "insn_total")
    f_vmm, f_kernel = med(ft, "dev_total", "vmm"), med(ft, "dev_total", "kernel")
    est = {"run": [], "floor": [], "diff": [], "cpu": []}
    for end in ENDS:
        for a, b in zip(runs["kata_qmp"], runs["floor_qmp"]):
            if a is None:
                continue
            run = estimate(a["wall_ms"], a["cpu_vcpu_ms"] + a["vcpu_wait_ms"], insn, n_vmm,
                           n_kernel, end)
            floor = estimate(b["wall_ms"], b["cpu_vcpu_ms"] + b["vcpu_wait_ms"], f_insn, f_vmm,
                             f_kernel, end) if b else None
            g = guest_cost_ms(insn, n_vmm, n_kernel, end)
            for key, v in (("run", run), ("floor", floor),
                           ("diff", run - floor if None not in (run, floor) else None),
                           ("cpu", a["cpu_outside_vcpu_ms"] + g if g is not None else None)):
                if v is not None:
                    est[key].append(v)
    for key, label, how in (
            ("run", "ctr run --rm ... echo hi", "each host-CPU run of 7: its wall time less its "
             "vCPU thread's CPU and wait for a CPU, plus the median instructions and exits at "
             "KVM's cost, at both ends"),
            ("floor", "floor: bare boot", "the same for the floor's host-CPU runs (to poweroff)"),
            ("diff", "ours - floor", "the two above, round by round"),
            ("cpu", "host CPU per sandbox", "host CPU outside the vCPU as measured plus the "
             "guest's instructions and exits at KVM's cost")):
        R.add(sec, "kvm_est_%s_ms" % key, label, "ms", how, kata=est[key], single=True)

    # 9. The goals of issue 30, item 2, in these units.
    sec = "9. goals of issue 30 (item 2) in these units"
    R.add(sec, "goal_insn_minus_floor_m", "guest instructions, ours - floor (goal: halved)",
          "M", "row 'ours (process exited) - floor' of 7", kata=insn_diff, single=True)
    runc_cpu = med(rc, "cpu_total_ms")
    R.add(sec, "goal_cpu_over_runc_ms",
          "host CPU outside the vCPU - runc's per container (goal: <= 50)", "ms",
          "per kata run, less runc's median (%s ms)" % ("%.0f" % runc_cpu if runc_cpu else "n/a"),
          kata=[r["cpu_outside_vcpu_ms"] - runc_cpu for r in kq] if runc_cpu is not None else [],
          single=True)
    R.add(sec, "goal_dev_per_start", "device accesses to the VMM per start (goal: halved)",
          "count", "row 'per start' of 7 (in KVM's kernel besides: row 'in KVM's kernel instead')",
          kata=[r["dev_total"]["vmm"] for r in kt], single=True)
    mem = report_median(R, "pss_minus_floor_no_tcg_mib")
    R.add(sec, "goal_mem_minus_floor_mib",
          "memory without TCG's cache - the floor's (goal: <= 10)", "MiB",
          "row 'ours - floor, without TCG's caches' of 5 (needs the idle measurement)",
          kata=[mem] if mem is not None else [], single=True)
    mem = report_median(R, "pss_minus_floor_private_mib")
    R.add(sec, "goal_mem_minus_floor_private_mib",
          "  the same, one sandbox more where many run", "MiB",
          "row 'and without any process's mapped files' of 5: the helpers' and QEMU's text "
          "is page cache every sandbox shares",
          kata=[mem] if mem is not None else [], single=True)
