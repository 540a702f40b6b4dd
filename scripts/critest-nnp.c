/*
 * critest-nnp: the program of critest's no_new_privs image, written for this project
 * (scripts/critest-images.sh installs it set-user-ID root as /usr/local/bin/nnp and makes
 * it the image's command). It prints the effective uid it runs with: run as uid 1000, it
 * prints 0 when the set-user-ID bit took effect and 1000 when no_new_privs stopped it.
 *
 * Build: gcc -static -Os -s -o nnp critest-nnp.c
 */
#include <stdio.h>
#include <unistd.h>

int main(void)
{
    printf("Effective uid: %d\n", (int)geteuid());
    return fflush(stdout) == 0 ? 0 : 1;
}
