"""Files in directories someone else may write: every name is opened
relative to a directory fd, never through a link, and every file is created
new (O_EXCL) or replaced by a rename, so nothing planted at a name is ever
written through. Sizes are bounded before anything is read or copied.

runc's checkpoint writes into an --image-path or --work-path the caller
names; a restore reads an image that may come from another host (podman's
--import); the template store may be another user's by mistake. All of them
go through here."""

from __future__ import annotations

import errno
import hashlib
import os
import stat

from paracell.errors import ParacellError

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Dir:
    """A directory held open by fd; `what` names it in errors (a flag, say)."""

    def __init__(self, fd: int, what: str) -> None:
        self.fd, self.what = fd, what
        self.made: list[str] = []  # names this object created, newest last

    @classmethod
    def open(cls, path: str, what: str, create: bool = False) -> Dir:
        """The directory at path, never a link at its last component; made
        (with its parents) when create is set and it is missing."""
        if create:
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
            except OSError as err:
                raise ParacellError(f"{what} {path}: {err.strerror}") from None
        try:
            return cls(os.open(path, _OPEN_DIR), what)
        except FileNotFoundError:
            raise ParacellError(f"{what} {path}: no such directory") from None
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.ENOTDIR):
                raise ParacellError(f"{what} {path} is not a directory (a link is not "
                                    "followed)") from None
            raise ParacellError(f"{what} {path}: {err.strerror}") from None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stat(self) -> os.stat_result:
        return os.fstat(self.fd)

    def is_empty(self) -> bool:
        with os.scandir(self.fd) as entries:
            return next(entries, None) is None

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def subdir(self, name: str, create: bool = False) -> Dir:
        _check_name(name)
        if create:
            os.mkdir(name, 0o700, dir_fd=self.fd)
            self.made.append(name)
        try:
            return Dir(os.open(name, _OPEN_DIR, dir_fd=self.fd), f"{self.what} {name}")
        except OSError as err:
            raise ParacellError(f"{self.what}: {name} is not a directory "
                                f"({err.strerror})") from None

    def create(self, name: str, mode: int = 0o600) -> int:
        """A new file's fd for writing; whatever sits at the name already
        (a file, a link, a FIFO) refuses it."""
        _check_name(name)
        try:
            fd = os.open(name, _CREATE, mode, dir_fd=self.fd)
        except FileExistsError:
            raise ParacellError(f"{self.what}: {name} exists already (nothing is written "
                                "through it)") from None
        self.made.append(name)
        return fd

    def write_new(self, name: str, data: bytes, mode: int = 0o600) -> None:
        fd = self.create(name, mode)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)

    def replace(self, name: str, data: bytes, mode: int = 0o600) -> None:
        """name holds data afterwards: written to a new file, then renamed
        over it (a link at name is replaced, never followed)."""
        _check_name(name)
        tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}"
        fd = os.open(tmp, _CREATE, mode, dir_fd=self.fd)
        try:
            write_all(fd, data)
        except BaseException:
            os.unlink(tmp, dir_fd=self.fd)
            raise
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def open_regular(self, name: str, limit: int, exact: int | None = None) -> int:
        """A regular file's fd for reading, of at most limit bytes (exactly
        `exact` when given); one ParacellError otherwise."""
        _check_name(name)
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except FileNotFoundError:
            raise ParacellError(f"{self.what}: {name} is missing") from None
        except OSError as err:
            why = "is a link, which is never followed" if err.errno == errno.ELOOP \
                else err.strerror
            raise ParacellError(f"{self.what}: {name} {why}") from None
        try:
            check_regular(fd, f"{self.what}: {name}", limit, exact)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, name: str, limit: int) -> bytes:
        fd = self.open_regular(name, limit)
        try:
            return read_all(fd, limit)
        finally:
            os.close(fd)

    def undo(self) -> None:
        """Removes what this object created, newest first: after a failure,
        the directory is as it was (unlink never follows a link)."""
        for name in reversed(self.made):
            try:
                if stat.S_ISDIR(self.lstat(name).st_mode):
                    _remove_tree(self.fd, name)
                else:
                    os.unlink(name, dir_fd=self.fd)
            except OSError:
                pass
        self.made.clear()


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ParacellError(f"bad file name {name[:64]!r}")


def _remove_tree(parent_fd: int, name: str) -> None:
    fd = os.open(name, _OPEN_DIR, dir_fd=parent_fd)
    try:
        for entry in os.listdir(fd):
            if stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                _remove_tree(fd, entry)
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def check_regular(fd: int, what: str, limit: int, exact: int | None = None) -> os.stat_result:
    st = os.fstat(fd)
    why = ("is not a regular file" if not stat.S_ISREG(st.st_mode)
           else f"is {st.st_size} bytes, expected {exact}"
           if exact is not None and st.st_size != exact
           else f"is larger than {limit} bytes" if st.st_size > limit else "")
    if why:
        raise ParacellError(f"{what} {why}")
    return st


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_all(fd: int, limit: int) -> bytes:
    """At most limit bytes from fd's current offset; more is an error."""
    chunks, left = [], limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    data = b"".join(chunks)
    if len(data) > limit:
        raise ParacellError(f"a file grew past {limit} bytes while it was read")
    return data


def sha256_fd(fd: int) -> str:
    """The SHA-256 of a file's whole content, from its start; the offset is
    left at the start again."""
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
    os.lseek(fd, 0, os.SEEK_SET)
    return digest.hexdigest()


def sparse_copy(source_fd: int, target_fd: int, size: int | None = None) -> int:
    """Copies the data extents of source into target (target gets source's
    size, or `size`; holes kept); the bytes copied. The kernel moves the
    data (sendfile): one call per extent, nothing past `size` is read."""
    if size is None:
        size = os.fstat(source_fd).st_size
    os.ftruncate(target_fd, size)
    copied = offset = 0
    while offset < size:
        try:
            offset = os.lseek(source_fd, offset, os.SEEK_DATA)
        except OSError as err:
            if err.errno == errno.ENXIO:  # no data past offset
                break
            raise
        if offset >= size:
            break
        end = min(os.lseek(source_fd, offset, os.SEEK_HOLE), size)
        os.lseek(target_fd, offset, os.SEEK_SET)
        while offset < end:
            sent = os.sendfile(target_fd, source_fd, offset, end - offset)
            if sent == 0:
                raise OSError(errno.EIO, "short copy of a sparse file")
            offset += sent
            copied += sent
    return copied
