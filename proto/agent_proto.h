/* The agent channel: frames between the host (shim, exec proxies, control
 * clients) and the guest agent.  This file is the one definition of the
 * format: the agent and csrc/ include it, and Python reads it through cffi
 * (csrc/build_native.py), so nothing here is ever retyped elsewhere.
 *
 * It is written in the subset cffi's cdef understands: integer and string
 * #defines, enums with explicit values and plain structs.  The prose is in
 * docs/agent-protocol.md. */
#ifndef PARACELL_PROTO_AGENT_H
#define PARACELL_PROTO_AGENT_H

#include <stdint.h>

/* Sent in READY; the host refuses a guest that speaks another version. */
#define PC_PROTO_VERSION 3
/* A frame larger than this is a protocol violation, never a reason to allocate. */
#define PC_MAX_PAYLOAD 65536
#define PC_HDR_LEN 8
/* Channel 0 is the container's init process; exec'd processes get 1..PC_MAX_CHAN. */
#define PC_MAX_CHAN 1024

/* All fields little-endian. */
struct pc_hdr {
    uint32_t len;   /* payload bytes that follow the header */
    uint16_t type;  /* enum pc_type */
    uint16_t chan;  /* process the frame is about */
};

enum pc_type {
    /* host -> guest.  After READY, one SANDBOX attaches what is the VM's own;
     * then each container's processes come as SPECs (docs/agent-protocol.md). */
    PC_SPEC = 1,      /* launch spec records; guest answers CREATED or ERROR */
    PC_START = 2,     /* let the created process execve */
    PC_STDIN = 3,     /* stdin bytes, within the channel's window (below); empty: EOF */
    PC_SIGNAL = 4,    /* struct pc_signal_msg */
    PC_RESIZE = 5,    /* struct pc_resize_msg */
    PC_POWEROFF = 6,  /* host has read everything; guest may power off */
    PC_SANDBOX = 7,   /* sandbox records, once, before any SPEC; guest answers ATTACHED or ERROR */
    PC_STATS = 8,     /* a container's id: its cgroup's figures, answered STATS_REPLY or ERROR */
    PC_LIMITS = 9,    /* records: a running container's new memory/pids limits (below),
                       * on a channel as STATS's; answered ATTACHED or ERROR */
    PC_SECCOMP = 12,  /* struct pc_seccomp_hdr + BPF program, just before the init's SPEC */
    /* Around a checkpoint or rollback (docs/snapshots.md): QUIESCE asks the
     * agent to send what it has queued, then QUIESCED, then nothing until
     * RESUME; the host sends nothing in between either, so the channel is
     * empty both ways while the VM is saved or loaded. */
    PC_QUIESCE = 13,  /* struct pc_quiesce_msg */
    PC_RESUME = 14,   /* struct pc_resume_msg */
    PC_FORKED = 15,   /* a fork's new identity, SANDBOX records, while quiesced before its
                       * RESUME; guest answers ATTACHED or ERROR */

    /* guest -> host */
    PC_READY = 16,    /* agent is up; struct pc_ready_msg; nothing attached yet */
    PC_CREATED = 17,  /* struct pc_created_msg */
    PC_STDOUT = 18,   /* stdout bytes (the pty's output with a terminal) */
    PC_STDERR = 19,   /* stderr bytes */
    PC_EXIT = 20,     /* struct pc_exit_msg; all output was sent before it */
    PC_ERROR = 21,    /* text: why the request for this channel failed */
    PC_ATTACHED = 22, /* no payload: the SANDBOX is applied */
    PC_QUIESCED = 23, /* struct pc_quiesce_msg, the QUIESCE's: everything before it is sent;
                       * nothing follows until RESUME */

    /* port-forward streams (docs/networking.md): `chan` is the stream id,
     * 1..PC_FWD_MAX_STREAMS, which the host gives out; both ways unless marked */
    PC_FWD_OPEN = 24,   /* host -> guest: struct pc_fwd_open_msg; connect to loopback:port */
    PC_FWD_DATA = 25,   /* 1..PC_MAX_PAYLOAD bytes, within the receiver's window */
    PC_FWD_CREDIT = 26, /* struct pc_fwd_credit_msg: bytes the receiver passed on */
    PC_FWD_SHUT = 27,   /* no payload: the sender's socket read EOF; no more DATA */
    PC_FWD_CLOSE = 28,  /* no payload: the sender is done with the stream (below) */

