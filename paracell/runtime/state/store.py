"""Per-container state under --root: one directory, an atomic state.json, a lock.

Status is stored as what the last verb made it, and settled on read by the
state machine (paracell.runtime.state.status) against the processes recorded here.

A container directory becomes visible only complete: create builds it under a
temporary name, with its lock held and state.json written, and renames it into
place. So an ID is never left half-made by a create that was killed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat

from paracell.errors import NotExistError, ParacellError
from paracell.procfs import same_process
from paracell.record import Record
from paracell.runtime.state import status as st
from paracell.runtime.state.ids import check_id
from paracell.vmm.config import VmConfig

# typing, contextlib, pathlib and shutil cost more to import than `state` does to run.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

STATE_FILE = "state.json"
# Far above a real state (a few KiB): a bound on what a hostile file can cost.
MAX_STATE_BYTES = 1 << 20
LOCK_FILE = "lock"
# The shim's socket for exec proxies and control requests (start, kill --all).
CONTROL_SOCKET = "shim.sock"
# The stand-in's pid and start time, apart from state.json: what delete
# --force finds it by when state.json cannot be read (runtime/verbs/salvage.py).
STANDIN_PID_FILE = "standin.pid"
# Not a valid container ID (ids.py allows [A-Za-z0-9_+.-] only), so a sweep of
# abandoned creates can never take a real container for one.
_NEW_PREFIX = "~new-"


class HostRecord(Record):
    """Host resources that are not the VM's devices: its cgroup directories."""

    FIELDS = {"cgroups": []}

    cgroups: list[dict[str, Any]]  # CgroupDir facts (paracell/runtime/host/cgroups/)


class VmRecord(Record):
    """The container's VM on the host: its configuration, its processes, and
    what `delete` needs to end and clean it up after its shim has died.
    `reclaim` holds each attached device's facts, as its builder recorded
    them (paracell/reclaim.py), for cleanup by kind and nothing else."""

    FIELDS = {"qemu_pid": 0, "qemu_start": 0, "config": None, "host": None, "reclaim": [],
              "template": "", "shares_memory_of": ""}
    NESTED = {"config": VmConfig, "host": HostRecord}

    qemu_pid: int
    qemu_start: int  # /proc/<pid>/stat start time, against pid reuse
    template: str  # "restored KEY", "saved KEY" or "" (runtime/vm/templating.py)
    # A fork that maps its checkpoint's RAM copy-on-write: "checkpoint NAME
    # of PARENT", and it cannot be checkpointed (runtime/snapshots/forking.py).
    shares_memory_of: str
    config: VmConfig
    host: HostRecord
    reclaim: list[dict[str, Any]]


class ContainerState(Record):
    """What state.json holds."""

    FIELDS = {
        "id": "", "bundle": "", "status": "", "created": "", "annotations": {},
        "rootfs": "", "shim_pid": 0, "shim_start": 0, "creator_pid": 0, "creator_start": 0,
        "hooks": {}, "vm": None, "has_process": True, "pool_vm": "",
    }
    NESTED = {"vm": VmRecord}

    id: str
    bundle: str
    status: str  # one of paracell.runtime.state.status
    created: str
    annotations: dict[str, str]
    rootfs: str
    shim_pid: int
    shim_start: int
    creator_pid: int  # the `create` that is making this container
    creator_start: int
    # Kept here: poststart/poststop must run even if the bundle has changed or gone.
    hooks: dict[str, Any]
    vm: VmRecord
    # False for a spec without `process`: created, but start must fail.
    has_process: bool
    # The pooled VM this container took (runtime/pod/pooled.py), which its
    # delete deletes; "" for any other container.
    pool_vm: str


def oci_state(state: ContainerState) -> dict[str, object]:
    return {
        "ociVersion": "1.0.2",
        "id": state.id,
        "pid": state.shim_pid if st.stands_for_a_process(state.status) else 0,
        "status": state.status,
        "bundle": state.bundle,
        "rootfs": state.rootfs,
        "created": state.created,
        "annotations": state.annotations,
        "owner": "",
    }


def shim_alive(state: ContainerState) -> bool:
    return same_process(state.shim_pid, state.shim_start)


