/* The micro-VM around the agent: PID 1's boot duties, the agent port, the
 * host's 9p shares and power-off. */
#ifndef PARACELL_AGENT_VM_H
#define PARACELL_AGENT_VM_H

#include <stddef.h>

#include "spec.h"

void vm_boot(void);
/* 1 when the kernel command line holds the word `word`. */
int vm_cmdline_has(const char *word);
/* The agent port, nonblocking, or -1 when QEMU gave the VM none. */
int vm_open_port(void);
/* Mounts the shares the spec's container needs, once per VM: 0, or -1 with
 * err set to one line. */
int vm_mount_shares(const struct spec *s, char *err, size_t errlen);
void vm_power_off(unsigned code) __attribute__((noreturn));

#endif