    /* guest -> host */
    PC_STDIN_CREDIT = 29, /* struct pc_stdin_credit_msg: STDIN bytes the agent passed on */
    PC_STATS_REPLY = 30,  /* PC_STAT_COUNT u64 figures, by enum pc_stat, on the STATS's channel */

    /* host only: the shim's answer to a control client (start, kill) */
    PC_HOST_ACK = 40,
};

/* Fixed-size payloads, little-endian.  Each side encodes and decodes them in
 * one place: proto/agent_codec.h for C, paracell/runtime/agent/channel.py for Python. */
struct pc_signal_msg {
    uint32_t signo;
    uint32_t flags;   /* PC_SIGNAL_ALL */
};
#define PC_SIGNAL_ALL 1

struct pc_resize_msg {
    uint16_t rows;
    uint16_t cols;
};

struct pc_ready_msg {
    uint32_t version; /* PC_PROTO_VERSION */
    uint32_t caps;    /* PC_AGENT_CAP_* this agent has */
};
/* What the agent can do, besides the base protocol. */
#define PC_AGENT_CAP_PORTFWD 1  /* PC_FWD_* streams */
#define PC_AGENT_CAP_SECCOMP 2  /* PC_SECCOMP programs */
#define PC_AGENT_CAP_STATS 4    /* PC_STATS and PC_LIMITS: each container in a cgroup of its own */
#define PC_AGENT_CAPS (PC_AGENT_CAP_PORTFWD | PC_AGENT_CAP_SECCOMP | PC_AGENT_CAP_STATS)

/* QUIESCE's number, which its QUIESCED repeats: a QUIESCED that answers an
 * earlier QUIESCE (one whose asker gave up and got a RESUME sent for it)
 * never passes for the answer to a later one. */
struct pc_quiesce_msg {
    uint32_t seq;
};

struct pc_resume_msg {
    uint32_t flags;   /* PC_RESUME_ROLLED_BACK */
};
/* The VM was loaded from a checkpoint: the host has ended every exec session
 * and port-forward stream, so the agent kills the exec'd processes and drops
 * the streams without a word.  The init's stdin window starts again from
 * what the agent holds: the agent sends STDIN_CREDIT on channel 0 for the
 * window less the bytes it has buffered, and the host counts from 0. */
#define PC_RESUME_ROLLED_BACK 1

/* Stdin flow control, per channel: the host may have at most
 * PC_STDIN_WINDOW bytes of STDIN unanswered.  It starts each channel (at its
 * SPEC; the init's at the start) with that much credit, spends it on STDIN
 * payloads, and gets it back by STDIN_CREDIT once the agent has written the
 * bytes to the process (or dropped them: the process closed its stdin or is
 * gone).  The agent buffers a whole window per process, so a STDIN frame
 * never waits in the agent's receive buffer, and a process that does not
 * read its stdin holds back its own channel, never the VM's (QUIESCE,
 * SIGNAL and the other channels go on).  Credit beyond the window is
 * clamped, not trusted. */
struct pc_stdin_credit_msg {
    uint32_t bytes;
};
#define PC_STDIN_WINDOW (2 * PC_MAX_PAYLOAD)

struct pc_created_msg {
    uint32_t pid;     /* guest pid of the created process */
};

struct pc_exit_msg {
    int32_t status;   /* exit code, or 128+signal */
};

/* A container's figures (docs/agent-protocol.md, "Stats"): every container
 * of the VM runs in a cgroup v2 group of its own, with its execs.  A control
 * client asks with STATS on channel 0, the container's id as the payload; the
 * shim's relay gives the request a free channel, and the agent answers on it
 * with STATS_REPLY (an ended container's last figures, until its slot is
 * reused), or ERROR for a container the VM does not hold.  The reply
 * is PC_STAT_COUNT little-endian u64s, each at its index below; the names
 * after PC_STAT_ are the guest's own file keys (cpu.stat, memory.stat,
 * memory.events, pids.*), lowercased.  A figure the guest kernel does not
 * keep is 0; so is a limit of "max".  They are the guest's word: the host
 * reports them as the container's and decides nothing by them. */
/* LIMITS: `container=ID`, then `memory.max` and/or `pids.max`, each at most
 * once: decimal 1..INT64_MAX, or `max` for none (launch_spec.h's keys). The
 * payload is at most PC_LIMITS_MAX bytes. */
#define PC_LIMITS_MAX 512

