/* Capabilities, bounded by what the running kernel knows.  This module owns
 * the kernel's last capability number: it is read once at boot, because a
 * container child may no longer see the guest's /proc. */
#ifndef PARACELL_AGENT_CAPS_H
#define PARACELL_AGENT_CAPS_H

#include <stdint.h>

void caps_init(void);

/* The calls below run in a container child before it execve()s. */

/* Drops from the bounding set every capability not in keep: 0, or -1 with
 * errno set and *failed the capability that could not be dropped. */
int caps_drop_bounding(uint64_t keep, int *failed);
/* Sets the effective, permitted and inheritable sets, ignoring bits beyond
 * the kernel's last capability: 0, or -1 with errno set. */
int caps_set(uint64_t eff, uint64_t perm, uint64_t inh);
/* Clears the ambient set, then raises what it can of want: 0, or -1 with
 * errno set when the set cannot be cleared. */
int caps_set_ambient(uint64_t want);

#endif
