/* An inotify watcher for the Kubernetes suite's volume update cases (scripts/k8s-images.sh):
 *   inotify-watch DIR      prints one line per event on DIR: "MASK NAME", until killed
 * The events a program watching a ConfigMap or Secret volume relies on: create, moved
 * to/from, delete, close after write, attribute changes. busybox-static has no inotifyd. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: inotify-watch DIR\n");
        return 2;
    }
    int fd = inotify_init1(0);
    if (fd < 0) {
        fprintf(stderr, "inotify-watch: inotify_init1: %s\n", strerror(errno));
        return 1;
    }
    uint32_t mask = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CLOSE_WRITE |
                    IN_ATTRIB | IN_MODIFY | IN_DELETE_SELF;
    if (inotify_add_watch(fd, argv[1], mask) < 0) {
        fprintf(stderr, "inotify-watch: watch %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    printf("watching %s\n", argv[1]);
    fflush(stdout);
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0) {
            fprintf(stderr, "inotify-watch: read: %s\n", strerror(errno));
            return 1;
        }
        for (char *p = buf; p < buf + n;) {
            struct inotify_event *e = (struct inotify_event *)p;
            printf("%08x %s\n", e->mask, e->len ? e->name : ".");
            p += sizeof(*e) + e->len;
        }
        fflush(stdout);
    }
}
