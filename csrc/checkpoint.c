/* Guest RAM for incremental checkpoints: see checkpoint.h.
 *
 * The VM is stopped while these run.  A changed page is found by its
 * content's hash; which pages are hashed is every page, or, given a map of
 * the pages that may have changed (QEMU's log of writes, csrc/dirtylog.h,
 * and the Pager's unbound and ring pages), only those.  The hash is XXH3
 * (Debian's libxxhash) seeded per container, so a guest cannot aim a
 * collision at it; an accidental one among 2^64 values is what is left. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "checkpoint.h"

#define BATCH_PAGES 256  /* pages written per write() */
#define RUN_PAGES 512    /* pages per punch or pwritev, within IOV_MAX */

static int fail(char *err, int errlen, const char *fmt, const char *what, int e)
{
    snprintf(err, (size_t)errlen, fmt, what, strerror(e));
    return -1;
}

static const unsigned char zero_page[PC_CKPT_PAGE];

/* A page of zeros hashes as a hole: it reads the same, and neither is saved. */
static uint64_t page_hash(const unsigned char *page, uint64_t seed)
{
    uint64_t h = XXH3_64bits_withSeed(page, PC_CKPT_PAGE, seed);
    static uint64_t zero_seed, zero_hash;
    static int known;
    if (!known || zero_seed != seed) {
        zero_hash = XXH3_64bits_withSeed(zero_page, PC_CKPT_PAGE, seed);
        zero_seed = seed;
        known = 1;
    }
    if (h == zero_hash && !memcmp(page, zero_page, PC_CKPT_PAGE))
        return 0;
    return h ? h : 1;
}

/* The RAM file mapped, and which pages hold data.  The caller's own mapping
 * (lent), when it keeps one for its life: the pages an operation reads or
 * writes then keep their page-table entries for the next one, where a
 * mapping of one call's would fault each of them in again. */
struct ram {
    unsigned char *map;
    int lent;
    uint64_t size, pages;
    unsigned char *data;  /* one byte per page: 1 where the file has data */
};

static void ram_close(struct ram *r)
{
    if (!r->lent && r->map && r->map != MAP_FAILED) munmap(r->map, r->size);
    free(r->data);
}

