/* linux.devices, made as runc makes them: mknod, then the owner and the
 * exact mode (mknod's mode passes through the umask, chmod's does not). */
#define _GNU_SOURCE
#include "devices.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

int device_make(int dirfd, const char *name, const struct spec_device *d)
{
    mode_t kind = d->type == 'b' ? S_IFBLK : d->type == 'p' ? S_IFIFO : S_IFCHR;
    dev_t dev = d->type == 'p' ? 0 : makedev(d->major, d->minor);
    if (mknodat(dirfd, name, kind | (d->mode & 07777), dev) < 0)
        return errno == EEXIST ? 0 : -1;
    if (fchownat(dirfd, name, d->uid, d->gid, AT_SYMLINK_NOFOLLOW) < 0 ||
        fchmodat(dirfd, name, d->mode & 07777, 0) < 0)
        return -1;
    return 0;
}