class CorruptStateError(ParacellError):
    """state.json is there but says nothing that can be trusted."""

    def __init__(self, container_id: str, why: object) -> None:
        text = str(why).splitlines()[0][:200] if str(why) else type(why).__name__
        super().__init__(f"state of container {container_id} is corrupt: {text} "
                         "(delete --force removes it)")


def _check_loaded(state: ContainerState, container_id: str) -> None:
    """What a written state always has; `{}` or another container's state does not."""
    if state.id != container_id:
        raise ValueError(f"it names container {state.id[:64]!r}")
    if state.status not in st.ALL:
        raise ValueError(f"unknown status {state.status[:32]!r}")
    numbers = (state.shim_pid, state.shim_start, state.creator_pid, state.creator_start,
               state.vm.qemu_pid, state.vm.qemu_start)
    if any(n < 0 or n > 1 << 62 for n in numbers):
        raise ValueError("a pid or start time is out of range")
    if not all(isinstance(d, dict) and isinstance(d.get("kind"), str)
               for d in state.vm.reclaim):
        raise ValueError("a device record is not an object with a kind")
    for d in state.vm.host.cgroups:
        if not (isinstance(d, dict) and isinstance(d.get("path"), str)
                and type(d.get("version")) is int and isinstance(d.get("made_from", ""), str)
                and isinstance(d.get("controllers"), list)
                and all(isinstance(c, str) for c in d["controllers"])):
            raise ValueError("a cgroup record is malformed")
    if not all(isinstance(v, list) for v in state.hooks.values()):
        raise ValueError("the hooks are malformed")
    # A delete deletes the pooled VM its container took: never another container.
    if state.pool_vm:
        from paracell.runtime import poolwire

        if not (poolwire.is_pool_vm(state.pool_vm) and check_id(state.pool_vm)):
            raise ValueError(f"pool_vm {state.pool_vm[:64]!r} is no pooled VM")


class ContainerLock:
    """An exclusive flock on the container's lock file; it dies with its holder.
    The file is never created here: a container being removed cannot be
    brought back half-alive by a verb that races with its removal."""

    def __init__(self, store: StateStore, container_id: str) -> None:
        self.store, self.container_id = store, container_id
        self.fd = -1

    def __enter__(self) -> None:
        if not self.store.is_container_dir(self.container_id):
            raise NotExistError(self.container_id)
        lock = self.store.path(self.container_id, LOCK_FILE)
        try:
            self.fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                os.close(self.fd)
                raise CorruptStateError(self.container_id, "its lock is not a regular file")
        except FileNotFoundError:
            # A removal takes the state first: a state without its lock is broken.
            if os.path.lexists(self.store.path(self.container_id, STATE_FILE)):
                raise CorruptStateError(self.container_id, "its lock file is missing") from None
            raise NotExistError(self.container_id) from None
        except OSError as err:
            raise CorruptStateError(self.container_id, f"its lock: {err.strerror}") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            if not os.path.exists(self.store.path(self.container_id, STATE_FILE)):
                raise NotExistError(self.container_id)
        except BaseException:
            os.close(self.fd)
            raise

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _lock_is_free(lock_path: str) -> bool:
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


