/* The SANDBOX message: what makes a VM one sandbox's, attached once after
 * READY and before any container (docs/agent-protocol.md).  Until it comes,
 * the VM holds nothing of any container: no share mounted, no interface
 * configured, no hostname, the clock and RNG as the boot left them; that is
 * the state a template can be saved in. */
#ifndef PARACELL_AGENT_SANDBOX_H
#define PARACELL_AGENT_SANDBOX_H

#include <stddef.h>

/* Parses every record first, then applies them: 0, or -1 with err set to one
 * line.  A second SANDBOX is refused. */
int sandbox_attach(char *buf, size_t len, char *err, size_t errlen);
/* A fork's FORKED records: the clock, fresh entropy (then a new boot_id),
 * the hostname (the VM's and the container's), the container's new id and
 * machine-id.  0, or -1 with err set to one line. */
int sandbox_fork(char *buf, size_t len, char *err, size_t errlen);
/* 1 once a SANDBOX has been applied. */
int sandbox_attached(void);

#endif
