"""The SDK's exceptions: each a ParacellError with one line, by what went wrong,
so that an agent framework can tell a sandbox that is gone from a command
that failed (docs/sdk.md)."""

from __future__ import annotations

from paracell.errors import ParacellError


class SandboxError(ParacellError):
    """Any failure of an SDK call."""


class SandboxNotFound(SandboxError):
    """No sandbox has this id under this root (deleted, or never made)."""


class SandboxNotRunning(SandboxError):
    """The sandbox exists but runs nothing: stopped, paused, or its VM is gone."""


class SessionEnded(SandboxError):
    """A rollback ended the command: its process is not in the checkpoint."""


class CommandTimeout(SandboxError):
    """The command ran past its timeout and was killed."""


class OutputTooLarge(SandboxError):
    """The command wrote more than the caller allowed, and was killed."""


class FileError(SandboxError):
    """A file operation failed in the sandbox: the path, and why."""
