/* Guest RAM for incremental checkpoints (docs/snapshots.md): which pages
 * changed since the previous checkpoint, their contents, and the way back.
 * Every page of the RAM file has a 64-bit hash, seeded per container: 0
 * for a hole (a page the guest never touched or the Pager gave back) or a
 * page of zeros, else XXH3 of its 4 KiB, never 0.  A checkpoint keeps its pages' hashes,
 * the pages that changed since its parent, and for every page where its
 * content is kept (`struct pc_ckpt_loc`): in which checkpoint's page file,
 * at which slot.  Handed to cffi's cdef like relay.h: keep to its subset. */
#ifndef PARACELL_CHECKPOINT_H
#define PARACELL_CHECKPOINT_H

#define PC_CKPT_PAGE 4096
#define PC_CKPT_NO_SLOT 4294967295

struct pc_ckpt_loc {
    uint32_t seq;   /* the checkpoint whose page file holds the page */
    uint32_t slot;  /* its index there; PC_CKPT_NO_SLOT for a hole */
};

struct pc_ckpt_figures {
    uint64_t pages;    /* pages of guest RAM */
    uint64_t present;  /* pages with data */
    uint64_t looked;   /* pages read and hashed: all of them without a log of writes */
    uint64_t changed;  /* pages saved (capture) or rewritten or punched (revert) */
    uint64_t bytes;    /* bytes written */
};

/* ram_map, in capture and revert: the RAM file mapped shared and writable
 * for the caller's life (its page-table entries then last from one
 * operation to the next), or NULL: mapped for the call. */

/* Hashes the pages of the RAM file into hashes[pages].  Where a page's
 * hash differs from prev[] (prev NULL: a first, full checkpoint), and it
 * has data, appends it to out_fd and points loc[] at (seq, its slot);
 * elsewhere loc[] is parent_loc[] (a hole: NO_SLOT).  With changed[] (a
 * byte per page: written since prev[] was true, csrc/dirtylog.h, or
 * unbound by the Pager), only those pages and the ones whose having data
 * differs from prev[] are read; the rest keep prev[].  0, or -1 with err. */
int pc_ckpt_capture(int ram_fd, uint8_t *ram_map, uint64_t ram_size, uint64_t seed,
                    const uint64_t *prev, const struct pc_ckpt_loc *parent_loc,
                    const uint8_t *changed, uint32_t seq, uint64_t *hashes,
                    struct pc_ckpt_loc *loc, int out_fd, struct pc_ckpt_figures *fig, char *err,
                    int errlen);

/* Makes the RAM file hold a checkpoint's pages again: every page whose
 * hash now differs from want[] is read back from its checkpoint's page
 * file (page_fds[i] is the file of seq seqs[i], nfiles of them) or, for a
 * hole, punched.  A page file that is short, or a page whose bytes do not
 * hash to want[], fails it (-1 with err) before the RAM file is touched.
 * With base[] (the hashes of the checkpoint the RAM went on from) and
 * changed[] (as for capture, since then), a page that base[] and want[]
 * agree on and that was not changed is not read. */
int pc_ckpt_revert(int ram_fd, uint8_t *ram_map, uint64_t ram_size, uint64_t seed,
                   const uint64_t *want, const struct pc_ckpt_loc *loc, const uint32_t *seqs,
                   const int *page_fds, int nfiles, const uint64_t *base,
                   const uint8_t *changed, struct pc_ckpt_figures *fig, char *err, int errlen);

/* Writes a checkpoint's whole RAM into an empty file of ram_size bytes,
 * holes kept: what a fork or a restore starts from.  Checked as revert. */
int pc_ckpt_materialize(int out_fd, uint64_t ram_size, uint64_t seed, const uint64_t *want,
                        const struct pc_ckpt_loc *loc, const uint32_t *seqs, const int *page_fds,
                        int nfiles, struct pc_ckpt_figures *fig, char *err, int errlen);

/* Marks used[seq] for every seq below nseq that loc[] keeps a page in:
 * the checkpoints whose page files this one needs. */
void pc_ckpt_uses(const struct pc_ckpt_loc *loc, uint64_t pages, uint8_t *used, uint32_t nseq);

#endif
