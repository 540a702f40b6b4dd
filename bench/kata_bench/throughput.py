"""3: throughput. Container stdout through ctr (3a, both sides) and the vsock ceiling (3b,
kata only): the agent's bench sink read through the sandbox's hybrid vsock socket."""

import os
import select
import socket
import subprocess
import time

from .procs import LIVE, kill_group, spawn
from .report import fmt_num
from .settings import (BENCH_SINK_PORT, CMD_TIMEOUT, MB, RUNS, STDOUT_BYTES, STDOUT_TIMEOUT,
                       VMDIR, ab_order, log)

SECTION = "3. throughput"


def stdout_run(h, side):
    cid = h.new_id(side[0] + "t")
    cmd = h.run_args(side, cid, ["dd", "if=/dev/zero", "bs=1M", "count=%d" % (STDOUT_BYTES >> 20)])
    p = spawn(cmd, env=h.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    fd = p.stdout.fileno()
    n, t_first, t_last = 0, None, None
    deadline = time.monotonic() + STDOUT_TIMEOUT
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        r, _, _ = select.select([fd], [], [], min(left, 5))
        if not r:
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            t_last = time.monotonic()
            break
        if t_first is None:
            t_first = time.monotonic()
        n += len(chunk)
    if timed_out:
        kill_group(p)
    try:
        rc = p.wait(timeout=CMD_TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_group(p)
        rc = p.wait()
    p.stdout.close()
    LIVE.pop(p.pid, None)
    if timed_out or rc != 0 or n != STDOUT_BYTES or t_first is None:
        log("%s stdout run %s failed: rc %s, %d of %d bytes%s" % (
            side, cid, rc, n, STDOUT_BYTES, ", timed out" if timed_out else ""))
        h.remove([cid], timeout=30)
        return None
    return n / (t_last - t_first) / MB


def bench_stdout(h):
    vals = {"kata": [], "runc": []}
    fails = {"kata": 0, "runc": 0}
    for i in range(RUNS):
        got = {}
        for side in ab_order(i):
            v = stdout_run(h, side)
            got[side] = v
            if v is None:
                fails[side] += 1
            else:
                vals[side].append(v)
        log("stdout run %d/%d: kata %s MB/s, runc %s MB/s" % (
            i + 1, RUNS, fmt_num(got.get("kata"), "MB/s"), fmt_num(got.get("runc"), "MB/s")))
    h.report.add(
        SECTION, "stdout_mbps", "stdout %d MiB via ctr" % (STDOUT_BYTES >> 20), "MB/s",
        "ctr run --rm ... dd if=/dev/zero bs=1M (%d bytes); stdout piped to a Python reader; bytes / "
        "(first byte to EOF), byte count checked" % STDOUT_BYTES,
        kata=vals["kata"], runc=vals["runc"], failed=fails)


def vsock_ceiling(sandbox):
    """MB/s of STDOUT_BYTES read from the bench sink of a running kata sandbox."""
    path = os.path.join(VMDIR, sandbox, "kata.hvsock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(path)
        s.sendall(b"CONNECT %d\n" % BENCH_SINK_PORT)
        buf = b""
        while b"\n" not in buf:
            c = s.recv(256)
            if not c:
                raise RuntimeError("hybrid vsock closed before the OK line (got %r)" % buf)
            buf += c
            if len(buf) > 256:
                raise RuntimeError("no OK line: %r" % buf[:256])
        line, _, rest = buf.partition(b"\n")
        if not line.upper().startswith(b"OK"):
            raise RuntimeError("CONNECT %d answered %r" % (BENCH_SINK_PORT, line))
        n = len(rest)
        mv = memoryview(bytearray(1 << 20))
        t0 = time.monotonic()
        deadline = t0 + STDOUT_TIMEOUT
        while n < STDOUT_BYTES:
            if time.monotonic() > deadline:
                raise RuntimeError("timed out after %d bytes" % n)
            k = s.recv_into(mv, min(len(mv), STDOUT_BYTES - n))
            if not k:
                raise RuntimeError("sink closed after %d bytes" % n)
            n += k
        return n / (time.monotonic() - t0) / MB
    finally:
        s.close()


def measure_vsock_ceiling(sandbox):
    """RUNS reads from the bench sink: MB/s of each, and how many failed."""
    ceil, cfail = [], 0
    for i in range(RUNS):
        try:
            v = vsock_ceiling(sandbox)
            ceil.append(v)
            log("vsock ceiling run %d/%d: %.1f MB/s" % (i + 1, RUNS, v))
        except (OSError, RuntimeError) as e:
            cfail += 1
            log("vsock ceiling run %d/%d failed: %s" % (i + 1, RUNS, e))
    return ceil, cfail


def add_vsock_ceiling_rows(R, ceil, cfail):
    R.add(
        SECTION, "vsock_ceiling_mbps", "vsock ceiling %d MiB" % (STDOUT_BYTES >> 20),
        "MB/s", "idle kata sandbox: host reads zeros from the agent's bench sink (vsock port "
        "%d) via /run/vc/vm/<id>/kata.hvsock 'CONNECT %d'; bytes / (OK line to last byte)"
        % (BENCH_SINK_PORT, BENCH_SINK_PORT), kata=ceil, failed={"kata": cfail}, single=True)
