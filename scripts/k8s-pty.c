/* Runs a command on a terminal of its own, for the Kubernetes suite's `exec -it` case
 * (tests/k8s/cases.sh): kubectl allocates a terminal in the container only when its own
 * stdin is one.
 *
 *   k8s-pty SECONDS CMD [ARG...]
 *
 * CMD runs as a session leader whose controlling terminal is a new pseudo-terminal (its
 * stdin, stdout and stderr). What it writes there is copied to our stdout. Nothing is ever
 * typed into it: its stdin stays open and empty until it exits (util-linux's `script` sends
 * an end-of-file when its own stdin is /dev/null, which raced kubectl's raw mode in CI and
 * once hung until CI's deadline). After SECONDS, CMD's session gets SIGTERM, and SIGKILL 5 s
 * later; the exit status is then 124, as timeout(1)'s. Otherwise it is CMD's. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int fail(const char *what) {
    fprintf(stderr, "k8s-pty: %s: %s\n", what, strerror(errno));
    return 125;
}

static int status_of(int status) {
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 125;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: k8s-pty SECONDS CMD [ARG...]\n");
        return 125;
    }
    char *end;
    double limit = strtod(argv[1], &end);
    if (*end != '\0' || limit <= 0) {
        fprintf(stderr, "k8s-pty: SECONDS must be a positive number, not '%s'\n", argv[1]);
        return 125;
    }
    int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0)
        return fail("posix_openpt");
    if (grantpt(master) != 0 || unlockpt(master) != 0)
        return fail("grantpt/unlockpt");
    const char *name = ptsname(master);
    if (name == NULL)
        return fail("ptsname");
    char slave_path[256];
    snprintf(slave_path, sizeof(slave_path), "%s", name);

    pid_t child = fork();
    if (child < 0)
        return fail("fork");
    if (child == 0) {
        /* A new session: the first terminal it opens becomes its controlling one. */
        if (setsid() < 0)
            _exit(fail("setsid"));
        int slave = open(slave_path, O_RDWR);
        if (slave < 0)
            _exit(fail(slave_path));
        if (ioctl(slave, TIOCSCTTY, 0) != 0)
            _exit(fail("TIOCSCTTY"));
        if (dup2(slave, 0) < 0 || dup2(slave, 1) < 0 || dup2(slave, 2) < 0)
            _exit(fail("dup2"));
        if (slave > 2)
            close(slave);
        execvp(argv[2], &argv[2]);
        fail(argv[2]);
        _exit(127);
    }

    double deadline = now() + limit;
    int timed_out = 0, status = 0, exited = 0;
    char buf[4096];
    for (;;) {
        if (!exited) {
            pid_t r = waitpid(child, &status, WNOHANG);
            if (r == child)
                exited = 1;
        }
        double left = deadline - now();
        if (left <= 0 && !exited) {
            timed_out = 1;
            /* The child is its session's and process group's leader: end the group. */
            kill(-child, SIGTERM);
            kill(child, SIGTERM);
            double grace = now() + 5;
            while (waitpid(child, &status, WNOHANG) == 0 && now() < grace)
                usleep(100 * 1000);
            kill(-child, SIGKILL);
            kill(child, SIGKILL);
            waitpid(child, &status, 0);
            break;
        }
        struct pollfd p = {.fd = master, .events = POLLIN};
        /* Once the child has exited, only drain what is already there. */
        int wait_ms = exited ? 0 : (left > 0.2 ? 200 : (int)(left * 1000) + 1);
        int n = poll(&p, 1, wait_ms);
        if (n < 0 && errno != EINTR)
            return fail("poll");
        if (n > 0) {
            ssize_t got = read(master, buf, sizeof(buf));
            if (got > 0) {
                if (fwrite(buf, 1, (size_t)got, stdout) != (size_t)got)
                    return fail("write");
                fflush(stdout);
                continue;
            }
            /* EIO: every holder of the terminal's other side closed it. */
            if (exited)
                break;
            if (got < 0 && errno != EIO && errno != EINTR)
                return fail("read");
            if (got <= 0) {
                /* Nothing more will come: wait for the exit within the deadline. */
                usleep(50 * 1000);
            }
            continue;
        }
        if (exited)
            break;
    }
    close(master);
    if (timed_out) {
        fprintf(stderr, "k8s-pty: %s did not end within %s s: ended\n", argv[2], argv[1]);
        return 124;
    }
    return status_of(status);
}
