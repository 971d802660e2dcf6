"""Linux ABI numbers Python's os module does not carry (from <sys/mount.h>)."""

MS_RDONLY = 0x1
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SHARED = 1 << 20
MNT_DETACH = 2
