/* Pages QEMU wrote, from its pagemap: see dirtylog.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dirtylog.h"

#define PAGE 4096
#define REGIONS 512  /* written ranges returned per PAGEMAP_SCAN call */
#define PROBE_PAGES 4

int pc_dirty_arm(void *addr, uint64_t len)
{
    int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | PC_UFFD_USER_MODE_ONLY);
    if (uffd < 0) return -1;
    struct pc_uffdio_api api = {.api = PC_UFFD_API, .features = PC_UFFD_WP_FEATURES};
    struct pc_uffdio_register reg = {.range = {(uintptr_t)addr, len},
                                     .mode = PC_UFFDIO_REGISTER_MODE_WP};
    struct pc_uffdio_writeprotect wp = {.range = {(uintptr_t)addr, len},
                                        .mode = PC_UFFDIO_WRITEPROTECT_MODE_WP};
    if (ioctl(uffd, PC_UFFDIO_API, &api) < 0 || ioctl(uffd, PC_UFFDIO_REGISTER, &reg) < 0 ||
        ioctl(uffd, PC_UFFDIO_WRITEPROTECT, &wp) < 0) {
        int e = errno;
        close(uffd);
        errno = e;
        return -1;
    }
    return uffd;
}

int pc_dirty_probe(void)
{
    int e = 0, uffd = -1, pagemap = -1;
    uint8_t changed[PROBE_PAGES] = {0};
    int mem = memfd_create("paracell-dirty-probe", MFD_CLOEXEC);
    if (mem < 0 || ftruncate(mem, PROBE_PAGES * PAGE) < 0) {
        e = errno;
        goto out;
    }
    volatile uint8_t *m = mmap(NULL, PROBE_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED,
                               mem, 0);
    if (m == MAP_FAILED) {
        e = errno;
        goto out;
    }
    for (int i = 0; i < PROBE_PAGES; i++) m[i * PAGE] = 1;  /* present, as guest RAM is */
    uffd = pc_dirty_arm((void *)m, PROBE_PAGES * PAGE);
    pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (uffd < 0 || pagemap < 0) {
        e = errno;
    } else {
        m[2 * PAGE] = 2;
        if (pc_dirty_take(pagemap, (uintptr_t)m, PROBE_PAGES * PAGE, changed) < 0)
            e = errno;
        else if (!changed[2] || changed[0] || changed[1] || changed[3])
            e = EIO;  /* a log that says something else than what was written */
    }
    munmap((void *)m, PROBE_PAGES * PAGE);
out:
    if (pagemap >= 0) close(pagemap);
    if (uffd >= 0) close(uffd);
    if (mem >= 0) close(mem);
    return e;
}

int pc_dirty_take(int pagemap_fd, uint64_t va, uint64_t size, uint8_t *changed)
{
    struct pc_page_region vec[REGIONS];
    uint64_t at = va, end = va + size;
    while (at < end) {
        struct pc_pm_scan_arg arg = {
            .size = sizeof arg, .flags = PC_PM_SCAN_WP_MATCHING | PC_PM_SCAN_CHECK_WPASYNC,
            .start = at, .end = end, .vec = (uintptr_t)vec, .vec_len = REGIONS,
            .category_mask = PC_PAGE_IS_WRITTEN, .return_mask = PC_PAGE_IS_WRITTEN};
        long n = ioctl(pagemap_fd, PC_PAGEMAP_SCAN, &arg);
        if (n < 0) return -1;
        for (long k = 0; k < n; k++) {
            if (vec[k].start < va || vec[k].end > end || vec[k].start > vec[k].end) {
                errno = EIO;
                return -1;
            }
            for (uint64_t p = vec[k].start; p < vec[k].end; p += PAGE)
                changed[(p - va) / PAGE] = 1;
        }
        /* The walk stops where vec filled up, and says where: go on from there. */
        if (arg.walk_end >= end) break;
        if (arg.walk_end <= at) {
            errno = EIO;
            return -1;
        }
        at = arg.walk_end;
    }
    return 0;
}
