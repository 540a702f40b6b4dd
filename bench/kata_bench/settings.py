"""What the bench runs against and how long it may take: constants and the BENCH_* env vars
(bench/README.md lists them)."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE = "docker.io/library/busybox:latest"
RT = {"kata": "io.containerd.kata.v2", "runc": "io.containerd.runc.v2"}
NS = "bench"
PREFIX = "kb%d" % os.getpid()  # every container id this bench makes starts with this
SBS = "/run/vc/sbs"
VMDIR = "/run/vc/vm"
BENCH_SINK_PORT = 1025
BENCH_SINK_PARAM = "agent.bench_sink=1"  # kernel_params word that turns the sink on
MB = 1e6


def env_int(name, default):
    v = os.environ.get(name, "")
    try:
        return int(v) if v else default
    except ValueError:
        sys.exit("bench: %s=%r is not an integer" % (name, v))


RUNS = max(1, env_int("BENCH_RUNS", 5))
DENSITY = max(1, env_int("BENCH_DENSITY", 10))
DENSITY_RUNS = max(1, env_int("BENCH_DENSITY_RUNS", RUNS))
HOLD = max(1, env_int("BENCH_HOLD", 50))
# The VM pool rows (`pool`): ready VMs for the echo runs; the density rows use a pool of
# BENCH_DENSITY. BENCH_POOL_FILL_TIMEOUT bounds each wait for a full pool.
POOL = max(1, env_int("BENCH_POOL", 2))
POOL_FILL_TIMEOUT = env_int("BENCH_POOL_FILL_TIMEOUT", 300)
# Whole MiB: the container writes with `dd bs=1M` (busybox `head -c` costs more guest CPU
# per byte than the channel does under TCG, so it would measure itself, not the channel).
STDOUT_BYTES = max(1, env_int("BENCH_STDOUT_BYTES", 256 << 20) >> 20) << 20
CMD_TIMEOUT = env_int("BENCH_CMD_TIMEOUT", 120)
STDOUT_TIMEOUT = env_int("BENCH_STDOUT_TIMEOUT", 600)
DENSITY_TIMEOUT = env_int("BENCH_DENSITY_TIMEOUT", 300)
DEADLINE = env_int("BENCH_DEADLINE", 5400)
SKIP = set(s.strip() for s in os.environ.get("BENCH_SKIP", "").split(",") if s.strip())
OUT_DIR = os.environ.get("BENCH_OUT", os.path.join(REPO, "target", "bench"))


def log(msg):
    print("bench: " + msg, file=sys.stderr, flush=True)


def ab_order(i):
    """The order of the two sides in run i: kata first on even runs, runc first on odd."""
    return ["kata", "runc"] if i % 2 == 0 else ["runc", "kata"]
