"""7: hold. BENCH_HOLD kata sandboxes held at once (started BENCH_DENSITY at a time, each
wave once the previous one runs): how many run, how long it took, the host memory they
use together; then all are removed and the bench checks nothing of them is left."""

import time

from .density import density_once
from .host import mem_available_kib, our_sandboxes, settled_mem_available_kib
from .settings import DENSITY, HOLD, log


def bench_hold(h):
    before = settled_mem_available_kib()
    t0 = time.monotonic()
    held, lost = [], 0
    while len(held) + lost < HOLD:
        wave = min(DENSITY, HOLD - len(held) - lost)
        r = density_once(h, "kata", count=wave, remove=False, detail=False)
        held += r["ids"]
        lost += r["lost"]
    t_all = (time.monotonic() - t0) * 1000
    running = [c for c in held if h.tasks().get(c) == "RUNNING"]
    used = (before - mem_available_kib()) / 1024
    log("hold: %d of %d running after %.0f ms, %.1f MiB used" % (len(running), HOLD, t_all, used))
    h.remove(held)
    deadline = time.monotonic() + 60
    left = [d for d in our_sandboxes() if any(d.endswith("/" + c) for c in held)]
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = [d for d in our_sandboxes() if any(d.endswith("/" + c) for c in held)]
    if left:
        log("hold: left behind after removal: %s" % left)
    sec = "7. hold: %d kata sandboxes at once (waves of %d)" % (HOLD, DENSITY)
    R = h.report
    R.add(sec, "hold_running", "running at once", "count",
          "ctr task ls after the last wave", kata=[len(running)], single=True)
    R.add(sec, "hold_lost", "lost (not RUNNING)", "count",
          "ctr run -d failed or not RUNNING in time", kata=[HOLD - len(running)], single=True)
    R.add(sec, "hold_ms", "time to start them all", "ms",
          "first wave spawned to last wave RUNNING", kata=[t_all], single=True)
    R.add(sec, "hold_mem_per_mib", "host memory per sandbox", "MiB",
          "MemAvailable drop with all running, divided by the number running",
          kata=[used / len(running)] if running else [], single=True)
