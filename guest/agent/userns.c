/* The id maps of a container's user namespace.  The kernel takes each map
 * in one write of less than a page, from a process with CAP_SETUID (or
 * CAP_SETGID) in the parent namespace, which the process that unshared
 * no longer has: a helper left outside writes them. */
#define _GNU_SOURCE
#include "userns.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int write_map(int piddir, const char *file, const struct spec_idmap *m, int n, char *err,
                     size_t errlen)
{
    char text[PC_SPEC_MAX_ID_MAP_TEXT + 1];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        int w = snprintf(text + len, sizeof text - len, "%u %u %u\n", m[i].inside, m[i].outside,
                         m[i].size);
        if (w < 0 || (size_t)w >= sizeof text - len) {
            snprintf(err, errlen, "%s is longer than %d bytes", file, PC_SPEC_MAX_ID_MAP_TEXT);
            return -1;
        }
        len += (size_t)w;
    }
    int fd = openat(piddir, file, O_WRONLY | O_CLOEXEC);
    ssize_t done = fd < 0 ? -1 : write(fd, text, len);
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (done != (ssize_t)len) {
        snprintf(err, errlen, "write %s: %s", file, done < 0 ? strerror(e) : "short write");
        return -1;
    }
    return 0;
}

int userns_write_maps(int piddir, const struct spec *s, char *err, size_t errlen)
{
    if (write_map(piddir, "gid_map", s->gidmap, s->ngidmap, err, errlen) < 0 ||
        write_map(piddir, "uid_map", s->uidmap, s->nuidmap, err, errlen) < 0)
        return -1;
    return 0;
}
