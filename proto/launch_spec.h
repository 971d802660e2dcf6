/* The record keys of the launch spec (SPEC), the SANDBOX and the START
 * payloads: `key=value`, each NUL-terminated (docs/agent-protocol.md).  This
 * list is their one definition: the agent compares against these names and
 * the host writes them, through cffi (paracell/speckeys.py), so a key
 * is never typed twice.  Compound values separate their fields with
 * PC_KEY_SEP. */
#ifndef PARACELL_PROTO_LAUNCH_SPEC_H
#define PARACELL_PROTO_LAUNCH_SPEC_H

#define PC_KEY_SEP "\x1f"

/* The process (init or exec). */
#define PC_KEY_ARG "arg"
#define PC_KEY_ENV "env"
#define PC_KEY_CWD "cwd"
#define PC_KEY_UID "uid"
#define PC_KEY_GID "gid"
#define PC_KEY_GID_ADD "gid+"
#define PC_KEY_UMASK "umask"
#define PC_KEY_RLIMIT "rlimit"
#define PC_KEY_NNP "nnp"
#define PC_KEY_OOM_SCORE_ADJ "oom_score_adj"
#define PC_KEY_IOPRIO "ioprio"
#define PC_KEY_TERMINAL "terminal"
#define PC_KEY_ROWS "rows"
#define PC_KEY_COLS "cols"
/* cap.SET: the five capability sets; ns.TYPE: a pod namespace to join. */
#define PC_KEY_CAP_PREFIX "cap."
#define PC_KEY_NS_PREFIX "ns."
#define PC_KEY_CAP_BOUNDING "cap.bounding"
#define PC_KEY_CAP_EFFECTIVE "cap.effective"
#define PC_KEY_CAP_PERMITTED "cap.permitted"
#define PC_KEY_CAP_INHERITABLE "cap.inheritable"
#define PC_KEY_CAP_AMBIENT "cap.ambient"

/* The container, on its init's SPEC. */
#define PC_KEY_CONTAINER "container"
#define PC_KEY_ROLE "role"
#define PC_KEY_HOSTNAME "hostname"
#define PC_KEY_ROOT_READONLY "root.readonly"
#define PC_KEY_ROOT_PROPAGATION "root.propagation"
#define PC_KEY_XGATES "xgates"
#define PC_KEY_MOUNT "mount"
#define PC_KEY_SYSCTL "sysctl"
#define PC_KEY_PATH_READONLY "path.readonly"
#define PC_KEY_PATH_MASKED "path.masked"
#define PC_KEY_DEVICE "device"
#define PC_KEY_USERNS "userns"
#define PC_KEY_UIDMAP "uidmap"
#define PC_KEY_GIDMAP "gidmap"
#define PC_KEY_PERSONALITY "personality"
#define PC_KEY_SECCOMP "seccomp"
#define PC_KEY_ROOTFS "rootfs"
#define PC_KEY_NS_IPC "ns.ipc"
#define PC_KEY_NS_UTS "ns.uts"
#define PC_KEY_NS_PID "ns.pid"
/* A pod member's linux.resources, on its group in the guest (cgroup v2
 * files of these names): decimal, 1..INT64_MAX; absent is no limit. Also
 * the keys of a LIMITS payload (agent_proto.h), where `max` lifts one. */
#define PC_KEY_MEMORY_MAX "memory.max"
#define PC_KEY_PIDS_MAX "pids.max"

/* The SANDBOX (net.* also in a START). */
#define PC_KEY_SHARE "share"
#define PC_KEY_ROOTDISK "rootdisk"
#define PC_KEY_HOSTFILE "hostfile"
#define PC_KEY_MACHINE_ID "machineid"
#define PC_KEY_CLOCK "clock"
#define PC_KEY_ENTROPY "entropy"
#define PC_KEY_NET_IF "net.if"
#define PC_KEY_NET_ADDR "net.addr"
#define PC_KEY_NET_ROUTE "net.route"
#define PC_KEY_NET_SPARE "net.spare"

#endif
