/* A guest RAM file copied and digested in one pass (docs/templates.md): a
 * template's RAM is copied out of the VM that is saved, and into every VM
 * restored from it, and both copies yield the same digest, which the
 * template's meta.json keeps, so RAM that is not what was saved (truncated,
 * from another save, written over) is caught before the guest runs on it.
 * The digest is XXH3-128 over (page index, page) of every page that holds
 * anything but zeros: holes and pages of zeros are the same to a guest, so
 * they are the same to the digest, and neither is copied.  Handed to cffi's
 * cdef like relay.h: keep to its subset. */
#ifndef PARACELL_RAMCOPY_H
#define PARACELL_RAMCOPY_H

struct pc_ram_digest {
    uint64_t high, low;  /* XXH3-128 */
    uint64_t pages;      /* pages copied (not zero) */
};

/* Reads the data extents of src (size bytes, a multiple of 4096), digests
 * them, and writes each page that is not zero at its offset of dst, which
 * is truncated to size first; dst -1 only digests.  0, or -1 with err. */
int pc_ram_copy(int src_fd, int dst_fd, uint64_t size, struct pc_ram_digest *out,
                char *err, int errlen);

#endif
