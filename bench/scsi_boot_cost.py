#!/usr/bin/env python3
"""What the virtio-scsi controller of `block_device_hotplug` costs a boot: guest instructions
of a bare boot (the floor init) without it, with it and the kernel's default SCSI scan, and
with it and `scsi_mod.scan=manual` (what the runtime boots with). QEMU microvm under TCG with
-icount shift=0 -no-shutdown; the icount is read over QMP (query-replay) once the guest has
powered off. Deterministic: one run per variant is enough.

    guest/build-floor-initrd.sh /tmp/floor.img
    FLOOR_INITRD=/tmp/floor.img python3 bench/scsi_boot_cost.py [RUNS]
"""
import json, os, socket, subprocess, sys, tempfile, time
K = os.environ.get("KATA_KERNEL") or subprocess.run(["bash", "guest/build-kernel.sh"], capture_output=True, text=True, check=True).stdout.strip()
I = os.environ["FLOOR_INITRD"]  # guest/build-floor-initrd.sh OUTPUT.img
CPU = "max,erms=off,fsrm=off,fzrm=off,fsrs=off,fsrc=off"

def boot(extra_dev, append):
    tmp = tempfile.TemporaryDirectory()
    d = tmp.name
    qmp = os.path.join(d, "qmp.sock")
    cmdline = "console=ttyS0 reboot=t panic=-1 io_delay=none quiet virtiofs.clear_reply_pages=1 nolapic_timer keep_initmem " + append
    args = ["qemu-system-x86_64", "-M", "microvm,acpi=off,x-option-roms=off,isa-serial=on",
            "-accel", "tcg,tb-size=64", "-cpu", CPU, "-m", "512M",
            "-object", "memory-backend-memfd,id=mem,size=512M,share=on", "-machine", "memory-backend=mem",
            "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-no-shutdown",
            "-icount", "shift=0", "-kernel", K, "-initrd", I, "-append", cmdline,
            "-serial", "file:" + os.path.join(d, "console"),
            "-qmp", "unix:%s,server=on,wait=off" % qmp] + extra_dev
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(qmp):
            time.sleep(0.01)
        s = socket.socket(socket.AF_UNIX); s.connect(qmp); f = s.makefile("rw")
        f.readline(); f.write('{"execute":"qmp_capabilities"}\n'); f.flush(); f.readline()
        deadline = time.time() + 120
        while time.time() < deadline:
            f.write('{"execute":"query-status"}\n'); f.flush()
            while True:
                m = json.loads(f.readline())
                if "return" in m: break
            if m["return"]["status"] in ("shutdown", "guest-panicked"):
                break
            time.sleep(0.05)
        f.write('{"execute":"query-replay"}\n'); f.flush()
        while True:
            m = json.loads(f.readline())
            if "return" in m: return m["return"]["icount"]
    finally:
        p.kill(); p.wait(); tmp.cleanup()

variants = {
    "none": ([], ""),
    "scsi, scan=sync": (["-device", "virtio-scsi-device,id=scsi0"], ""),
    "scsi, scan=manual": (["-device", "virtio-scsi-device,id=scsi0"], "scsi_mod.scan=manual"),
}
runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
res = {k: [] for k in variants}
for r in range(runs):
    for k, (dev, app) in variants.items():
        res[k].append(boot(dev, app))
for k, v in res.items():
    v.sort()
    print("%-18s median %.2f M instructions  %s" % (k, v[len(v)//2] / 1e6, [round(x / 1e6, 2) for x in v]))
