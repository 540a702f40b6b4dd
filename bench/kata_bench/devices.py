"""Device accesses from QEMU's `memory_region_ops_read`/`_write` trace events (log
backend, `-msg timestamp=on`: "PID@SEC.USEC:memory_region_ops_read cpu 0 ... name 'pit'"),
each an MMIO or port I/O access by the guest to a device QEMU emulates, sorted by what it
would cost under KVM:

- "vmm": an exit to the VMM in user space (QEMU's serial port, RTC, fw_cfg, virtio-mmio
  registers, unassigned ports such as 0x80). Regions this table does not know count here.
- "kernel": handled inside KVM with its in-kernel irqchip and PIT (LAPIC, IOAPIC, PIC):
  an exit, but no trip to user space.
- "pit": the PIT, in-kernel under KVM too; nearly all of these are the guest kernel's TSC
  calibration against PIT channel 2 (port 0x42, ~61 thousand reads in the first 160 ms of
  every boot here), which a KVM guest skips (kvmclock gives it the TSC frequency), so the
  KVM estimate leaves them out.

Not seen: under TCG a write that matches an ioeventfd (a virtio queue notification to a
vhost-user device: kata-vsock, virtiofsd) is signalled before the access is traced, so
those kicks, in-kernel exits under KVM, are not counted."""

import re

KERNEL_REGIONS = {"apic-msi", "ioapic", "pic", "kvm-apic-msi", "kvm-ioapic", "kvm-pic"}
PIT_REGIONS = {"pit", "kvm-pit"}
CLASSES = ("vmm", "kernel", "pit")

LINE = re.compile(rb"^\d+@(\d+)\.(\d+):memory_region_ops_(?:read|write) .* name '([^']*)'",
                  re.M)


def classify(name):
    if name in PIT_REGIONS:
        return "pit"
    if name in KERNEL_REGIONS:
        return "kernel"
    return "vmm"


class TraceCounter:
    """Accesses as (ns, class) in trace order, fed raw bytes as the file grows."""

    def __init__(self):
        self.events = []
        self.by_region = {}
        self._rest = b""

    def feed(self, data):
        data = self._rest + data
        cut = data.rfind(b"\n") + 1
        self._rest = data[cut:]
        for m in LINE.finditer(data, 0, cut):
            name = m.group(3).decode(errors="replace")
            self.by_region[name] = self.by_region.get(name, 0) + 1
            self.events.append((int(m.group(1)) * 1_000_000_000 + int(m.group(2)) * 1000,
                                classify(name)))

    def between(self, t0, t1):
        """Counts per class of the accesses in (t0, t1] (ns; None: open end)."""
        out = dict.fromkeys(CLASSES, 0)
        for t, c in self.events:
            if (t0 is None or t > t0) and (t1 is None or t <= t1):
                out[c] += 1
        return out
