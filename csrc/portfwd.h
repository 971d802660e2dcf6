/* Port forwarding, host side: the listeners that loopback connections in the
 * VM's network namespace are steered to (docs/networking.md).  Handed to
 * cffi's cdef as it is (csrc/build_native.py), so keep to the subset it reads. */
#ifndef PARACELL_PORTFWD_H
#define PARACELL_PORTFWD_H

/* What pc_fwd_attach makes in the calling thread's network namespace. */
struct pc_fwd_listeners {
    int listen4;  /* TCP listener on 127.0.0.1 */
    int listen6;  /* TCP listener on ::1, or -1 when the namespace has no IPv6 */
    int link;     /* the sk_lookup link: while it is open, every TCP connection to
                   * 127.0.0.1 or ::1 in the namespace lands on a listener */
};

/* 0, or -1 with err set to one line (and every fd closed). */
int pc_fwd_attach(struct pc_fwd_listeners *out, char *err, unsigned errlen);
/* Closes what pc_fwd_attach made; the steering ends with the link. */
void pc_fwd_detach(struct pc_fwd_listeners *l);
/* How many sk_lookup links are attached to the network namespace of
 * netns_fd (any program, ours or not), or -1 with errno. */
int pc_fwd_count_links(int netns_fd);

#endif
