"""Runs the measurements in order, then cleans up, prints the table and writes the JSON."""

import datetime
import json
import os
import shutil
import signal
import sys

from .density import bench_density
from .harness import Harness
from .hold import bench_hold
from .idle import bench_idle
from .instrumented import bench_instrumented
from .pool import bench_pool
from .resize import bench_resize
from .procs import Interrupted, on_alarm, on_signal
from .report import print_table
from .settings import (DEADLINE, DENSITY, DENSITY_RUNS, IMAGE, OUT_DIR, RUNS, SKIP,
                       STDOUT_BYTES, log)
from .startup import bench_startup
from .throughput import bench_stdout

# In order; the names are those BENCH_SKIP takes.
MEASUREMENTS = [
    ("startup", bench_startup),
    ("stdout", bench_stdout),
    ("idle", bench_idle),
    # After the memory rows, which its goals section reads.
    ("kvm", bench_instrumented),
    ("density", bench_density),
    # Its own factory and pool; cold rows of its own in the same run.
    ("pool", bench_pool),
    ("hold", bench_hold),
    ("resize", bench_resize),
]


def main():
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (containerd, QEMU, mounts)")
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(DEADLINE)
    started = datetime.datetime.now(datetime.timezone.utc)
    load0 = os.getloadavg()
    b = Harness()
    err = None
    try:
        b.setup()
        for name, measure in MEASUREMENTS:
            if name not in SKIP:
                measure(b)
    except Interrupted as e:
        err = "interrupted: %s" % e
    except Exception as e:  # report what was measured so far, then clean up
        err = "%s: %s" % (type(e).__name__, e)
    finally:
        signal.alarm(0)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        log("cleaning up")
        problems = b.cleanup()
    if err:
        log("bench stopped early: " + err)
        b.report.notes.append("bench stopped early: " + err)
    for p in problems:
        log("cleanup problem: " + p)
        b.report.notes.append("cleanup problem: " + p)
    load1 = os.getloadavg()
    b.report.notes.append(
        "accelerator %s; %d CPUs; load average %.2f at start, %.2f at end: numbers are only "
        "meaningful on an otherwise idle machine" % (b.accel or "unknown", os.cpu_count(),
                                                     load0[0], load1[0]))
    header = "make bench, %s: %d runs, kata/runc alternating; density %d x %d" % (
        started.strftime("%Y-%m-%d %H:%M:%S UTC"), RUNS, DENSITY, DENSITY_RUNS)
    text = print_table(b.report, header) if b.report.rows else header
    out_dir = OUT_DIR
    os.makedirs(out_dir, exist_ok=True)
    doc = {
        "started": started.isoformat(), "runs": RUNS, "density": DENSITY,
        "density_runs": DENSITY_RUNS, "stdout_bytes": STDOUT_BYTES, "accelerator": b.accel,
        "cpus": os.cpu_count(), "loadavg_start": load0, "loadavg_end": load1,
        "kernel": b.kernel, "initrd": b.initrd, "image": IMAGE,
        "figures": b.report.rows, "notes": b.report.notes, "error": err,
        "cleanup_problems": problems, "table": text,
    }
    path = os.path.join(out_dir, started.strftime("%Y%m%dT%H%M%SZ") + ".json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    shutil.copyfile(path, os.path.join(out_dir, "latest.json"))
    log("wrote %s and latest.json" % path)
    return 1 if (err or problems) else 0

