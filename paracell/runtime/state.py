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

from paracell.errors import NotExistError, ParacellError
from paracell.runtime.ids import check_id

# typing, contextlib and pathlib cost more to import than `state` does to run.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

STATE_FILE = "state.json"


class ContainerState:
    """What state.json holds. A plain class: `state` and `kill` run on every
    containerd poll, and dataclasses/pathlib would double their start-up."""

    FIELDS: dict[str, Any] = {
        "id": "", "bundle": "", "status": "", "created": "", "annotations": None,
        "shim_pid": 0, "shim_start": 0, "memory_file": "", "rootfs": "",
        "config_extra": None,
    }

    def __init__(self, **values: Any) -> None:
        unknown = set(values) - set(self.FIELDS)
        if unknown:
            raise TypeError(f"unknown state fields {sorted(unknown)}")
        for name, default in self.FIELDS.items():
            value = values.get(name, default)
            setattr(self, name, {} if value is None and name in ("annotations", "config_extra")
                    else value)
        # Declared for type checkers; set above.
        self.id: str
        self.bundle: str
        self.status: str  # creating, created, running, paused, stopped
        self.created: str
        self.annotations: dict[str, str]
        self.shim_pid: int
        self.shim_start: int  # /proc/<pid>/stat start time, against pid reuse
        self.memory_file: str
        self.rootfs: str
        self.config_extra: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.FIELDS}


def oci_state(state: ContainerState) -> dict[str, object]:
    return {
        "ociVersion": "1.0.2",
        "id": state.id,
        "pid": state.shim_pid if state.status != "stopped" else 0,
        "status": state.status,
        "bundle": state.bundle,
        "rootfs": state.rootfs,
        "created": state.created,
        "annotations": state.annotations,
        "owner": "",
    }


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


class ContainerLock:
    def __init__(self, store: StateStore, container_id: str, must_exist: bool) -> None:
        self.store, self.container_id, self.must_exist = store, container_id, must_exist
        self.fd = -1

    def __enter__(self) -> None:
        path = self.store.path(self.container_id, "lock")
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            raise NotExistError(self.container_id) from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            if self.must_exist and not os.path.exists(self.store.path(self.container_id,
                                                                     STATE_FILE)):
                raise NotExistError(self.container_id)
        except BaseException:
            os.close(self.fd)
            raise

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


class StateStore:
    def __init__(self, root: str) -> None:
        self.root = root

    def path(self, container_id: str, name: str = "") -> str:
        return os.path.join(self.root, check_id(container_id), name)

    def dir(self, container_id: str) -> Path:
        from pathlib import Path

        return Path(self.path(container_id))

    def create_dir(self, container_id: str) -> Path:
        path = self.dir(container_id)
        os.makedirs(self.root, mode=0o711, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            raise ParacellError(f"container with id exists: {container_id}") from None
        return path

    def load(self, container_id: str) -> ContainerState:
        try:
            with open(self.path(container_id, STATE_FILE), "rb") as f:
                data = json.loads(f.read())
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

    def save(self, state: ContainerState) -> None:
        tmp = self.path(state.id, f".{STATE_FILE}.{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(state.as_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path(state.id, STATE_FILE))

    def locked(self, container_id: str, must_exist: bool = True) -> ContainerLock:
        """Serialises verbs on one container; the lock dies with its holder."""
        return ContainerLock(self, container_id, must_exist)

    def list_ids(self) -> list[str]:
        try:
            names = os.listdir(self.root)
            return sorted(n for n in names
                          if os.path.exists(os.path.join(self.root, n, STATE_FILE)))
        except OSError as err:
            if err.errno == errno.ENOENT:
                return []
            raise
