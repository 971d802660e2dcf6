/* tmpcopyup, as runc's CopyDirectory: every entry is opened relative to its
 * parent's fd with O_NOFOLLOW, so a symlink in the image is copied as a
 * symlink and never leads the copy out of the directory. */
#define _GNU_SOURCE
#include "copyup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Deeper trees fail rather than exhaust the child's stack or fds. */
#define MAX_DEPTH 64

static int copy_file(int from, int to, const char *name, mode_t mode)
{
    char buf[65536];
    int in = openat(from, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0)
        return -1;
    int out = openat(to, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    int r = out < 0 ? -1 : 0;
    while (!r) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n <= 0) {
            r = n < 0 ? -1 : 0;
            break;
        }
        for (ssize_t off = 0; off < n && !r;) {
            ssize_t w = write(out, buf + off, (size_t)(n - off));
            if (w < 0)
                r = -1;
            else
                off += w;
        }
    }
    int e = errno;
    close(in);
    if (out >= 0)
        close(out);
    errno = e;
    return r;
}

static int copy_dir(int from, int to, int depth);

static int copy_entry(int from, int to, const char *name, int depth)
{
    struct stat st;
    char target[PATH_MAX];
    if (fstatat(from, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return -1;
    mode_t perm = st.st_mode & 07777;
    int r;
    switch (st.st_mode & S_IFMT) {
    case S_IFDIR: {
        if (mkdirat(to, name, 0700) < 0)
            return -1;
        int sub_from = openat(from, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int sub_to = openat(to, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        r = sub_from < 0 || sub_to < 0 ? -1 : copy_dir(sub_from, sub_to, depth + 1);
        int e = errno;
        if (sub_from >= 0)
            close(sub_from);
        if (sub_to >= 0)
            close(sub_to);
        errno = e;
        break;
    }
    case S_IFREG:
        r = copy_file(from, to, name, perm);
        break;
    case S_IFLNK: {
        ssize_t n = readlinkat(from, name, target, sizeof target - 1);
        if (n < 0)
            return -1;
        target[n] = 0;
        return symlinkat(target, to, name) < 0 ||
                       fchownat(to, name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) < 0
                   ? -1
                   : 0;
    }
    case S_IFIFO:
    case S_IFCHR:
    case S_IFBLK:
        r = mknodat(to, name, st.st_mode, st.st_rdev);
        break;
    default:
        return 0; /* a socket is not content */
    }
    if (r < 0 || fchownat(to, name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) < 0 ||
        fchmodat(to, name, perm, 0) < 0)
        return -1;
    return 0;
}

static int copy_dir(int from, int to, int depth)
{
    if (depth > MAX_DEPTH) {
        errno = ELOOP;
        return -1;
    }
    int fd = openat(from, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    struct dirent *e;
    int r = 0;
    while (!r && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            r = copy_entry(from, to, e->d_name, depth);
    int err = errno;
    closedir(d);
    errno = err;
    return r;
}

int copy_tree(int from, int to)
{
    return copy_dir(from, to, 0);
}