static int ram_open(struct ram *r, int fd, uint64_t size, unsigned char *lent, int writable,
                    char *err, int errlen)
{
    memset(r, 0, sizeof *r);
    struct stat st;
    if (fstat(fd, &st) < 0) return fail(err, errlen, "%s: %s", "guest RAM", errno);
    if (size % PC_CKPT_PAGE || (uint64_t)st.st_size != size) {
        snprintf(err, (size_t)errlen, "guest RAM is %lld bytes, expected %llu",
                 (long long)st.st_size, (unsigned long long)size);
        return -1;
    }
    r->size = size;
    r->pages = size / PC_CKPT_PAGE;
    r->data = calloc(r->pages, 1);
    r->lent = lent != NULL;
    r->map = lent ? lent : mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED,
                                fd, 0);
    if (!r->data || r->map == MAP_FAILED) {
        int e = errno;
        ram_close(r);
        return fail(err, errlen, "%s: %s", "mapping guest RAM", e);
    }
    /* Holes are found without touching them: reading one would allocate it. */
    off_t at = 0;
    while ((uint64_t)at < size) {
        off_t start = lseek(fd, at, SEEK_DATA);
        if (start < 0) break;  /* ENXIO: nothing but holes past at */
        off_t end = lseek(fd, start, SEEK_HOLE);
        if (end < 0) end = (off_t)size;
        for (uint64_t p = (uint64_t)start / PC_CKPT_PAGE; p * PC_CKPT_PAGE < (uint64_t)end; p++)
            r->data[p] = 1;
        at = end;
    }
    return 0;
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Whether page i may differ from what known[] (the hashes of the RAM the VM
 * went on from) says, so that it must be hashed: every page without a map
 * of changes, else a page in changed[]: QEMU wrote it, or the Pager in the
 * shim unbound it or wrote it (its rings' consumer indices).  Nothing else
 * writes the file while the VM runs: the Pager's binds fill holes with
 * zeros, which hash as holes.  A hole where known[] has data costs nothing
 * to look at (no read), so it is looked at all the same. */
static int must_look(const struct ram *r, uint64_t i, const uint64_t *known,
                     const uint8_t *changed)
{
    if (!known || !changed || changed[i]) return 1;
    return !r->data[i] && known[i] != 0;
}

int pc_ckpt_capture(int ram_fd, uint8_t *ram_map, uint64_t ram_size, uint64_t seed,
                    const uint64_t *prev, const struct pc_ckpt_loc *parent_loc,
                    const uint8_t *changed, uint32_t seq, uint64_t *hashes,
                    struct pc_ckpt_loc *loc, int out_fd, struct pc_ckpt_figures *fig, char *err,
                    int errlen)
{
    struct ram r;
    memset(fig, 0, sizeof *fig);
    if (ram_open(&r, ram_fd, ram_size, ram_map, 0, err, errlen) < 0) return -1;
    fig->pages = r.pages;
    unsigned char *batch = malloc((size_t)BATCH_PAGES * PC_CKPT_PAGE);
    if (!batch) {
        ram_close(&r);
        return fail(err, errlen, "%s: %s", "checkpoint buffer", ENOMEM);
    }
    uint32_t slot = 0;
    size_t queued = 0;
    int rc = 0;
    for (uint64_t i = 0; i < r.pages && !rc; i++) {
        const unsigned char *page = r.map + i * PC_CKPT_PAGE;
        fig->present += r.data[i];
        if (!must_look(&r, i, prev, changed)) {
            hashes[i] = prev[i];
            loc[i] = parent_loc[i];
            continue;
        }
        fig->looked++;
        hashes[i] = r.data[i] ? page_hash(page, seed) : 0;
        if (hashes[i] && (!prev || prev[i] != hashes[i])) {
            memcpy(batch + queued * PC_CKPT_PAGE, page, PC_CKPT_PAGE);
            loc[i].seq = seq;
            loc[i].slot = slot++;
            fig->changed++;
            if (++queued == BATCH_PAGES) {
                rc = write_all(out_fd, batch, queued * PC_CKPT_PAGE);
                queued = 0;
            }
        } else if (!hashes[i]) {
            loc[i].seq = seq;
            loc[i].slot = PC_CKPT_NO_SLOT;
        } else {
            loc[i] = parent_loc[i];
        }
    }
    if (!rc && queued) rc = write_all(out_fd, batch, queued * PC_CKPT_PAGE);
    int e = errno;
    free(batch);
    ram_close(&r);
    if (rc) return fail(err, errlen, "%s: %s", "writing the checkpoint's pages", e);
    fig->bytes = fig->changed * PC_CKPT_PAGE;
    return 0;
}

static int file_of(uint32_t seq, const uint32_t *seqs, int nfiles)
{
    for (int k = 0; k < nfiles; k++)
        if (seqs[k] == seq) return k;
    return -1;
}

/* The checkpoints' page files, mapped read-only once for a whole rollback:
 * every kept page is checked, then written, straight from its file's
 * mapping, with no read of its own. */
struct kept {
    const unsigned char **map;
    uint64_t *pages;  /* pages each file holds */
    int n;
};

static void kept_close(struct kept *k)
{
    for (int f = 0; k->map && f < k->n; f++)
        if (k->map[f]) munmap((void *)k->map[f], k->pages[f] * PC_CKPT_PAGE);
    free(k->map);
    free(k->pages);
}

static int kept_open(struct kept *k, const int *page_fds, int nfiles, char *err, int errlen)
{
    memset(k, 0, sizeof *k);
    k->n = nfiles;
    k->map = calloc((size_t)(nfiles ? nfiles : 1), sizeof *k->map);
    k->pages = calloc((size_t)(nfiles ? nfiles : 1), sizeof *k->pages);
    if (!k->map || !k->pages) {
        kept_close(k);
        return fail(err, errlen, "%s: %s", "page files", ENOMEM);
    }
    for (int f = 0; f < nfiles; f++) {
        struct stat st;
        if (fstat(page_fds[f], &st) < 0) {
            int e = errno;
            kept_close(k);
            return fail(err, errlen, "%s: %s", "a page file", e);
        }
        k->pages[f] = (uint64_t)st.st_size / PC_CKPT_PAGE;
        if (!k->pages[f]) continue;  /* nothing kept: never mapped, never read */
        void *m = mmap(NULL, k->pages[f] * PC_CKPT_PAGE, PROT_READ, MAP_SHARED, page_fds[f], 0);
        if (m == MAP_FAILED) {
            int e = errno;
            k->pages[f] = 0;
            kept_close(k);
            return fail(err, errlen, "%s: %s", "mapping a page file", e);
        }
        k->map[f] = m;
    }
    return 0;
}

/* The kept page of index i, checked against want[i]; NULL with err. */
static const unsigned char *kept_page(const struct kept *k, uint64_t i, const uint64_t *want,
                                      const struct pc_ckpt_loc *loc, const uint32_t *seqs,
                                      uint64_t seed, char *err, int errlen)
{
    int f = file_of(loc[i].seq, seqs, k->n);
    if (f < 0 || loc[i].slot == PC_CKPT_NO_SLOT) {
        snprintf(err, (size_t)errlen, "checkpoint page %llu has no kept content",
                 (unsigned long long)i);
        return NULL;
    }
    if (loc[i].slot >= k->pages[f]) {
        snprintf(err, (size_t)errlen, "checkpoint page %llu is missing (a truncated page file)",
                 (unsigned long long)i);
        return NULL;
    }
    const unsigned char *page = k->map[f] + (uint64_t)loc[i].slot * PC_CKPT_PAGE;
    if (page_hash(page, seed) != want[i]) {
        snprintf(err, (size_t)errlen, "checkpoint page %llu is corrupt (its hash differs)",
                 (unsigned long long)i);
        return NULL;
    }
    return page;
}

/* A run of neighbouring pages that take the same system call: punched
 * together, or written from their kept pages with one pwritev.  Per page,
 * each punch would zap the page's mappings in QEMU and the shim and flush
 * their TLBs, and each write would be a system call of its own: most of a
 * rollback's rewrite where the Pager had unbound what the guest freed. */
struct run {
    int punch;        /* 1: holes, 0: writes */
    uint64_t first, n;
    struct iovec iov[RUN_PAGES];
};

static int run_flush(int fd, struct run *r, struct pc_ckpt_figures *fig, char *err, int errlen)
{
    if (!r->n) return 0;
    off_t at = (off_t)(r->first * PC_CKPT_PAGE);
    if (r->punch) {
        if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at,
                      (off_t)(r->n * PC_CKPT_PAGE)) < 0)
            return fail(err, errlen, "%s: %s", "punching guest RAM", errno);
        fig->changed += r->n;
    } else {
        struct iovec *iov = r->iov;
        int left = (int)r->n;
        while (left) {
            ssize_t w = pwritev(fd, iov, left, at);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0)
                return fail(err, errlen, "%s: %s", "writing guest RAM", w < 0 ? errno : EIO);
            /* A short write (a size limit, the file system full) is taken
             * up where it stopped: the next call says why, or goes on. */
            at += w;
            fig->bytes += (uint64_t)w;
            while (w > 0) {
                size_t took = (size_t)w < iov->iov_len ? (size_t)w : iov->iov_len;
                iov->iov_base = (char *)iov->iov_base + took;
                iov->iov_len -= took;
                w -= (ssize_t)took;
                if (!iov->iov_len) {
                    iov++;
                    left--;
                    fig->changed++;
                }
            }
        }
    }
    r->n = 0;
    return 0;
}