class StateStore:
    def __init__(self, root: str) -> None:
        self.root = root

    def path(self, container_id: str, name: str = "") -> str:
        # Never a trailing slash: "ID/" would resolve a symlink put at ID, and
        # everything below would act on the link's target.
        base = os.path.join(self.root, check_id(container_id))
        return os.path.join(base, name) if name else base

    def is_container_dir(self, container_id: str) -> bool:
        """Only a real directory in the root is a container's: an entry that
        is a symlink (put there by someone else) is never followed, read,
        written or removed."""
        try:
            return stat.S_ISDIR(os.lstat(self.path(container_id)).st_mode)
        except OSError:  # missing, or a root that is not a directory
            return False

    def dir(self, container_id: str) -> Path:
        from pathlib import Path

        return Path(self.path(container_id))

    def create(self, state: ContainerState) -> int:
        """Makes the container's directory appear, complete and locked. Returns
        the held lock's fd; the caller closes it to release the lock."""
        os.makedirs(self.root, mode=0o711, exist_ok=True)
        self.sweep_abandoned()
        tmp = os.path.join(self.root, f"{_NEW_PREFIX}{os.getpid()}-{os.urandom(4).hex()}")
        os.mkdir(tmp, 0o700)
        lock_fd = -1
        try:
            lock_fd = os.open(os.path.join(tmp, LOCK_FILE),
                              os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            self._write(os.path.join(tmp, STATE_FILE), state)
            self.remove_stale(state.id)
            try:
                os.rename(tmp, self.path(state.id))
            except OSError as err:
                if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise ParacellError(f"container with id exists: {state.id}") from None
                raise
            return lock_fd
        except BaseException:
            if lock_fd >= 0:
                os.close(lock_fd)
            _rmtree(tmp)
            raise

    def scratch(self) -> Path:
        """A new private directory in the root, for a verb's own files while it
        runs (a restore's copy of its image); no container id can name it,
        and it is swept like a create's once its verb has died."""
        from pathlib import Path

        os.makedirs(self.root, mode=0o711, exist_ok=True)
        path = os.path.join(self.root, f"{_NEW_PREFIX}{os.getpid()}-{os.urandom(4).hex()}")
        os.mkdir(path, 0o700)
        return Path(path)

    def sweep_abandoned(self) -> None:
        """Temporary directories of verbs that were killed before they finished."""
        try:
            names = [n for n in os.listdir(self.root) if n.startswith(_NEW_PREFIX)]
        except OSError:
            return
        for name in names:
            # By the pid in its name, not by its lock: a create that is alive
            # has made the directory a moment before it can lock it.
            pid = name[len(_NEW_PREFIX):].partition("-")[0]
            if not pid.isdigit() or not _pid_exists(int(pid)):
                _rmtree(os.path.join(self.root, name))

    def remove_stale(self, container_id: str) -> None:
        """Removes a directory without state that nobody holds: the remains of
        a removal that was killed half-way."""
        path = self.path(container_id)
        if self.is_container_dir(container_id) \
                and not os.path.lexists(os.path.join(path, STATE_FILE)) \
                and _lock_is_free(os.path.join(path, LOCK_FILE)):
            _rmtree(path)

    def remove(self, container_id: str) -> None:
        """The state file goes first, so the container vanishes at once from
        every view; the rest of the directory follows."""
        if not self.is_container_dir(container_id):
            return
        try:
            os.unlink(self.path(container_id, STATE_FILE))
        except FileNotFoundError:
            pass
        _rmtree(self.path(container_id))

    def load(self, container_id: str) -> ContainerState:
        from paracell.jsonfile import read_regular

        if not self.is_container_dir(container_id):
            raise NotExistError(container_id)
        try:
            raw = read_regular(self.path(container_id, STATE_FILE), MAX_STATE_BYTES,
                               follow=False)
            if len(raw) > MAX_STATE_BYTES:
                raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            state = ContainerState(**data)
            _check_loaded(state, container_id)
        except FileNotFoundError:
            raise NotExistError(container_id) from None
        except (ValueError, TypeError, RecursionError, ParacellError) as err:
            raise CorruptStateError(container_id, err) from None
        state.status = st.settle(state.status, lambda: shim_alive(state),
                                 lambda: same_process(state.creator_pid, state.creator_start))
        return state

    def _write(self, path: str, state: ContainerState) -> None:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(state.as_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def save(self, state: ContainerState) -> None:
        self._write(self.path(state.id, STATE_FILE), state)

    def locked(self, container_id: str) -> ContainerLock:
        """Serialises verbs on one container."""
        return ContainerLock(self, container_id)

    def list_ids(self) -> list[str]:
        try:
            names = os.listdir(self.root)
            return sorted(n for n in names if not n.startswith(_NEW_PREFIX)
                          and stat.S_ISDIR(os.lstat(os.path.join(self.root, n)).st_mode)
                          and os.path.lexists(os.path.join(self.root, n, STATE_FILE)))
        except OSError as err:
            if err.errno == errno.ENOENT:
                return []
            raise
