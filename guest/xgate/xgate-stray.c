/* A clean program but for one stray WRPKRU encoding in its text: XGates
 * refuse it at execve and as a mapping; without XGates it runs. */
#include <stdio.h>

__attribute__((used, noinline)) static void stray(void)
{
    __asm__ volatile(".byte 0x0f, 0x01, 0xef"); /* wrpkru, never reached */
}

int main(void)
{
    puts("stray ran");
    return 0;
}