/* Page i into the run, which is flushed first where i cannot join it. */
static int run_add(int fd, struct run *r, uint64_t i, const unsigned char *page,
                   struct pc_ckpt_figures *fig, char *err, int errlen)
{
    int punch = page == NULL;
    if (r->n && (r->punch != punch || r->first + r->n != i || r->n == RUN_PAGES) &&
        run_flush(fd, r, fig, err, errlen) < 0)
        return -1;
    if (!r->n) {
        r->first = i;
        r->punch = punch;
    }
    if (!punch) r->iov[r->n] = (struct iovec){(void *)page, PC_CKPT_PAGE};
    r->n++;
    return 0;
}

/* Every page where have[] (NULL: an empty file) differs from want[]: every
 * kept page checked against its hash first, all of them, then written or
 * punched.  A page that holds data (data[]) is overwritten through ram, a
 * shared writable mapping of the file: a copy with no system call; a hole
 * (every page where data is NULL) is filled with pwritev, which needs a new
 * page and so says ENOSPC where a store through a mapping would die of
 * SIGBUS.  The page files are this sandbox's own, mapped read-only, and
 * nothing writes them meanwhile: what was checked is what is written. */
static int put_back(int fd, unsigned char *ram, const unsigned char *data, uint64_t pages,
                    uint64_t seed, const uint64_t *have, const uint64_t *want,
                    const struct pc_ckpt_loc *loc, const uint32_t *seqs, const int *page_fds,
                    int nfiles, struct pc_ckpt_figures *fig, char *err, int errlen)
{
    struct kept k;
    if (kept_open(&k, page_fds, nfiles, err, errlen) < 0) return -1;
    struct run *run = calloc(1, sizeof *run);
    int rc = run ? 0 : fail(err, errlen, "%s: %s", "revert buffer", ENOMEM);
    for (uint64_t i = 0; i < pages && !rc; i++)
        if ((have ? have[i] : 0) != want[i] && want[i] &&
            !kept_page(&k, i, want, loc, seqs, seed, err, errlen))
            rc = -1;
    for (uint64_t i = 0; i < pages && !rc; i++) {
        if ((have ? have[i] : 0) == want[i]) continue;
        const unsigned char *page = NULL;
        if (want[i]) {
            int f = file_of(loc[i].seq, seqs, k.n);
            page = k.map[f] + (uint64_t)loc[i].slot * PC_CKPT_PAGE;
        }
        if (page && data && data[i]) {
            memcpy(ram + i * PC_CKPT_PAGE, page, PC_CKPT_PAGE);
            fig->changed++;
            fig->bytes += PC_CKPT_PAGE;
        } else {
            rc = run_add(fd, run, i, page, fig, err, errlen);
        }
    }
    if (!rc) rc = run_flush(fd, run, fig, err, errlen);
    free(run);
    kept_close(&k);
    return rc;
}

