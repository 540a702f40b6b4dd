#!/usr/bin/env python3
"""Usage: python3 bench/listen_race.py exists|listens TRIALS HOGS (as root, virtiofsd installed).

How often a connect right after virtiofsd's socket file appears is refused, on a host
kept busy by CPU hogs, when readiness is the file's existence (old) or the socket's
listening flag in /proc/net/unix (new). Each trial starts the real virtiofsd, confined as
the shim starts it, waits as the chosen rule says, then connects at once."""
import os, socket, subprocess, sys, tempfile, time

RULE = sys.argv[1]          # "exists" or "listens"
TRIALS = int(sys.argv[2])
HOGS = int(sys.argv[3])

def listens(path):
    with open("/proc/self/net/unix") as f:
        for line in f.readlines()[1:]:
            parts = line.split(None, 7)
            if len(parts) == 8 and parts[7].rstrip("\n") == path and int(parts[3], 16) & 0x10000:
                return True
    return False

hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(HOGS)]
refused = ok = 0
try:
    for i in range(TRIALS):
        d = tempfile.mkdtemp(dir="/run")
        share = os.path.join(d, "share"); os.mkdir(share)
        sock = os.path.join(d, "fs.sock")
        p = subprocess.Popen(["/usr/local/bin/virtiofsd", "--socket-path", sock, "--shared-dir", share,
                              "--cache", "auto", "--sandbox", "namespace", "--seccomp", "kill",
                              "--inode-file-handles=never"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, process_group=0)
        while not (os.path.exists(sock) and (RULE == "exists" or listens(sock))):
            time.sleep(0.0005)
        c = socket.socket(socket.AF_UNIX)
        try:
            c.connect(sock); ok += 1
        except ConnectionRefusedError:
            refused += 1
        c.close()
        os.killpg(p.pid, 9); p.wait()
        subprocess.run(["rm", "-rf", d])
finally:
    for h in hogs:
        h.kill(); h.wait()
print(f"rule={RULE} trials={TRIALS} hogs={HOGS} connected={ok} refused={refused}")
