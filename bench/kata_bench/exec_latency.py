"""4: `ctr task exec ... true` latency into a running container, both sides."""

import time

from .settings import RUNS, ab_order, log


def measure(h, ids):
    """RUNS execs into each side's running container (and into the kata one with one
    share): ms per side, failures per side."""
    ex = {"kata": [], "runc": [], "kata_one_share": []}
    exf = {"kata": 0, "runc": 0, "kata_one_share": 0}
    for i in range(RUNS):
        for side in ab_order(i) + ["kata_one_share"]:
            m0 = time.monotonic()
            rc, _, err = h.ctr("task", "exec", "--fifo-dir", h.fifo, "--exec-id",
                               "e%d" % (i + 1), ids[side], "true")
            ms = (time.monotonic() - m0) * 1000
            if rc != 0:
                exf[side] += 1
                log("%s exec failed (rc %s): %s" % (side, rc, err[-300:]))
            else:
                ex[side].append(ms)
    return ex, exf


def add_rows(R, ex, exf):
    R.add("4. exec", "exec_true_ms", "ctr task exec ... true", "ms",
          "wall time of `ctr task exec --exec-id eN CONTAINER true` into a running `sleep 600` "
          "(kata: the default, root filesystems through the rootfs share, cache always)",
          kata=ex["kata"], runc=ex["runc"],
          failed={"kata": exf["kata"], "runc": exf["runc"]})
    R.add("4. exec", "exec_true_one_share_ms", "  with one share (rootfs cache auto)", "ms",
          "the same into a kata `sleep 600` whose configuration sets virtio_fs_rootfs_cache = "
          "\"auto\", the volumes' policy: one virtiofsd, and the guest re-reads a binary "
          "through virtio-fs at every exec",
          kata=ex["kata_one_share"], failed={"kata": exf["kata_one_share"]}, single=True)
