/* Pages QEMU wrote, from its pagemap: see dirtylog.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <sys/ioctl.h>

#include "dirtylog.h"

#define PAGE 4096
#define REGIONS 512  /* written ranges returned per PAGEMAP_SCAN call */

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
