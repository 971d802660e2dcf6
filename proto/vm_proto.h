/* How the micro-VM is wired: the names and addresses that the host's VM
 * builder (paracell/vmm) gives devices and the guest agent looks for.  The one
 * definition; Python reads it through cffi like proto/agent_proto.h. */
#ifndef PARACELL_PROTO_VM_H
#define PARACELL_PROTO_VM_H

/* The virtio-serial port that carries the agent channel. */
#define PC_AGENT_PORT_NAME "paracell.agent"
/* QEMU's isa-debug-exit; QEMU exits with status (value << 1) | 1. */
#define PC_DEBUG_EXIT_PORT 244
/* virtio-9p mount tags and where the agent mounts them in the guest. */
#define PC_ROOTFS_TAG "rootfs"
#define PC_ROOTFS_DIR "/rootfs"
#define PC_HOSTSHARE_TAG "hostshare"
#define PC_HOSTSHARE_DIR "/hostshare"
/* A pod VM's share: one directory per member container, holding its rootfs
 * and its bind sources (docs/pods.md). */
#define PC_PODSHARE_TAG "podshare"
#define PC_PODSHARE_DIR "/pod"
/* A snapshot-mode VM (docs/snapshots.md) has no 9p share: its rootfs is the
 * first virtio block device, an ext4 image mounted read-only at
 * PC_ROOTDISK_DIR, under an overlay whose upper layer is a tmpfs in guest
 * RAM at PC_ROOTUPPER_DIR; the overlay is mounted at PC_ROOTFS_DIR. */
#define PC_ROOTDISK_DEV "/dev/vda"
#define PC_ROOTDISK_DIR "/rootdisk"
#define PC_ROOTUPPER_DIR "/rootupper"

#endif
