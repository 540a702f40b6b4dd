"""The bench's world: a private containerd with the busybox image, a configuration that
turns the agent's bench sink on, container ids of this bench, `ctr` helpers, and the
clean-up that leaves the host as it found it."""

import os
import shutil
import subprocess
import tempfile
import time
import tomllib

from . import shimlog
from .host import cmdline, listing, our_sandboxes
from .hostcpu import ContainerdCgroup
from .procs import LIVE, kill_group, reap, run, spawn
from .report import Report
from .settings import (BENCH_SINK_PARAM, CMD_TIMEOUT, IMAGE, NS, PREFIX, REPO, RT, SBS,
                       VMDIR, log)


def default_memory_mib():
    """[hypervisor.qemu] default_memory of the default configuration (config/configuration.toml,
    what `make install` puts down), in MiB."""
    path = os.path.join(REPO, "config", "configuration.toml")
    with open(path, "rb") as f:
        conf = tomllib.load(f)
    mib = conf.get("hypervisor", {}).get("qemu", {}).get("default_memory")
    if not isinstance(mib, int) or mib <= 0:
        raise RuntimeError("%s: [hypervisor.qemu] default_memory is %r, not a size in MiB"
                           % (path, mib))
    return mib


class Harness:
    def __init__(self):
        self.work = tempfile.mkdtemp(prefix="kata-bench.", dir="/tmp")
        self.cdir = os.path.join(self.work, "c")
        self.sock = os.path.join(self.cdir, "containerd.sock")
        self.fifo = os.path.join(self.work, "fifo")
        self.logfile = os.path.join(self.cdir, "containerd.log")
        self.kernel = os.environ.get("KATA_KERNEL") or ""
        # The agent's bench sink is only in the bench's initrd (make initrd-bench).
        self.initrd = os.environ.get("KATA_INITRD", "/var/cache/kata-guest/kata-initrd-bench.img")
        self.image_tar = os.environ.get("IMAGE_TAR", "/var/cache/kata-guest/busybox-image.tar")
        shim_dir = os.environ.get("KATA_SHIM_DIR", os.path.join(REPO, "target", "release"))
        self.shim_dir = shim_dir
        self.conf = os.path.join(self.work, "configuration.toml")
        # The same configuration with one virtio-fs share for volumes and root filesystems
        # alike (virtio_fs_rootfs_cache = virtio_fs_cache = "auto": one virtiofsd, no
        # rootfs cache), for the exec row that shows what the rootfs share saves.
        self.conf_one_share = os.path.join(self.work, "configuration-one-share.toml")
        # The same configuration with a resize ceiling (written by `resize`).
        self.conf_resize = os.path.join(self.work, "configuration-resize.toml")
        self.floor_initrd = os.path.join(self.work, "floor.img")
        # The sandboxes' memory size (the bench runs the default configuration), which the
        # floor's bare VM gets too.
        self.memory_mib = default_memory_mib()
        self.env = dict(os.environ)
        self.env["PATH"] = shim_dir + ":" + os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        self.env["KATA_CONF_FILE"] = self.conf
        self.containerd_started = False
        self.seq = 0
        self.accel = None  # the accelerator the shim chose, from its "VMM launched" record
        self.report = Report()
        # containerd's CPU and that of what it starts (see `hostcpu`), for the host CPU rows.
        self.cgroup = ContainerdCgroup()
        self.instrumented_confs = {}
        self.sbs_before = listing(SBS)
        self.vm_before = listing(VMDIR)

    # -- ids and ctr ----------------------------------------------------------------------
    def new_id(self, tag):
        self.seq += 1
        return "%s-%s%d" % (PREFIX, tag, self.seq)

    def ctr_cmd(self, *args):
        return ["ctr", "-a", self.sock, "-n", NS] + list(args)

    def ctr(self, *args, timeout=None):
        return run(self.ctr_cmd(*args), timeout=timeout, env=self.env)

    def run_args(self, side, cid, cmd, detach=False, rm=True, config=None):
        a = ["run", "--runtime", RT[side], "--fifo-dir", self.fifo]
        if config:
            a += ["--runtime-config-path", config]
        if detach:
            a.append("-d")
        if rm:
            a.append("--rm")
        return self.ctr_cmd(*(a + [IMAGE, cid] + cmd))

    def shim_records(self, sandbox):
        """The shim's JSON log lines of one sandbox, from containerd's log."""
        return shimlog.sandbox_records(self.logfile, sandbox)

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

    # -- set-up -------------------------------------------------------------------------
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
        # The agent starts its bench sink (vsock port 1025, read by the vsock ceiling) only
        # when the kernel command line asks for it; production sandboxes have no such port.
        # Otherwise the default configuration, as users run it (the phase lines are info).
        for path, extra in ((self.conf, ""),
                            (self.conf_one_share, 'virtio_fs_rootfs_cache = "auto"\n')):
            with open(path, "w") as f:
                f.write('[hypervisor.qemu]\nkernel = "%s"\ninitrd = "%s"\nvsock_backend = "%s/kata-vsock"\n'
                        'kernel_params = "%s"\n%s'
                        % (self.kernel, self.initrd, self.shim_dir, BENCH_SINK_PARAM, extra))
        rc, _, err = run(["bash", os.path.join(REPO, "guest/build-floor-initrd.sh"),
                          self.floor_initrd], timeout=300)
        if rc != 0:
            raise RuntimeError("guest/build-floor-initrd.sh failed: " + err[-2000:])
        self.containerd_started = True  # from here on, cleanup stops it (harmless if absent)
        rc, out, err = run(["bash", os.path.join(REPO, "scripts/containerd-private.sh"), "start",
                            self.cdir], timeout=60, env=self.env)
        if rc != 0:
            raise RuntimeError("starting the private containerd failed: " + err[-2000:])
        try:
            with open(os.path.join(self.cdir, "containerd.pid")) as f:
                self.cgroup.adopt(int(f.read().strip()))
        except (OSError, ValueError) as e:
            self.cgroup.error = "containerd's pid not read: %s" % e
        if self.cgroup.error:
            log("host CPU rows off: " + self.cgroup.error)
        rc, _, err = self.ctr("images", "import", self.image_tar, timeout=120)
        if rc != 0:
            raise RuntimeError("importing %s failed: %s" % (self.image_tar, err[-2000:]))
        log("private containerd at %s, image imported" % self.sock)

    # -- clean-up -----------------------------------------------------------------------
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
        p = self.cgroup.remove()
        if p:
            problems.append(p)
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
