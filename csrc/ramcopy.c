/* A guest RAM file copied and digested in one pass: see ramcopy.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ramcopy.h"

#define PAGE 4096u

static int fail(char *err, int errlen, const char *what, int e)
{
    snprintf(err, (size_t)errlen, "%s: %s", what, strerror(e));
    return -1;
}

static int is_zero(const unsigned char *page)
{
    const uint64_t *w = (const uint64_t *)page;
    for (unsigned i = 0; i < PAGE / sizeof *w; i++)
        if (w[i]) return 0;
    return 1;
}

/* Writes len bytes at off of dst, whole. */
static int put(int dst, const unsigned char *buf, uint64_t len, uint64_t off)
{
    while (len) {
        ssize_t n = pwrite(dst, buf, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += n;
        len -= (uint64_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

int pc_ram_copy(int src_fd, int dst_fd, uint64_t size, struct pc_ram_digest *out,
                char *err, int errlen)
{
    struct stat st;
    memset(out, 0, sizeof *out);
    if (size % PAGE) {
        snprintf(err, (size_t)errlen, "guest RAM of %llu bytes is not whole pages",
                 (unsigned long long)size);
        return -1;
    }
    if (fstat(src_fd, &st) < 0) return fail(err, errlen, "the RAM file", errno);
    if ((uint64_t)st.st_size != size) {
        snprintf(err, (size_t)errlen, "the RAM file is %lld bytes, expected %llu",
                 (long long)st.st_size, (unsigned long long)size);
        return -1;
    }
    if (dst_fd >= 0 && ftruncate(dst_fd, (off_t)size) < 0)
        return fail(err, errlen, "the new RAM file", errno);
    if (size == 0) return 0;
    const unsigned char *map = mmap(NULL, size, PROT_READ, MAP_SHARED, src_fd, 0);
    if (map == MAP_FAILED) return fail(err, errlen, "mapping the RAM file", errno);
    XXH3_state_t state;
    XXH3_128bits_reset(&state);
    int rc = 0;
    uint64_t off = 0;
    while (off < size) {
        off_t data = lseek(src_fd, (off_t)off, SEEK_DATA);
        if (data < 0) {
            if (errno != ENXIO) rc = fail(err, errlen, "the RAM file's extents", errno);
            break;
        }
        off_t hole = lseek(src_fd, data, SEEK_HOLE);
        if (hole < 0) {
            rc = fail(err, errlen, "the RAM file's extents", errno);
            break;
        }
        uint64_t page = (uint64_t)data / PAGE * PAGE;
        uint64_t end = (uint64_t)hole < size ? (uint64_t)hole : size;
        uint64_t run = page, run_len = 0;  /* pages not zero, written in one call */
        for (; page < end; page += PAGE) {
            const unsigned char *p = map + page;
            if (is_zero(p)) {
                if (run_len && dst_fd >= 0 && put(dst_fd, map + run, run_len, run) < 0) {
                    rc = fail(err, errlen, "writing the new RAM file", errno);
                    goto out;
                }
                run_len = 0;
                continue;
            }
            if (!run_len) run = page;
            run_len += PAGE;
            uint64_t index = page / PAGE;
            XXH3_128bits_update(&state, &index, sizeof index);
            XXH3_128bits_update(&state, p, PAGE);
            out->pages++;
        }
        if (run_len && dst_fd >= 0 && put(dst_fd, map + run, run_len, run) < 0) {
            rc = fail(err, errlen, "writing the new RAM file", errno);
            goto out;
        }
        off = end;
    }
    if (rc == 0) {
        XXH128_hash_t h = XXH3_128bits_digest(&state);
        out->high = h.high64;
        out->low = h.low64;
    }
out:
    munmap((void *)map, size);
    return rc;
}
