/* A unix socket echo for the Kubernetes suite's shared-volume case (scripts/k8s-images.sh):
 *   usock serve PATH        accepts connections on PATH, answers each line with "echo:LINE"
 *   usock send PATH TEXT    connects to PATH, sends TEXT and a newline, prints the answer
 * busybox's nc has no unix sockets. Exits non-zero with the failing call's error. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int fail(const char *what, const char *path) {
    fprintf(stderr, "usock: %s %s: %s\n", what, path, strerror(errno));
    return 1;
}

static int address(struct sockaddr_un *a, const char *path) {
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(a->sun_path)) {
        fprintf(stderr, "usock: path too long: %s\n", path);
        return -1;
    }
    strcpy(a->sun_path, path);
    return 0;
}

int main(int argc, char **argv) {
    struct sockaddr_un a;
    char buf[512];
    if (argc == 3 && strcmp(argv[1], "serve") == 0) {
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (s < 0 || address(&a, argv[2]) < 0) return fail("socket", argv[2]);
        unlink(argv[2]);
        if (bind(s, (struct sockaddr *)&a, sizeof(a)) < 0) return fail("bind", argv[2]);
        if (listen(s, 8) < 0) return fail("listen", argv[2]);
        printf("listening on %s\n", argv[2]);
        fflush(stdout);
        for (;;) {
            int c = accept(s, NULL, NULL);
            if (c < 0) return fail("accept", argv[2]);
            ssize_t n = read(c, buf, sizeof(buf) - 1);
            if (n > 0) {
                buf[n] = 0;
                buf[strcspn(buf, "\n")] = 0;
                dprintf(c, "echo:%s\n", buf);
            }
            close(c);
        }
    }
    if (argc == 4 && strcmp(argv[1], "send") == 0) {
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (s < 0 || address(&a, argv[2]) < 0) return fail("socket", argv[2]);
        if (connect(s, (struct sockaddr *)&a, sizeof(a)) < 0) return fail("connect", argv[2]);
        dprintf(s, "%s\n", argv[3]);
        ssize_t n = read(s, buf, sizeof(buf) - 1);
        if (n <= 0) return fail("read", argv[2]);
        buf[n] = 0;
        fputs(buf, stdout);
        return 0;
    }
    fprintf(stderr, "usage: usock serve PATH | usock send PATH TEXT\n");
    return 2;
}