enum pc_stat {
    PC_STAT_USAGE_USEC = 0,     /* cpu.stat */
    PC_STAT_USER_USEC = 1,
    PC_STAT_SYSTEM_USEC = 2,
    PC_STAT_MEMORY_CURRENT = 3, /* memory.current */
    PC_STAT_MEMORY_MAX = 4,     /* memory.max, 0 for max */
    PC_STAT_ANON = 5,           /* memory.stat, from here to PC_STAT_PGMAJFAULT */
    PC_STAT_FILE = 6,
    PC_STAT_KERNEL_STACK = 7,
    PC_STAT_SLAB = 8,
    PC_STAT_SOCK = 9,
    PC_STAT_SHMEM = 10,
    PC_STAT_FILE_MAPPED = 11,
    PC_STAT_FILE_DIRTY = 12,
    PC_STAT_FILE_WRITEBACK = 13,
    PC_STAT_INACTIVE_ANON = 14,
    PC_STAT_ACTIVE_ANON = 15,
    PC_STAT_INACTIVE_FILE = 16,
    PC_STAT_ACTIVE_FILE = 17,
    PC_STAT_UNEVICTABLE = 18,
    PC_STAT_PGFAULT = 19,
    PC_STAT_PGMAJFAULT = 20,
    PC_STAT_OOM = 21,           /* memory.events */
    PC_STAT_OOM_KILL = 22,
    PC_STAT_PIDS_CURRENT = 23,  /* pids.current */
    PC_STAT_PIDS_MAX = 24,      /* pids.max, 0 for max */
    PC_STAT_COUNT = 25,
};

/* Port forwarding: a connection to 127.0.0.1:PORT or [::1]:PORT in the VM's
 * network namespace on the host becomes a stream to the same address and
 * port in the guest.  Each side may have at most PC_FWD_WINDOW bytes of DATA
 * in flight per stream: it starts with that much credit, spends it on DATA
 * and gets it back by CREDIT once the receiver has written the bytes to its
 * socket, so a slow reader holds back its own stream and never the channel.
 * A side sends SHUT once, when its socket reads EOF.  It sends CLOSE once:
 * after it sent and got SHUT and wrote out all it got (the normal end), or at
 * once to abort (connect refused, reset); a CLOSE that comes before both
 * SHUTs is an abort, and the receiver resets its socket.  An id is free
 * again on a side that has sent and received CLOSE. */
struct pc_fwd_open_msg {
    uint16_t port;    /* 1..65535 */
    uint16_t family;  /* PC_FWD_INET (127.0.0.1) or PC_FWD_INET6 (::1) */
};
#define PC_FWD_INET 4
#define PC_FWD_INET6 6
struct pc_fwd_credit_msg {
    uint32_t bytes;   /* 1..what the sender of DATA has in flight */
};
#define PC_FWD_MAX_STREAMS 64
#define PC_FWD_WINDOW (256 * 1024)

/* The SANDBOX payload: `key=value` records, each NUL-terminated, as SPEC's.
 *   share=TAG        a 9p share to mount, by its tag (vm_proto.h), at its place
 *   hostname=NAME    the VM's own hostname (its initial UTS namespace)
 *   clock=SEC.NSEC   the host's wall clock when it sent this (CLOCK_REALTIME)
 *   entropy=HEX      fresh random bytes from the host for the guest's RNG
 *   net.if/net.addr/net.route/net.spare   the VM's interfaces (netspec.h)
 *   rootdisk=ro|rw   snapshot mode: the rootfs is the block device (vm_proto.h),
 *                    read-only, or under a writable layer in guest RAM
 *   hostfile=SLOT:HEX  snapshot mode: a host file copied in, in place of the
 *                    9p share's bind slot SLOT (a decimal number)
 * A FORKED payload has hostname, clock and entropy as here, plus
 *   container=ID     the container's new id (it was the parent's)
 *   machineid=HEX    32 hex digits for the container's /etc/machine-id
 * Every key but net.addr/net.route/net.spare/share/hostfile at most once. */
#define PC_SANDBOX_MAX_SHARES 3
#define PC_SANDBOX_HOSTNAME_MAX 64
#define PC_SANDBOX_ENTROPY_MIN 32
#define PC_SANDBOX_ENTROPY_MAX 256
#define PC_SANDBOX_MAX_HOSTFILES 3
#define PC_SANDBOX_HOSTFILE_MAX 4096

/* Bounds of the launch spec (the PC_SPEC payload); the host refuses a spec
 * over them before sending, the agent refuses it again on receipt. */
