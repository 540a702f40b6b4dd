/*
 * floor-init: the smallest possible guest /init, used to measure the bare boot time of the
 * guest kernel ("the floor") under QEMU. It mounts nothing: it writes one line to
 * /dev/console, waits until the serial port has sent it, and reboots. With the kernel
 * cmdline "reboot=t" and QEMU's -no-reboot, the reboot ends QEMU.
 *
 * With "floor_hold=1" on the kernel command line (which the kernel hands to init as an
 * environment variable) it stays up idle instead: the memory floor, what a bare VM of our
 * kernel costs the host once booted. The host ends it by killing QEMU.
 *
 * Build: gcc -static -Os -o floor-init floor-init.c   (guest/build-floor-initrd.sh does it)
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/reboot.h>
#include <termios.h>
#include <unistd.h>

int main(void)
{
    static const char msg[] = "floor-init: up\n";
    int fd = open("/dev/console", O_WRONLY | O_NOCTTY);
    if (fd < 0)
        fd = 1; /* the kernel gave init /dev/console as stdout if it could open it */
    ssize_t off = 0, len = (ssize_t)strlen(msg);
    while (off < len) {
        ssize_t n = write(fd, msg + off, (size_t)(len - off));
        if (n <= 0)
            break;
        off += n;
    }
    tcdrain(fd); /* let the UART finish before the machine goes away */
    if (getenv("floor_hold"))
        for (;;)
            pause(); /* PID 1 has no handlers: nothing in the guest ends this */
    sync();
    reboot(RB_AUTOBOOT);
    /* Not reached; if reboot failed, PID 1 exiting panics and panic=-1 reboots. */
    return 1;
}
