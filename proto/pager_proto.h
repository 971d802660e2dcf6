/* The Pager channel between the guest kernel's Pager driver and the host's
 * Pager server (csrc/pager.c): rings in a reserved range of guest RAM, and
 * QEMU's ivshmem-doorbell device for the doorbells both ways.  The one definition of the layout: the guest kernel build
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
 * The rings are in guest RAM, not in the device's BAR2, so that a Pager VM
 * can be saved and restored (VM templates): QEMU 7.2 with x-ignore-shared
 * refuses to load a shared RAM block, which BAR2 is, at another guest-
 * physical address than it was saved at, and a restored VM's BAR is not
 * mapped yet when that check runs.  So BAR2 is a token page the guest never
 * maps (its address stays 0 on both sides), and the rings sit at a fixed
 * guest-physical range that the host reserves with `memmap=` and reaches
 * through its own mapping of the guest-RAM file.  The guest initializes the
 * header; the host reads it once, at the first doorbell, and takes its
 * consumer indices from it then (a restored guest continues its rings).
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
#define PC_PAGER_VERSION 2
/* The rings' range of guest RAM: below the kernel's 16 MiB load address, so
 * that neither the kernel image nor KASLR's choice can cover it, and below
 * any RAM split. */
#define PC_PAGER_RING_GPA 0xF00000
#define PC_PAGER_SHM_SIZE 65536
/* ivshmem-doorbell insists on shared memory for BAR2; the guest never maps it. */
#define PC_PAGER_TOKEN_SIZE 4096
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
    uint32_t magic;       /* the guest writes these at probe; the host checks them */
    uint32_t version;
    uint32_t unbind_slots;
    uint32_t bind_slots;
    uint32_t pad[12];
    struct pc_pager_ring unbind;
    struct pc_pager_ring bind;
    struct pc_pager_guest_stats guest;
    struct pc_pager_range unbind_ring[64];
    struct pc_pager_range bind_ring[2048];
};

#endif
