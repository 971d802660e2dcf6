"""QEMU's QMP monitor, the one place ParaCell talks to it: a short session
on the VM's monitor socket, run to completion from synchronous code.

qemu.qmp is asyncio-only; each call here is one connection, one or more
commands in order, and a disconnect. The verbs that use it (pause, resume,
update, save) are short-lived processes, so nothing is kept open between
calls, and a QEMU that died simply refuses the connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paracell.errors import ParacellError

# A monitor that does not answer within this is a wedged or hostile VMM.
COMMAND_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Command:
    name: str
    arguments: dict[str, Any] | None = None
    # Sent by SCM_RIGHTS just before the command (for `getfd`).
    fd: int = -1


@dataclass(frozen=True)
class AwaitMigration:
    """A step of a session: polls `query-migrate` in it until the migration
    (a save or a restore) completes; one session instead of one per poll."""

    what: str  # "save" or "restore", for the error
    timeout_s: float
    poll_s: float = 0.001


@dataclass(frozen=True)
class AwaitJob:
    """A step of a session: polls `query-jobs` until the job (a snapshot's
    save or load) concludes, then dismisses it; its error is the step's."""

    job_id: str
    timeout_s: float
    poll_s: float = 0.001


@dataclass(frozen=True)
class Call:
    """A step of a session: runs fn where it stands, between two commands
    (what a checkpoint does to guest RAM while the VM is stopped). Its
    exception ends the session and is raised as it is."""

    fn: Callable[[], None]


class StepFailed(Exception):
    """A Call's own exception, carried out of the session unchanged."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


Step = Command | AwaitMigration | AwaitJob | Call


def run(socket_path: Path, *commands: Step) -> list[Any]:
    """Runs the commands in one session; their return values, in order.
    Any failure is one ParacellError naming the command."""
    # Here, not at the top: asyncio costs every VM's shim about 40 ms to
    # import, and a shim that never talks to QMP need not pay it.
    import asyncio

    from qemu.qmp import QMPClient

    from paracell import unixsock

    current = _name(commands[0]) if commands else "connect"
    try:
        sock = unixsock.connect(socket_path)
    except OSError as err:
        raise ParacellError(f"QMP {current}: {err.strerror}") from None

    async def session() -> list[Any]:
        nonlocal current
        client = QMPClient("paracell")
        await client.connect(sock)
        try:
            results: list[Any] = []
            for command in commands:
                current = _name(command)
                if isinstance(command, AwaitMigration):
                    await _migrated(client, command)
                    results.append(None)
                    continue
                if isinstance(command, Call):
                    try:
                        command.fn()
                    except BaseException as err:
                        raise StepFailed(err) from None
                    results.append(None)
                    continue
                if isinstance(command, AwaitJob):
                    await _job_done(client, command)
                    results.append(None)
                    continue
                if command.fd >= 0:
                    client.send_fd_scm(command.fd)
                results.append(await asyncio.wait_for(
                    client.execute(command.name, command.arguments), COMMAND_TIMEOUT_S))
            return results
        finally:
            await client.disconnect()

    try:
        return asyncio.run(session())
    except StepFailed as failed:
        raise failed.error from None
    except MigrationError as err:
        raise ParacellError(str(err)) from None
    except Exception as err:  # qemu.qmp raises several unrelated types
        text = str(err) or type(err).__name__
        raise ParacellError(f"QMP {current}: {text}") from None


def _name(step: Step) -> str:
    if isinstance(step, AwaitJob):
        return "query-jobs"
    if isinstance(step, Call):
        return "a step between commands"
    return step.name if isinstance(step, Command) else "query-migrate"


async def _job_done(client: Any, step: AwaitJob) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + step.timeout_s
    while True:
        jobs = await asyncio.wait_for(client.execute("query-jobs"), COMMAND_TIMEOUT_S)
        job = next((j for j in jobs or [] if isinstance(j, dict) and j.get("id") == step.job_id),
                   None)
        if job is None:
            raise MigrationError(f"QMP job {step.job_id} is gone")
        if job.get("status") == "concluded":
            await asyncio.wait_for(client.execute("job-dismiss", {"id": step.job_id}),
                                   COMMAND_TIMEOUT_S)
            if job.get("error"):
                raise MigrationError(f"{step.job_id}: {str(job['error'])[:200]}")
            return
        if loop.time() > deadline:
            raise MigrationError(f"{step.job_id} did not finish in {step.timeout_s:.0f} s")
        await asyncio.sleep(step.poll_s)


async def _migrated(client: Any, step: AwaitMigration) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + step.timeout_s
    while True:
        info = await asyncio.wait_for(client.execute("query-migrate"), COMMAND_TIMEOUT_S)
        status = info.get("status") if isinstance(info, dict) else None
        if status == "completed":
            return
        if status in ("failed", "cancelled"):
            why = str(info.get("error-desc") or status)[:200]
            raise MigrationError(f"{step.what} of the VM's state failed: {why}")
        if loop.time() > deadline:
            raise MigrationError(f"{step.what} of the VM's state did not finish in "
                                 f"{step.timeout_s:.0f} s")
        await asyncio.sleep(step.poll_s)


class MigrationError(Exception):
    """Said as it is, not as "QMP query-migrate: ..." (run() passes it on)."""


def execute(socket_path: Path, name: str, arguments: dict[str, Any] | None = None) -> Any:
    return run(socket_path, Command(name, arguments))[0]
