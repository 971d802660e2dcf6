/* linux.uidMappings and gidMappings: the maps of the container's user
 * namespace, written from outside it (docs/agent-protocol.md). */
#ifndef PARACELL_AGENT_USERNS_H
#define PARACELL_AGENT_USERNS_H

#include <stddef.h>

#include "spec.h"

/* Writes gid_map, then uid_map, of the process whose /proc directory is
 * piddir (in a procfs that shows it).  The writer must be outside the new
 * namespace with CAP_SETUID and CAP_SETGID there.  0, or -1 with err set. */
int userns_write_maps(int piddir, const struct spec *s, char *err, size_t errlen);

#endif
