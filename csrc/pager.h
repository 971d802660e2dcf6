/* The host half of the Pager: the ivshmem server for one VM and the C loop
 * that drains its rings (layout: proto/pager_proto.h).  Python sets it up and
 * starts its thread; no Python runs per range.  Handed to cffi's cdef like
 * relay.h, so keep to the subset it reads. */
#ifndef PARACELL_PAGER_H
#define PARACELL_PAGER_H

/* How a wakeup ended. */
#define PC_PAGER_OK 0
#define PC_PAGER_VIOLATION -1  /* the guest broke the protocol; error says how */
#define PC_PAGER_IO_ERROR -2   /* a host call failed; error says which */

/* Host-side figures.  They live in a small file in the container's state
 * directory, mapped shared, so `paracell events --stats` reads them without
 * asking the shim.  Only the Pager thread writes them. */
struct pc_pager_stats {
    uint64_t unbind_ranges;
    uint64_t unbind_pages;
    uint64_t unbind_batches;
    uint64_t bind_ranges;
    uint64_t bind_pages;
    uint64_t bind_batches;
    uint64_t last_reclaim_ns;  /* doorbell seen to ack sent, for the last UNBIND batch */
    uint64_t doorbells;
    uint64_t violations;
    uint64_t vmm_prefault_pages;  /* bound pages also mapped into QEMU's page tables */
    uint64_t bind_ns;             /* time spent binding: populating and prefaulting */
    uint64_t ram_pages;           /* guest RAM, for bounding the guest's own figures */
};

struct pc_pager {
    int ram_fd;
    int token_fd;
    int doorbell_fd;  /* the host's vector: the guest rings it */
    int irq_fd;       /* the guest's vector: the host rings it to ack */
    int stop_fd;
    int abort_fd;     /* readable once the Pager stops on a violation */
    uint64_t ram_size;
    uint64_t ram_split;
    uint8_t *ram_map;
    struct pc_pager_shm *shm;  /* inside ram_map: the guest's rings */
    struct pc_pager_stats *stats;
    uint32_t unbind_cons;
    uint32_t bind_cons;
    int attached;         /* the header checked and the indices taken (first doorbell) */
    uint64_t idle_window_ns;
    uint64_t idle_doorbells;
    int vmm_pid;          /* QEMU, once started (pc_pager_set_vmm); 0 before */
    int vmm_lookups;      /* tries left to find QEMU's mapping of guest RAM */
    uint64_t vmm_base;    /* that mapping's address in QEMU, 0 while unknown */
    unsigned long thread;
    int running;
    void *gate;           /* a mutex the thread holds for each wakeup: pc_pager_pause */
    int in_vmm;           /* serving from inside QEMU (pc_pager_adopt), not from the shim */
    uint8_t *unbound;     /* a byte per page: unbound since pc_pager_take_unbound (shim only) */
    char error[240];
};

/* Maps guest RAM (ram_fd, ram_size bytes, of which ram_split sit below 4 GiB;
 * the rings are inside it) and the stats file (stats_fd), sizes the token
 * page QEMU's ivshmem wants for BAR2 (token_fd), and makes the eventfds.
 * With ram_fd -1 the VM's RAM is QEMU's private copy-on-write mapping of a
 * template (docs/pager.md), served inside QEMU by csrc/ramplugin.c: only the
 * token page, the stats and the eventfds are made, for the greeting and for
 * QEMU to inherit; nothing is mapped, and pc_pager_start starts no thread. */
int pc_pager_open(struct pc_pager *p, int ram_fd, uint64_t ram_size, uint64_t ram_split,
                  int token_fd, int stats_fd);

/* Inside QEMU (csrc/ramplugin.c): serves the rings through QEMU's own mapping
 * of guest RAM, ram_map, which is private: an UNBIND discards QEMU's copy of
 * a page (MADV_DONTNEED, so the page reads the template's again and holds no
 * memory of its own) and a BIND populates one (MADV_POPULATE_WRITE).  The
 * template's file is never written.  The fds are the shim's, inherited, and
 * are used as they are (not duplicated); stats_fd is mapped. */
int pc_pager_adopt(struct pc_pager *p, uint8_t *ram_map, uint64_t ram_size, uint64_t ram_split,
                   int doorbell_fd, int irq_fd, int abort_fd, int stats_fd);
/* The start of the mapping, in a /proc/PID/maps file, of the file dev:ino
 * from offset 0, writable, at least size bytes long, shared (kind 's') or
 * private ('p'); 0 if there is none. */
uint64_t pc_find_file_mapping(const char *maps_path, uint64_t dev, uint64_t ino, uint64_t size,
                              char kind);
/* Queues the ivshmem server's greeting for QEMU on sock_fd, which QEMU gets
 * as `-chardev socket,fd=`: version, QEMU's peer id, the token page, its
 * own vectors, then the host's. */
int pc_pager_greet(struct pc_pager *p, int sock_fd);
/* One doorbell's work, bounded: BIND entries first (up to
 * PC_PAGER_MAX_BIND_PER_WAKEUP), then the UNBIND batch.  Returns PC_PAGER_*,
 * or 1 when BIND entries are left for another pass. */
int pc_pager_wakeup(struct pc_pager *p, uint64_t doorbells, uint64_t now_ns);
/* Tells the Pager QEMU's pid once QEMU runs: from then on every bound range
 * is also mapped into QEMU's own page tables, so the guest's first touch of
 * it costs QEMU no host page fault.  Without it (or when QEMU's mapping
 * cannot be read) binding still works; QEMU faults the pages in itself. */
void pc_pager_set_vmm(struct pc_pager *p, int pid);
/* The serving thread: waits for doorbells until pc_pager_stop. */
int pc_pager_start(struct pc_pager *p);
/* Waits for the wakeup in progress, if any, and holds the thread off until
 * pc_pager_resume: nothing is bound or punched meanwhile.  A checkpoint
 * reads guest RAM, and a rollback rewrites it, under it. */
void pc_pager_pause(struct pc_pager *p);
/* Lets the thread go on.  With reattach, the next doorbell takes the
 * consumer indices from the rings again, as after a restore: a rollback put
 * back the rings of its checkpoint. */
void pc_pager_resume(struct pc_pager *p, int reattach);
/* ORs into changed[] (a byte per page of guest RAM) every page unbound since
 * the last call, and forgets them, and the rings' pages.  A checkpoint that
 * knows which pages QEMU wrote (csrc/dirtylog.h) must look at these too: a
 * punched page that BIND refills reads zeros that QEMU never wrote, and
 * this thread writes the rings' consumer indices itself.  Called with the
 * thread paused. */
void pc_pager_take_unbound(struct pc_pager *p, uint8_t *changed);
/* Stops the thread and releases every fd and mapping it owns (after
 * pc_pager_adopt, guest RAM and the eventfds are lent, and stay). Idempotent. */
void pc_pager_close(struct pc_pager *p);

#endif
