"""Child processes: each in its own session (process group = its pid), remembered until it
ends, so clean-up can kill whatever is still running by pid; and the signals that stop the
bench early."""

import os
import signal
import subprocess

from .settings import CMD_TIMEOUT, DEADLINE


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted("signal %d" % signum)


def on_alarm(_signum, _frame):
    raise Interrupted("BENCH_DEADLINE of %d s reached" % DEADLINE)




LIVE = {}


def spawn(cmd, env=None, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE):
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                         stderr=stderr, start_new_session=True)
    LIVE[p.pid] = p
    return p


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap(p, timeout):
    """Waits for p up to timeout s (then kills its group); returns (rc or None, out, err)."""
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        kill_group(p)
        out, err = p.communicate()
        rc = None
    finally:
        LIVE.pop(p.pid, None)
    return rc, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")


def run(cmd, timeout=None, env=None):
    p = spawn(cmd, env=env, stdout=subprocess.PIPE)
    return reap(p, timeout or CMD_TIMEOUT)


