"""Watches one VM while it runs, from a thread of the bench: over a QMP socket of the
bench's own (see `instrumented`), the guest instructions executed so far (`query-replay`'s
icount, with `-icount shift=0`) and its vCPU thread (`query-cpus-fast`); that thread's CPU
from /proc (the last value read before the thread ends); and QEMU's trace file (`-D`),
read as it grows and kept open, so what the VM wrote is read whole even after the
sandbox's run directory is removed.

Each sample is stamped with the wall clock (ns), the clock of the shim's log records and of
QEMU's trace lines, so values can be read off at the shim's phases afterwards."""

import os
import threading
import time

from .devices import TraceCounter
from .hostcpu import process_cpu_ns, thread_cpu_ns, thread_wait_ns
from .qmp import Qmp, QmpError

POLL_S = 0.002
# QEMU's QMP monitor thread (named with -name debug-threads=on): busy with the bench's own
# polling, so left out of QEMU's CPU.
MONITOR_THREADS = ("IO mon_iothread",)


class VmWatch(threading.Thread):
    def __init__(self, qmp_path, trace_path=None, icount=False, stop_on_shutdown=False):
        super().__init__(daemon=True)
        self.qmp_path = qmp_path
        self.trace_path = trace_path
        self.icount = icount
        self.stop_evt = threading.Event()
        self.icounts = []  # (ns, instructions)
        self.vcpu_tid = None
        self.vcpu_ns = None  # the vCPU thread's CPU at the last sample
        self.vcpu_wait_ns = None  # and the time it waited for a CPU, runnable
        self.trace = TraceCounter() if trace_path else None
        self.qmp = None
        self.qmp_gone = False
        # With stop_on_shutdown (the floor, under -no-shutdown): once the guest has powered
        # off, the last samples are taken, QEMU is told to quit and the watch ends;
        # shut_down is then the monotonic time it was seen.
        self.stop_on_shutdown = stop_on_shutdown
        self.shut_down = None
        # QEMU's whole CPU (all threads but the monitor's) once the guest has powered off
        self.proc_ns = None
        self.error = None
        self._trace_f = None

    def run(self):
        try:
            while not self.stop_evt.is_set():
                self.sample()
                time.sleep(POLL_S)
            self.sample()
        except Exception as e:  # reported by the caller, never raised in the thread
            self.error = "%s: %s" % (type(e).__name__, e)
        finally:
            self.read_trace()
            if self._trace_f:
                self._trace_f.close()
            if self.qmp:
                self.qmp.close()

    def sample(self):
        if self.trace_path and self._trace_f is None:
            try:
                self._trace_f = open(self.trace_path, "rb")
            except FileNotFoundError:
                pass
        self.read_trace()
        if self.qmp_path and self.qmp is None and not self.qmp_gone and \
                os.path.exists(self.qmp_path):
            try:
                self.qmp = Qmp(self.qmp_path)
                cpus = self.qmp.execute("query-cpus-fast")
                self.vcpu_tid = cpus[0]["thread-id"] if cpus else None
            except (OSError, QmpError):
                if self.qmp:
                    self.qmp.close()
                self.qmp = None
        if self.qmp is not None and self.icount:
            try:
                t0 = time.time_ns()
                n = self.qmp.execute("query-replay")["icount"]
                t1 = time.time_ns()
                self.icounts.append(((t0 + t1) // 2, n))
            except (OSError, QmpError, ValueError):
                self.qmp.close()
                self.qmp, self.qmp_gone = None, True
        if self.stop_on_shutdown and self.qmp is not None and not self.shut_down:
            try:
                if self.qmp.execute("query-status")["status"] == "shutdown":
                    self.shut_down = time.monotonic()
            except (OSError, QmpError):
                self.qmp.close()
                self.qmp, self.qmp_gone = None, True
        if self.vcpu_tid:
            v, q = thread_cpu_ns(self.vcpu_tid), thread_wait_ns(self.vcpu_tid)
            if v is not None and q is not None:  # both, or neither (the thread ended)
                self.vcpu_ns, self.vcpu_wait_ns = v, q
        if self.shut_down and self.qmp is not None:
            # The guest powered off (-no-shutdown keeps QEMU): every figure is final.
            if self.vcpu_tid:
                self.proc_ns = process_cpu_ns(self.vcpu_tid, MONITOR_THREADS)
            try:
                if self.icount:
                    self.icounts.append((time.time_ns(),
                                         self.qmp.execute("query-replay")["icount"]))
                self.qmp.execute("quit")
            except (OSError, QmpError):
                pass
            self.qmp.close()
            self.qmp, self.qmp_gone = None, True
            self.stop_evt.set()

    def read_trace(self):
        if self._trace_f:
            data = self._trace_f.read()
            if data:
                self.trace.feed(data)

    def finish(self, timeout=10):
        self.stop_evt.set()
        self.join(timeout)

    def icount_at(self, t_ns):
        """Instructions at wall time t_ns, interpolated between the samples around it, and
        the spread between those two samples (the most the figure can be off); (None, None)
        outside the sampled span."""
        s = self.icounts
        if not s or t_ns < s[0][0] or t_ns > s[-1][0]:
            return None, None
        lo, hi = 0, len(s) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if s[mid][0] <= t_ns:
                lo = mid
            else:
                hi = mid
        (ta, na), (tb, nb) = s[lo], s[hi]
        if tb == ta:
            return float(na), 0
        return na + (nb - na) * (t_ns - ta) / (tb - ta), nb - na

    def last_icount(self):
        return self.icounts[-1][1] if self.icounts else None