#define PC_SPEC_MAX_ARGS 4096
#define PC_SPEC_MAX_ENV 4096
#define PC_SPEC_MAX_MOUNTS 256
#define PC_SPEC_MAX_GIDS 256
#define PC_SPEC_MAX_RLIMITS 64
#define PC_SPEC_MAX_MOUNT_OPTIONS 64
#define PC_SPEC_MAX_CONTAINER_ID 255
/* linux.sysctl: entries, a name's bytes (dotted, as in config.json) and a
 * value's bytes (one write to /proc/sys, which takes less than a page). */
#define PC_SPEC_MAX_SYSCTLS 256
#define PC_SPEC_MAX_SYSCTL_NAME 255
#define PC_SPEC_MAX_SYSCTL_VALUE 4095
/* linux.maskedPaths and linux.readonlyPaths, each; a path's bytes (PATH_MAX - 1). */
#define PC_SPEC_MAX_PATHS 256
#define PC_SPEC_MAX_PATH_LEN 4095
/* process.oomScoreAdj, the kernel's OOM_SCORE_ADJ_MIN..OOM_SCORE_ADJ_MAX. */
#define PC_SPEC_OOM_SCORE_ADJ_MIN -1000
#define PC_SPEC_OOM_SCORE_ADJ_MAX 1000


/* ---- In-guest fields of config.json (issue 9 part 3) ---- */

/* linux.seccomp: the host compiles the profile with libseccomp and sends the
 * classic-BPF program in one PC_SECCOMP frame on the init's channel, right
 * before a SPEC that says seccomp=1 (the SPEC fails without it, and a
 * PC_SECCOMP that no such SPEC takes is dropped).  Payload: the header, then
 * `count` struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}, little-endian.
 * The agent installs it in the init and in every exec of that container. */
struct pc_seccomp_hdr {
    uint32_t flags;   /* SECCOMP_FILTER_FLAG_* bits of PC_SECCOMP_FLAGS_ALLOWED */
    uint32_t count;   /* instructions, 1..PC_SECCOMP_MAX_INSNS */
};
#define PC_SECCOMP_HDR_LEN 8
/* The kernel's BPF_MAXINSNS: a longer program is refused by seccomp(). */
#define PC_SECCOMP_MAX_INSNS 4096
/* The kernel's SECCOMP_FILTER_FLAG_LOG and _SPEC_ALLOW (TSYNC is a no-op for
 * a process that execs alone, NEW_LISTENER is refused on the host). */
#define PC_SECCOMP_FLAG_LOG 2
#define PC_SECCOMP_FLAG_SPEC_ALLOW 4
#define PC_SECCOMP_FLAGS_ALLOWED 6

/* linux.devices: nodes made in the container's /dev tmpfs. */
#define PC_SPEC_MAX_DEVICES 256
/* linux.uidMappings and gidMappings: the kernel's limit on extents per map
 * (UID_GID_MAP_MAX_EXTENTS); the map's text must also stay under a page. */
#define PC_SPEC_MAX_ID_MAPS 340
#define PC_SPEC_MAX_ID_MAP_TEXT 4095
/* process.ioPriority: the kernel's classes; levels 0..PC_SPEC_IOPRIO_MAX_LEVEL. */
#define PC_SPEC_IOPRIO_CLASS_RT 1
#define PC_SPEC_IOPRIO_CLASS_BE 2
#define PC_SPEC_IOPRIO_CLASS_IDLE 3
#define PC_SPEC_IOPRIO_MAX_LEVEL 7
/* linux.personality domains: PER_LINUX and PER_LINUX32. */
#define PC_SPEC_PER_LINUX 0
#define PC_SPEC_PER_LINUX32 8

/* Networking (docs/networking.md): the SANDBOX carries the interfaces the
 * shim found in the container's network namespace, each mirrored onto a
 * virtio-net device with the same MAC.  Interfaces, addresses and routes are
 * counted over the whole VM; a name is the kernel's IFNAMSIZ - 1; an MTU is
 * what an Ethernet device takes (IPv4's minimum to the 16-bit field). */
#define PC_NET_MAX_IFACES 16
#define PC_NET_MAX_ADDRS 64
#define PC_NET_MAX_ROUTES 128
#define PC_NET_IFNAME_MAX 15
#define PC_NET_MTU_MIN 68
#define PC_NET_MTU_MAX 65535
/* Spare devices a VM gets at create for interfaces that appear only before
 * START (ctr run --cni adds them to the shim's new namespace then). */
#define PC_NET_MAX_SPARES 1

#endif
