/* Which pages of guest RAM QEMU wrote since the last look (docs/snapshots.md,
 * "How dirty pages are found"): the RAM plugin registers QEMU's mapping of
 * the RAM file for asynchronous userfaultfd write-protection
 * (csrc/ramplugin.c), and the shim reads and re-arms it through QEMU's
 * /proc/PID/pagemap with PAGEMAP_SCAN.  Both are Linux 6.7's; Debian 12's
 * headers are 6.1's, so the few definitions used are here, from the
 * kernel's uapi (linux/userfaultfd.h, linux/fs.h).  Handed to cffi's cdef
 * like relay.h: keep to its subset. */
#ifndef PARACELL_DIRTYLOG_H
#define PARACELL_DIRTYLOG_H

#include <stdint.h>
#include <linux/ioctl.h>

#define PC_UFFD_USER_MODE_ONLY 1
#define PC_UFFD_API 0xAAULL
#define PC_UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1ULL << 12)
#define PC_UFFD_FEATURE_WP_UNPOPULATED (1ULL << 13)
#define PC_UFFD_FEATURE_WP_ASYNC (1ULL << 15)
#define PC_UFFD_WP_FEATURES (PC_UFFD_FEATURE_WP_ASYNC | PC_UFFD_FEATURE_WP_HUGETLBFS_SHMEM | PC_UFFD_FEATURE_WP_UNPOPULATED)
#define PC_UFFDIO_REGISTER_MODE_WP (1ULL << 1)
#define PC_UFFDIO_WRITEPROTECT_MODE_WP (1ULL << 0)

struct pc_uffdio_range { uint64_t start, len; };
struct pc_uffdio_api { uint64_t api, features, ioctls; };
struct pc_uffdio_register { struct pc_uffdio_range range; uint64_t mode, ioctls; };
struct pc_uffdio_writeprotect { struct pc_uffdio_range range; uint64_t mode; };

#define PC_UFFDIO_API _IOWR(0xAA, 0x3F, struct pc_uffdio_api)
#define PC_UFFDIO_REGISTER _IOWR(0xAA, 0x00, struct pc_uffdio_register)
#define PC_UFFDIO_WRITEPROTECT _IOWR(0xAA, 0x06, struct pc_uffdio_writeprotect)

struct pc_pm_scan_arg {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
    uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
struct pc_page_region { uint64_t start, end, categories; };

#define PC_PAGEMAP_SCAN _IOWR('f', 16, struct pc_pm_scan_arg)
#define PC_PM_SCAN_WP_MATCHING (1ULL << 0)
#define PC_PM_SCAN_CHECK_WPASYNC (1ULL << 1)
#define PC_PAGE_IS_WRITTEN (1ULL << 1)

/* Arms the log over [addr, addr + len) of this process's own memory:
 * asynchronous userfaultfd write-protection, all of it protected.  Returns
 * the userfaultfd, which must stay open for as long as the log is wanted,
 * or -1 with errno (a kernel before 6.7 has no asynchronous mode). */
int pc_dirty_arm(void *addr, uint64_t len);

/* Whether this host can keep such a log: arms a few pages of a memfd of its
 * own, writes one, and reads the log back.  0, or the errno that stops it. */
int pc_dirty_probe(void);

/* Marks changed[i] = 1 for every page of [va, va + size) in the process
 * whose pagemap is pagemap_fd that was written since the last call, and
 * write-protects them again in the same walk.  0, or -1 with errno: EPERM
 * where the mapping is not registered for it (the plugin could not, or
 * another QEMU), EINVAL or ENOTTY on a kernel without PAGEMAP_SCAN. */
int pc_dirty_take(int pagemap_fd, uint64_t va, uint64_t size, uint8_t *changed);

#endif
