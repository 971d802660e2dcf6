/* `xgate-wrpkru N`: ns per WRPKRU (writing back the current value), for the
 * bench's explanation of a gate's cost.  It carries WRPKRU, so it only runs
 * without XGates (the bench runs it in a second container). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10000;
    unsigned eax, edx;
    struct timespec a, b;
    __asm__ volatile(".byte 0x0f, 0x01, 0xee" : "=a"(eax), "=d"(edx) : "c"(0)); /* rdpkru */
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        __asm__ volatile(".byte 0x0f, 0x01, 0xef" ::"a"(eax), "c"(0), "d"(0) : "memory");
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("wrpkru %.1f ns\n", ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)n);
    return 0;
}
