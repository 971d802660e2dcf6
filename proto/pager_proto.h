/* The Pager channel: the shared memory of QEMU's ivshmem-doorbell device,
 * between the guest kernel's Pager driver and the host's Pager server
 * (csrc/pager.c).  The one definition of the layout: the guest kernel build
 * copies this file into its tree, csrc/ includes it, and Python reads it
 * through cffi.  The prose, and why no page is reused while unbound, are in
 * docs/pager.md.
 *
 * Two single-producer rings, both written by the guest and consumed by the
 * host.  UNBIND carries free pages the guest has isolated: the host punches
 * them out of the guest-RAM file, then publishes its consumer index and
 * interrupts the guest, which only then returns the pages to its free lists.
 * BIND carries ranges the guest has started, or is about to start, using:
 * the host populates them off the guest's critical path and never acks.
 * Indices run freely and wrap at 2^32; slot = index % slots.
 *
 * Written in the subset cffi's cdef reads: integer #defines and plain structs
 * with literal array sizes (the #defines repeat them; csrc/pager.c checks). */
#ifndef PARACELL_PROTO_PAGER_H
#define PARACELL_PROTO_PAGER_H

#ifdef __KERNEL__
#include <linux/types.h>
#else
#include <stdint.h>
#endif

/* ivshmem-doorbell identity and wiring. */
#define PC_PAGER_PCI_VENDOR 0x1af4
#define PC_PAGER_PCI_DEVICE 0x1110
#define PC_PAGER_GUEST_PEER 0   /* QEMU's ivshmem peer id */
#define PC_PAGER_HOST_PEER 1    /* the host server's peer id: the doorbell target */
#define PC_PAGER_VECTORS 1      /* one MSI-X vector each way */
/* BAR0 registers. */
#define PC_PAGER_REG_INTR_MASK 0
#define PC_PAGER_REG_INTR_STATUS 4
#define PC_PAGER_REG_IVPOSITION 8
#define PC_PAGER_REG_DOORBELL 12

#define PC_PAGER_MAGIC 0x50434750  /* "PGCP" little-endian */
#define PC_PAGER_VERSION 1
/* The shared memory; a power of two, as a PCI BAR must be. */
#define PC_PAGER_SHM_SIZE 65536
#define PC_PAGER_UNBIND_SLOTS 64
#define PC_PAGER_BIND_SLOTS 2048
/* Host-side bounds on a hostile guest. */
#define PC_PAGER_MAX_BIND_PER_WAKEUP 512   /* bind entries drained per doorbell */
#define PC_PAGER_MAX_RANGE_PAGES 262144    /* one entry covers at most 1 GiB */
#define PC_PAGER_MAX_IDLE_WAKEUPS 20000    /* doorbells with no work per second */
#define PC_PAGER_PAGE_SIZE 4096

/* One contiguous guest-physical range; both fields multiples of the page size. */
struct pc_pager_range {
    uint64_t addr;
    uint64_t len;
};

/* Producer and consumer index of one ring, each on its own cache line so the
 * guest's stores and the host's never share one. */
struct pc_pager_ring {
    uint32_t prod;      /* guest writes */
    uint32_t prod_pad[15];
    uint32_t cons;      /* host writes */
    uint32_t cons_pad[15];
};

/* What the guest says about itself, for telemetry only: the host shows these
 * figures and never acts on them. */
struct pc_pager_guest_stats {
    uint64_t total_pages;     /* managed by the guest's page allocator */
    uint64_t free_pages;      /* on its free lists */
    uint64_t unbound_pages;   /* free, reported, and not bound again yet */
    uint64_t reported_pages;  /* ever sent in UNBIND */
    uint64_t bound_ahead_pages;  /* bound before any allocation asked for them */
    uint64_t bound_late_pages;   /* allocated while still unbound: a host fault each */
    uint64_t bind_dropped;    /* bind records lost to full rings: cost faults, not data */
    uint64_t unbind_batches;
    uint64_t bind_batches;
    uint64_t inflight_pages;  /* in an UNBIND the host has not acked */
};

struct pc_pager_shm {
    uint32_t magic;       /* host writes before boot */
    uint32_t version;
    uint32_t unbind_slots;
    uint32_t bind_slots;
    uint64_t ram_size;    /* guest RAM bytes, for the guest's own sanity check */
    uint64_t ram_split;   /* guest-physical RAM is [0, split) and [4 GiB, 4 GiB + size - split) */
    uint32_t pad[8];
    struct pc_pager_ring unbind;
    struct pc_pager_ring bind;
    struct pc_pager_guest_stats guest;
    struct pc_pager_range unbind_ring[64];
    struct pc_pager_range bind_ring[2048];
};

#endif
