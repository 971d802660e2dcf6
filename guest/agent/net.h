/* The VM's network: lo, and the interfaces the init's SPEC names, configured
 * over rtnetlink (the guest has no `ip`).  docs/networking.md. */
#ifndef PARACELL_AGENT_NET_H
#define PARACELL_AGENT_NET_H

#include <stddef.h>

#include "netspec.h"

/* Brings lo up (once per VM), then, if n names interfaces, configures them:
 * found by MAC, renamed, MTU, up, addresses, routes.  Only one container of
 * the VM may bring interfaces.  0, or -1 with err set to one line. */
int net_configure(const struct net_spec *n, char *err, size_t errlen);

#endif
