"""ParaCell's Python SDK for agent frameworks (docs/sdk.md): make a sandbox,
run commands in it and read their output, read and write its files,
checkpoint, roll back, fork and kill it, all without a process start per
call.

    from paracell.sandbox import Sandbox

    with Sandbox.create("bundle", snapshot=True) as box:
        box.files.write("/tmp/x.py", b"print(6 * 7)")
        box.checkpoint("before")
        result = box.run(["python3", "/tmp/x.py"], timeout=30)
        if result.exit_code != 0:
            box.rollback("before")
"""

from __future__ import annotations

from paracell.sandbox.box import Sandbox
from paracell.sandbox.errors import (
    CommandTimeout,
    FileError,
    OutputTooLarge,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
    SessionEnded,
)
from paracell.sandbox.session import Process, Result

__all__ = ["CommandTimeout", "FileError", "OutputTooLarge", "Process", "Result", "Sandbox",
           "SandboxError", "SandboxNotFound", "SandboxNotRunning", "SessionEnded"]