int pc_ckpt_revert(int ram_fd, uint8_t *ram_map, uint64_t ram_size, uint64_t seed,
                   const uint64_t *want, const struct pc_ckpt_loc *loc, const uint32_t *seqs,
                   const int *page_fds, int nfiles, const uint64_t *base,
                   const uint8_t *changed, struct pc_ckpt_figures *fig, char *err, int errlen)
{
    struct ram r;
    memset(fig, 0, sizeof *fig);
    if (ram_open(&r, ram_fd, ram_size, ram_map, 1, err, errlen) < 0) return -1;
    fig->pages = r.pages;
    uint64_t *have = malloc(r.pages * sizeof *have);
    if (!have) {
        ram_close(&r);
        return fail(err, errlen, "%s: %s", "revert buffer", ENOMEM);
    }
    for (uint64_t i = 0; i < r.pages; i++) {
        fig->present += r.data[i];
        /* A page that is as base[] says, where base[] and want[] agree, is
         * already what the checkpoint holds. */
        if (base && base[i] == want[i] && !must_look(&r, i, base, changed)) {
            have[i] = want[i];
            continue;
        }
        fig->looked++;
        have[i] = r.data[i] ? page_hash(r.map + i * PC_CKPT_PAGE, seed) : 0;
    }
    int rc = put_back(ram_fd, r.map, r.data, ram_size / PC_CKPT_PAGE, seed, have, want, loc,
                      seqs, page_fds, nfiles, fig, err, errlen);
    ram_close(&r);
    free(have);
    return rc;
}

int pc_ckpt_materialize(int out_fd, uint64_t ram_size, uint64_t seed, const uint64_t *want,
                        const struct pc_ckpt_loc *loc, const uint32_t *seqs, const int *page_fds,
                        int nfiles, struct pc_ckpt_figures *fig, char *err, int errlen)
{
    memset(fig, 0, sizeof *fig);
    if (ram_size % PC_CKPT_PAGE || ftruncate(out_fd, (off_t)ram_size) < 0) {
        snprintf(err, (size_t)errlen, "sizing the new guest RAM: %s", strerror(errno));
        return -1;
    }
    fig->pages = ram_size / PC_CKPT_PAGE;
    return put_back(out_fd, NULL, NULL, fig->pages, seed, NULL, want, loc, seqs, page_fds, nfiles,
                    fig, err, errlen);
}

void pc_ckpt_uses(const struct pc_ckpt_loc *loc, uint64_t pages, uint8_t *used, uint32_t nseq)
{
    for (uint64_t i = 0; i < pages; i++)
        if (loc[i].slot != PC_CKPT_NO_SLOT && loc[i].seq < nseq) used[loc[i].seq] = 1;
}
