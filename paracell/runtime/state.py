"""Per-container state under --root: one directory, an atomic state.json, a lock.

Status is stored as what the last verb made it, and corrected on read: a
created/running container whose shim has died is stopped, whatever the file
says, so a crash can never leave a container that looks alive.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from paracell.errors import NotExistError, ParacellError
from paracell.runtime.ids import check_id

STATE_FILE = "state.json"
EXIT_FILE = "exit"


@dataclass
class ContainerState:
    id: str
    bundle: str
    status: str  # creating, created, running, paused, stopped
    created: str
    annotations: dict[str, str] = field(default_factory=dict)
    shim_pid: int = 0
    shim_start: int = 0  # /proc/<pid>/stat start time, against pid reuse
    memory_file: str = ""
    rootfs: str = ""
    exit_status: int | None = None
    error: str = ""
    sandbox: bool = True
    config_extra: dict[str, Any] = field(default_factory=dict)


def process_start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields resume after the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] == b"Z":
        return None
    return int(fields[19])


def shim_alive(state: ContainerState) -> bool:
    return state.shim_pid > 0 and process_start_time(state.shim_pid) == state.shim_start


class StateStore:
    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def dir(self, container_id: str) -> Path:
        return self.root / check_id(container_id)

    def create_dir(self, container_id: str) -> Path:
        path = self.dir(container_id)
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            raise ParacellError(f"container with id exists: {container_id}") from None
        return path

    def exists(self, container_id: str) -> bool:
        return (self.dir(container_id) / STATE_FILE).exists()

    def load(self, container_id: str) -> ContainerState:
        path = self.dir(container_id) / STATE_FILE
        try:
            data = json.loads(path.read_text())
            state = ContainerState(**data)
        except FileNotFoundError:
            raise NotExistError(container_id) from None
        except (ValueError, TypeError) as err:
            raise ParacellError(f"state of container {container_id} is corrupt: {err}") from None
        self._settle(state)
        return state

    def _settle(self, state: ContainerState) -> None:
        if state.status in ("created", "running", "paused") and not shim_alive(state):
            state.status = "stopped"
        if state.status == "stopped" and state.exit_status is None:
            state.exit_status = self.read_exit(state.id)

    def read_exit(self, container_id: str) -> int | None:
        try:
            return int((self.dir(container_id) / EXIT_FILE).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def save(self, state: ContainerState) -> None:
        directory = self.dir(state.id)
        tmp = directory / f".{STATE_FILE}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(asdict(state), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / STATE_FILE)

    @contextmanager
    def locked(self, container_id: str, must_exist: bool = True) -> Iterator[None]:
        """Serialises verbs on one container; the lock dies with its holder."""
        directory = self.dir(container_id)
        try:
            fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            raise NotExistError(container_id) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if must_exist and not (directory / STATE_FILE).exists():
                raise NotExistError(container_id)
            yield
        finally:
            os.close(fd)

    def list_ids(self) -> list[str]:
        try:
            return sorted(p.name for p in self.root.iterdir() if (p / STATE_FILE).exists())
        except OSError as err:
            if err.errno == errno.ENOENT:
                return []
            raise
