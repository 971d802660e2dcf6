/* linux.devices: nodes in the container's /dev, as runc's createDeviceNode. */
#ifndef PARACELL_AGENT_DEVICES_H
#define PARACELL_AGENT_DEVICES_H

#include "spec.h"

/* Makes d as name in dirfd with its mode and owner; a name that exists is
 * kept, as runc keeps it.  0, or -1 with errno. */
int device_make(int dirfd, const char *name, const struct spec_device *d);

#endif
