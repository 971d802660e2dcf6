"""Where ParaCell keeps its files, and the environment knobs that move them."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_ROOT = "/run/paracell"
# containerd's shim v2 (paracell/shimv2/): its containers' state, one root
# per containerd namespace, and the shims' sockets.
SHIM_ROOT = "/run/paracell/containerd"


def shim_root() -> str:
    """`paracell --root SHIM_ROOT/NAMESPACE list` shows what the shim v2 made;
    `$PARACELL_SHIM_ROOT` moves it (a test's private containerd)."""
    return os.environ.get("PARACELL_SHIM_ROOT") or SHIM_ROOT


SYSTEM_CACHE = "/var/lib/paracell/guest"
SYSTEM_TEMPLATES = "/var/lib/paracell/templates"


def cache_dir() -> Path:
    """Guest artifacts live outside the repo, keyed by content, shared by checkouts.

    For root the default is a system path: containerd's CRI plugin starts
    runtimes with an environment stripped to PATH, HOME and LANG, and HOME
    need not be root's, so nothing here may depend on it."""
    from pathlib import Path

    override = os.environ.get("PARACELL_CACHE")
    if override:
        return Path(override)
    if os.geteuid() == 0:
        return Path(SYSTEM_CACHE)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "paracell"


def template_dir() -> Path:
    """Saved VMs that creates restore instead of booting (paracell/vmm/templatestore.py):
    for root a system path, as the guest cache, else the user's cache."""
    from pathlib import Path

    override = os.environ.get("PARACELL_TEMPLATES")
    if override:
        return Path(override)
    if os.geteuid() == 0:
        return Path(SYSTEM_TEMPLATES)
    return cache_dir() / "templates"


def rootdisk_dir() -> Path:
    """Snapshot mode's rootfs images (paracell/images/rootdisk.py), beside the
    guest artifacts; `$PARACELL_ROOTDISKS` moves them."""
    from pathlib import Path

    override = os.environ.get("PARACELL_ROOTDISKS")
    return Path(override) if override else cache_dir() / "rootdisks"


SYSTEM_VET_CACHE = "/var/lib/paracell/xgate-vet"


def vet_cache_dir() -> Path:
    """XGates verdicts of files already vetted (paracell/xgate/vetcache.py).
    A verdict there lets a file into a VM unscanned, so for root it is a
    system path no user can write, as the templates, never one under
    $PARACELL_CACHE or $HOME; `$PARACELL_VET_CACHE` moves it."""
    from pathlib import Path

    override = os.environ.get("PARACELL_VET_CACHE")
    if override:
        return Path(override)
    if os.geteuid() == 0:
        return Path(SYSTEM_VET_CACHE)
    return cache_dir() / "xgate-vet"


def memory_dir() -> Path:
    """Guest RAM files must sit on tmpfs: on disk every guest write would be written back."""
    from pathlib import Path

    return Path(os.environ.get("PARACELL_MEMORY_DIR", "/dev/shm/paracell"))


# The values of the knobs that take a word, their one definition (the CLI's
# choices, the probe and the memory manager read them here). The backends'
# names are the registry's (paracell/vmm/backends.py), which reads the knob
# through `choice`.
ENGINES = ("auto", "kvm", "tcg")
MEMORY_MANAGERS = ("pager", "balloon", "none")

CONFIG_FILE = "/etc/paracell/config.json"
# Every key the file takes, with its type. docs/runtime.md lists them
# (tests/unit/test_settings.py holds the two to each other).
CONFIG_KEYS: dict[str, type] = {"engine": str, "guest_memory_mib": int, "memory_manager": str,
                                "pod_memory_mib": int, "templates": bool, "template_ram": str,
                                "warm_pool": bool, "xgates": bool,
                                "vmm": str, "libvirt_uri": str}
MAX_CONFIG_FILE = 65536
# Parsed once per process, unless the file changes: every getter asks.
_loaded: tuple[tuple[object, ...], dict[str, object]] | None = None


def config_path() -> str:
    return os.environ.get("PARACELL_CONFIG", CONFIG_FILE)


def file_config() -> dict[str, object]:
    """Operator settings for callers that cannot pass flags (containerd, podman):
    a JSON object in $PARACELL_CONFIG or /etc/paracell/config.json. The
    environment wins over the file, and flags over both. Only the verbs that
    use a setting read the file, so a bad one fails `create` in one line and
    never `state`, `kill`, `list` or `delete`."""
    global _loaded
    path = config_path()
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {}
    except OSError:
        st = None  # _read_config names the error
    key = (path, st and (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
    if _loaded is None or _loaded[0] != key:
        _loaded = (key, _read_config(path))
    return _loaded[1]


def _read_config(path: str) -> dict[str, object]:
    from paracell.errors import ParacellError
    from paracell.jsonfile import parse_json, read_regular

    try:
        raw = read_regular(path, MAX_CONFIG_FILE)
    except FileNotFoundError:
        return {}
    if len(raw) > MAX_CONFIG_FILE:
        raise ParacellError(f"{path}: larger than {MAX_CONFIG_FILE} bytes")
    data = parse_json(raw, path)
    if not isinstance(data, dict):
        raise ParacellError(f"{path}: expected a JSON object")
    for key, value in data.items():
        kind = CONFIG_KEYS.get(key)
        # bool is an int in Python: only a bool key takes true/false.
        if kind is None or not isinstance(value, kind) or (isinstance(value, bool)
                                                           and kind is not bool):
            raise ParacellError(f"{path}: unknown or mistyped setting {key[:64]!r}")
    return data


def engine_override() -> str | None:
    return choice("PARACELL_ENGINE", "engine", ENGINES, "engine")


def memory_manager_override() -> str | None:
    return choice("PARACELL_MEMORY_MANAGER", "memory_manager", MEMORY_MANAGERS, "memory manager")


def libvirt_uri_override() -> str | None:
    """The libvirt daemon's URI from the environment, else the file (checked
    where it is used: paracell/vmm/libvirt/connection.py)."""
    return os.environ.get("PARACELL_LIBVIRT_URI") or str(file_config().get("libvirt_uri") or "") \
        or None


def choice(variable: str, key: str, choices: tuple[str, ...], what: str) -> str | None:
    """The setting from the environment, else the file; an error names where
    the bad value came from."""
    from paracell.errors import ParacellError

    if os.environ.get(variable):
        value, where = os.environ[variable], f"${variable}"
    else:
        value, where = str(file_config().get(key) or ""), f'"{key}" in {config_path()}'
    if not value:
        return None
    if value not in choices:
        raise ParacellError(f"{where}: unknown {what} {value[:32]!r}: expected one of "
                            f"{', '.join(choices)}")
    return value


def guest_memory_mib() -> int:
    return _memory_mib("PARACELL_GUEST_MEMORY_MIB", "guest_memory_mib", 256)


def pod_memory_mib() -> int:
    """A pod VM holds every container of the pod; with the Pager, RAM the pod
    does not touch costs the host nothing, so the default is generous."""
    return _memory_mib("PARACELL_POD_MEMORY_MIB", "pod_memory_mib", 512)


def _memory_mib(variable: str, key: str, default: int) -> int:
    """The setting from the environment, else the file, else the default;
    an error names where the bad value came from."""
    from paracell.errors import ParacellError

    if os.environ.get(variable):
        raw: object = os.environ[variable]
        where = f"${variable}"
    else:
        raw, where = file_config().get(key, default), f'"{key}" in {config_path()}'
    try:
        value = int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ParacellError(f"{where}: guest memory must be a number of MiB, not "
                            f"{str(raw)[:32]!r}") from None
    if not 64 <= value <= 65536:
        raise ParacellError(f"{where}: guest memory of {value} MiB is outside 64..65536")
    return value


def xgates_default() -> bool:
    """XGates for containers whose bundle does not say (io.paracell.xgates)."""
    return file_config().get("xgates") is True


TEMPLATE_RAM = ("shared", "copied")


def template_ram() -> str:
    """How a VM restored from a template holds its RAM: "shared" maps the
    template's pages copy-on-write (the default), "copied" gives each VM a
    copy of its own, as before (docs/templates.md)."""
    return choice("PARACELL_TEMPLATE_RAM", "template_ram", TEMPLATE_RAM,
                  "template RAM mode") or "shared"


def warm_pool_enabled() -> bool:
    """Whether creates take VMs from a warm pool that serves their root, and
    `pool serve` may run (docs/pool.md): on unless the file says false."""
    return file_config().get("warm_pool") is not False


def templates_default() -> bool:
    """Whether creates restore from VM templates unless told otherwise
    (--no-template, io.paracell.template): on unless the file says false."""
    return file_config().get("templates") is not False
