"""Untrusted JSON files, read with runc's refusals: one line for bad input,
never a traceback and never a hang, whatever sits at the path."""

from __future__ import annotations

import errno
import json
import os
import stat

from paracell.errors import ParacellError


def read_regular(path: str, limit: int, follow: bool = True) -> bytes:
    """At most limit + 1 bytes of a regular file (so the caller can tell it
    is too large). Non-blocking open: a FIFO put there must not hang a verb.
    follow=False: a symlink at path is refused, never read through.
    FileNotFoundError passes through; anything else is one ParacellError."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags if follow else flags | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise ParacellError(f"{path} is a symlink, which is never followed") from None
        raise ParacellError(f"open {path}: {err.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ParacellError(f"{path} is not a regular file")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as err:
        raise ParacellError(f"read {path}: {err.strerror}") from None
    finally:
        os.close(fd)


def parse_json(raw: bytes, where: str) -> object:
    try:
        return json.loads(raw)
    except RecursionError:
        # Python's decoder stops at its recursion limit, far above any real
        # spec; runc's says the same of its own limit.
        raise ParacellError(f"{where} is not valid JSON: exceeded max depth") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ParacellError(f"{where} is not valid JSON: {err}") from None
