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
those kicks, in-kernel exits under KVM, are not counted.

virtio-mmio accesses are also sorted by device (its DeviceID, read at probe) and by what
they are for: "setup" (probe, features, status, queue set-up), "config" (device config
space, which Linux reads a byte per access, and its generation), "interrupt" (every
interrupt costs a read of InterruptStatus and a write of InterruptACK), "notify" (a
queue notification QEMU itself serves)."""

import re

KERNEL_REGIONS = {"apic-msi", "ioapic", "pic", "kvm-apic-msi", "kvm-ioapic", "kvm-pic"}
PIT_REGIONS = {"pit", "kvm-pit"}
CLASSES = ("vmm", "kernel", "pit")

LINE = re.compile(rb"^\d+@(\d+)\.(\d+):memory_region_ops_(read|write) ([^\n]*) name '([^']*)'",
                  re.M)
ADDR = re.compile(rb" addr (0x[0-9a-f]+) value (0x[0-9a-f]+)")

# virtio-mmio: each transport is 0x200 bytes; register offsets from the virtio spec (4.2.2).
MMIO_WINDOW = 0x200
MMIO_DEVICE_ID = 0x08
MMIO_NOTIFY = 0x50
MMIO_INTERRUPT = (0x60, 0x64)
MMIO_CONFIG_GENERATION = 0xFC
MMIO_CONFIG = 0x100
VIRTIO_NAMES = {1: "net", 2: "block", 3: "console", 4: "rng", 5: "balloon", 19: "vsock",
                26: "fs"}


def mmio_kind(offset):
    if offset in MMIO_INTERRUPT:
        return "interrupt"
    if offset >= MMIO_CONFIG or offset == MMIO_CONFIG_GENERATION:
        return "config"
    if offset == MMIO_NOTIFY:
        return "notify"
    return "setup"


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
        # virtio-mmio: {(transport base, kind): count}, and each transport's device name.
        self._virtio_at = {}
        self._device_at = {}
        self._rest = b""

    def feed(self, data):
        data = self._rest + data
        cut = data.rfind(b"\n") + 1
        self._rest = data[cut:]
        for m in LINE.finditer(data, 0, cut):
            name = m.group(5).decode(errors="replace")
            self.by_region[name] = self.by_region.get(name, 0) + 1
            self.events.append((int(m.group(1)) * 1_000_000_000 + int(m.group(2)) * 1000,
                                classify(name)))
            if name == "virtio-mmio":
                a = ADDR.search(m.group(4))
                if a:
                    self._virtio(m.group(3) == b"read", int(a.group(1), 16), int(a.group(2), 16))

    def _virtio(self, read, addr, value):
        base, offset = addr - addr % MMIO_WINDOW, addr % MMIO_WINDOW
        if read and offset == MMIO_DEVICE_ID:
            self._device_at[base] = (VIRTIO_NAMES.get(value, "id %d" % value) if value
                                     else "empty")
        key = (base, mmio_kind(offset))
        self._virtio_at[key] = self._virtio_at.get(key, 0) + 1

    def virtio(self):
        """virtio-mmio accesses as {"device kind": count}, devices of one type summed
        ("fs setup": both virtio-fs devices' set-up)."""
        out = {}
        for (base, kind), n in self._virtio_at.items():
            key = "%s %s" % (self._device_at.get(base, "unknown"), kind)
            out[key] = out.get(key, 0) + n
        return out

    def virtio_devices(self):
        """{device name: how many virtio-mmio transports have one}."""
        out = {}
        for name in self._device_at.values():
            out[name] = out.get(name, 0) + 1
        return out

    def between(self, t0, t1):
        """Counts per class of the accesses in (t0, t1] (ns; None: open end)."""
        out = dict.fromkeys(CLASSES, 0)
        for t, c in self.events:
            if (t0 is None or t > t0) and (t1 is None or t <= t1):
                out[c] += 1
        return out
