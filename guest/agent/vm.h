/* The micro-VM around the agent: PID 1's boot duties, the agent port, the
 * power-off.  The host's 9p shares are the SANDBOX's (sandbox.c). */
#ifndef PARACELL_AGENT_VM_H
#define PARACELL_AGENT_VM_H

#include <stddef.h>

#include "spec.h"

void vm_boot(void);
/* 1 when the kernel command line holds the word `word`. */
int vm_cmdline_has(const char *word);
/* The agent port, nonblocking, or -1 when QEMU gave the VM none. */
int vm_open_port(void);
void vm_power_off(unsigned code) __attribute__((noreturn));

#endif
