/*
 * critest-nginx: the process identity critest's web server specs look for, written for
 * this project (scripts/critest-images.sh puts it at /usr/sbin/nginx in the web server
 * images, next to busybox). The HTTP server itself is busybox httpd.
 *
 * What critest v1.37 checks of its nginx images, and how this program answers it:
 *   - PID 1 of a container of its own reads "master process" in /proc/1/cmdline: the
 *     program re-executes itself with the argv[0] nginx's master shows
 *     ("nginx: master process nginx -g daemon off;"), so its comm stays "nginx"
 *     (`pidof nginx` finds it) and its command line carries the title;
 *   - /var/run/nginx.pid holds the master's pid;
 *   - GET / on the port answers 200: a child runs `httpd -f -p PORT -h DOCROOT` (busybox),
 *     PORT from $NGINX_PORT (default 80), DOCROOT /usr/share/nginx/html.
 * SIGTERM, SIGINT or SIGQUIT stop the server and the master (exit 0); if the server dies,
 * the master exits 1. As PID 1 of a shared PID namespace it reaps whatever it inherits.
 *
 * Build: gcc -static -Os -s -o nginx critest-nginx.c
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define SELF "/usr/sbin/nginx"
#define TITLE "nginx: master process nginx -g daemon off;"
#define PIDFILE "/var/run/nginx.pid"
#define DOCROOT "/usr/share/nginx/html"
#define BUSYBOX "/bin/busybox"

int main(int argc, char **argv)
{
    (void)argc;
    if (argv[0] == NULL || strcmp(argv[0], TITLE) != 0) {
        char *args[] = {TITLE, NULL};
        execv(SELF, args);
        fprintf(stderr, "nginx: exec %s: %s\n", SELF, strerror(errno));
        return 1;
    }

    const char *port = getenv("NGINX_PORT");
    if (port == NULL || *port == '\0')
        port = "80";

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGQUIT);
    sigaddset(&set, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &set, NULL) != 0) {
        perror("nginx: sigprocmask");
        return 1;
    }

    pid_t server = fork();
    if (server < 0) {
        perror("nginx: fork");
        return 1;
    }
    if (server == 0) {
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        char *args[] = {"httpd", "-f", "-p", (char *)port, "-h", DOCROOT, NULL};
        execv(BUSYBOX, args);
        fprintf(stderr, "nginx: exec %s httpd: %s\n", BUSYBOX, strerror(errno));
        _exit(127);
    }

    mkdir("/var/run", 0755);
    FILE *f = fopen(PIDFILE, "w");
    if (f == NULL || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0) {
        fprintf(stderr, "nginx: writing %s: %s\n", PIDFILE, strerror(errno));
        kill(server, SIGTERM);
        return 1;
    }
    fprintf(stderr, "nginx: master %d, server %d on port %s\n", (int)getpid(), (int)server, port);

    for (;;) {
        int sig;
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig == SIGCHLD) {
            int status;
            pid_t pid;
            while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
                if (pid == server) {
                    fprintf(stderr, "nginx: server exited (status %d)\n", status);
                    unlink(PIDFILE);
                    return 1;
                }
            }
            continue;
        }
        kill(server, SIGTERM);
        waitpid(server, NULL, 0);
        unlink(PIDFILE);
        return 0;
    }
}
