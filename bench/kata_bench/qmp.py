"""Just enough QMP (QEMU's JSON control protocol over a unix socket) for the instrumented
runs: the greeting, capabilities, and one command at a time; events are skipped."""

import json
import socket


class QmpError(Exception):
    pass


class Qmp:
    def __init__(self, path, timeout=5.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
            self.f = self.sock.makefile("rw")
            greeting = self._line()
            if "QMP" not in greeting:
                raise QmpError("%s: no QMP greeting: %r" % (path, greeting))
            self.execute("qmp_capabilities")
        except BaseException:
            self.sock.close()
            raise

    def _line(self):
        line = self.f.readline()
        if not line:
            raise QmpError("QMP connection closed")
        return json.loads(line)

    def execute(self, cmd, **args):
        msg = {"execute": cmd}
        if args:
            msg["arguments"] = args
        self.f.write(json.dumps(msg) + "\n")
        self.f.flush()
        while True:
            r = self._line()
            if "return" in r:
                return r["return"]
            if "error" in r:
                raise QmpError("%s: %s" % (cmd, r["error"].get("desc", r["error"])))

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
