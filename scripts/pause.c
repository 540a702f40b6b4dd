/*
 * pause: the process that holds a pod sandbox's namespaces for the end-to-end tests'
 * pause image (scripts/pause-image.sh), written for this project.
 *
 * It sleeps until SIGTERM or SIGINT, then exits 0. When it is PID 1 of the pod's PID
 * namespace (namespace_options.pid = POD), orphans are re-parented to it: it reaps every
 * child that exits, so none stays a zombie. `pause -v` prints a version line.
 *
 * Build: gcc -static -Os -s -o pause pause.c
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig)
{
    stop_signal = sig;
}

/* SIGCHLD only needs to wake sigsuspend(); the main loop does the reaping. */
static void on_child(int sig)
{
    (void)sig;
}

static int install(int sig, void (*handler)(int), int flags)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, NULL) != 0) {
        fprintf(stderr, "pause: sigaction(%d): %s\n", sig, strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    sigset_t wake, waiting;

    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("pause (kata-rs end-to-end tests) 1.0");
        return 0;
    }
    if (install(SIGTERM, on_stop, 0) || install(SIGINT, on_stop, 0) ||
        install(SIGCHLD, on_child, SA_NOCLDSTOP))
        return 1;

    /* Block the signals we wait for, so that none can arrive between the checks below and
     * sigsuspend(), which unblocks them atomically while it sleeps. */
    sigemptyset(&wake);
    sigaddset(&wake, SIGTERM);
    sigaddset(&wake, SIGINT);
    sigaddset(&wake, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &wake, &waiting) != 0) {
        fprintf(stderr, "pause: sigprocmask: %s\n", strerror(errno));
        return 1;
    }
    sigdelset(&waiting, SIGTERM);
    sigdelset(&waiting, SIGINT);
    sigdelset(&waiting, SIGCHLD);

    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        if (stop_signal)
            return 0;
        sigsuspend(&waiting);
    }
}
