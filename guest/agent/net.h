/* The VM's network: lo, and the interfaces the init's SPEC names, configured
 * over rtnetlink (the guest has no `ip`).  docs/networking.md. */
#ifndef PARACELL_AGENT_NET_H
#define PARACELL_AGENT_NET_H

#include <stddef.h>

#include "netspec.h"

/* For the init's SPEC: brings lo up (once per VM), hides the spare devices,
 * and configures the interfaces n names: found by MAC, renamed, MTU, up,
 * addresses, routes.  Only one container of the VM may bring interfaces.
 * 0, or -1 with err set to one line. */
int net_configure(const struct net_spec *n, char *err, size_t errlen);
/* For START with network records: interfaces that appeared on the host
 * after create, each taking over a spare device.  0, or -1 with err set. */
int net_start(const struct net_spec *n, char *err, size_t errlen);
/* For FORKED: every link but loopback down, out of its master, without
 * addresses (and so routes); then the interfaces n names, the i-th on the
 * VM's i-th network device (the host's order), with their MACs, addresses
 * and routes.  0, or -1 with err set. */
int net_fork(const struct net_spec *n, char *err, size_t errlen);

#endif
