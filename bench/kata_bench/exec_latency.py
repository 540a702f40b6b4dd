"""4: `ctr task exec ... true` latency into a running container, both sides."""

import time

from .settings import RUNS, ab_order, log


def measure(h, ids):
    """RUNS execs into each side's running container (and into the kata one with
    virtio_fs_cache = "always"): ms per side, failures per side."""
    ex = {"kata": [], "runc": [], "kata_cached": []}
    exf = {"kata": 0, "runc": 0, "kata_cached": 0}
    for i in range(RUNS):
        for side in ab_order(i) + ["kata_cached"]:
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
          "wall time of `ctr task exec --exec-id eN CONTAINER true` into a running `sleep 600`",
          kata=ex["kata"], runc=ex["runc"],
          failed={"kata": exf["kata"], "runc": exf["runc"]})
    R.add("4. exec", "exec_true_cache_always_ms", "  with virtio_fs_cache = always", "ms",
          "the same into a kata `sleep 600` whose configuration sets virtio_fs_cache = \"always\" "
          "(the guest keeps the image's files cached; the default \"auto\" re-reads a binary "
          "through virtio-fs at every exec)",
          kata=ex["kata_cached"], failed={"kata": exf["kata_cached"]}, single=True)
