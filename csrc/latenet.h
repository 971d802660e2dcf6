/* START's payload for interfaces that appear in a container's network
 * namespace between create and start (paracell/net/late.py), made by the
 * process that sits in that namespace: a VM's shim (paracell-vmshim), or the
 * proxy of a container in a VM from the warm pool (paracell-relay). */
#ifndef PARACELL_LATENET_H
#define PARACELL_LATENET_H

/* Set once, before the relay runs. record: the network record the helper
 * reads, or NULL for a namespace that gains nothing (then START carries
 * nothing); tap_prefix: the name of our TAPs; python: the interpreter that
 * runs paracell.net.latestart. The strings must outlive the relay. */
void pc_late_configure(const char *record, const char *tap_prefix, const char *python);

/* A pc_relay_cfg.start_payload: the payload's length (0: nothing), or -1
 * with a NUL-terminated reason in buf. */
int pc_late_payload(char *buf, int cap);

#endif
