"""The CLI's global options, their one definition: cli.py makes click's
options from this table, and fastpath.py splits them off a command line
without click. Plain tuples: `state` and `kill` read it on every poll.

Each row: the option, its parameter name, whether it takes a value, whether
the fast path may serve a call that uses it (podman passes its runtime
flags to every verb, and those that only matter to create, or say where
the state is, leave state and kill as they are), which list of words it
takes ("engines", "memory managers", "backends" or ""), its default, its
help ("" hides it).
"""

from __future__ import annotations

from paracell.settings import DEFAULT_ROOT

OPTIONS: tuple[tuple[str, str, bool, bool, str, object, str], ...] = (
    ("--root", "root", True, True, "", DEFAULT_ROOT, "state directory"),
    ("--log", "log_path", True, True, "", None, "log file (default: stderr only)"),
    ("--log-format", "log_format", True, True, "log formats", "text", "format of --log"),
    ("--debug", "debug", False, True, "", False, "log debug messages"),
    ("--systemd-cgroup", "systemd_cgroup", False, True, "", False,
     "cgroupsPath is slice:prefix:name (needs systemd as PID 1)"),
    ("--rootless", "rootless", True, False, "", "auto", ""),
    ("--criu", "criu", True, False, "", None, ""),
    ("--engine", "engine", True, False, "engines", None,
     "accelerator; default auto, or $PARACELL_ENGINE"),
    ("--memory-manager", "memory_manager", True, False, "memory managers", None,
     "guest memory handling; default pager, or $PARACELL_MEMORY_MANAGER"),
    ("--no-template", "no_template", False, True, "", False,
     "boot every VM cold, never from a VM template (docs/templates.md)"),
    ("--vmm", "vmm", True, True, "backends", None,
     "who runs the VM (default qemu), or $PARACELL_VMM (docs/libvirt.md)"),
    ("--libvirt-uri", "libvirt_uri", True, True, "", None,
     "where a daemon backend is (libvirt's URI; default qemu:///system), or "
     "$PARACELL_LIBVIRT_URI"),
)
LOG_FORMATS = ("text", "json")

VALUED = frozenset(row[0] for row in OPTIONS if row[2])
FLAGS = frozenset(row[0] for row in OPTIONS if not row[2])
FAST = frozenset(row[0] for row in OPTIONS if row[3])
