"""A private libvirt daemon for the tests, from Debian's packages.

libvirtd runs in a mount namespace of its own, a slave of the host's, where
its configuration, run, state, cache and log directories are bind mounts of
directories in BASE; its sockets and log are in BASE too. Nothing outside
BASE is touched. /run there is a tmpfs of its own, so that /run/libvirt can
be a mount point without one on the host: a host directory made for it and
removed again, as before, detached the /run/libvirt of every other private
daemon bound to it (a concurrent test session's), which then wrote into the
host's /run/libvirt.

The host's mounts here are private, so a mount made after the daemon started
(a RAM tmpfs, a share's bind mounts) would not reach it or its QEMUs. BASE
is therefore a shared bind mount of itself: everything a libvirt test mounts
lives under it (`workdir`) and propagates to the daemon and to each QEMU's
own namespace. On a systemd host "/" is shared and this is the default.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LIBVIRTD = "/usr/sbin/libvirtd"
VIRTLOGD = "/usr/sbin/virtlogd"
# Bound over these, in the daemon's namespace only.
PRIVATE_DIRS = {"etc": "/etc/libvirt", "run": "/run/libvirt", "lib": "/var/lib/libvirt",
                "cache": "/var/cache/libvirt", "log": "/var/log/libvirt"}
# The settings ParaCell needs (docs/libvirt.md), by name: a test leaves one
# out to make a daemon set up as Debian installs it.
SETTINGS = {
    # QEMU keeps its capabilities: its 9p server needs chown, fowner,
    # dac_override and the like to keep the container's owners and modes.
    "clear_emulator_capabilities": "clear_emulator_capabilities = 0\n",
    # The QEMU log goes straight to a file: no virtlogd to start.
    "stdio_handler": 'stdio_handler = "file"\n',
    # libvirt checks that QEMU's user can open /dev/kvm, and on a miss throws
    # its capability cache away on every call and probes QEMU again (seconds
    # each under TCG). This host's /dev/kvm is root's alone (0600), so QEMU's
    # user is root, as each domain's static DAC label says anyway.
    "user": 'user = "root"\ngroup = "root"\n',
}
QEMU_CONF = "".join(SETTINGS.values())
START_TIMEOUT_S = 30.0


def missing() -> str | None:
    """Why no private daemon can run here, or None."""
    if not os.path.exists(LIBVIRTD):
        return f"{LIBVIRTD} is not installed (Debian's libvirt-daemon-system)"
    try:
        import libvirt  # noqa: F401
    except ImportError:
        return "libvirt-python is not installed"
    for target in PRIVATE_DIRS.values():
        if not target.startswith("/run/") and not os.path.isdir(target):
            return f"{target} is missing (Debian's libvirt-daemon-system)"
    return None


class PrivateLibvirtd:
    def __init__(self, base: Path, qemu_conf: str = QEMU_CONF, virtlogd: bool = False) -> None:
        """virtlogd: also run a virtlogd of its own, in its namespace, for a
        qemu.conf that sends QEMU's output to one."""
        self.base = base
        self.qemu_conf, self.virtlogd = qemu_conf, virtlogd
        self.sock_dir = base / "sock"
        self.workdir = base / "work"
        self.log = base / "libvirtd.log"
        self.pid_file = base / "libvirtd.pid"
        self.proc: subprocess.Popen[bytes] | None = None
        self._mounted = False

    @property
    def uri(self) -> str:
        return f"qemu:///system?socket={self.sock_dir}/libvirt-sock"

    def _configure(self) -> None:
        for name in PRIVATE_DIRS:
            (self.base / name).mkdir(parents=True, exist_ok=True)
        etc = self.base / "etc"
        shutil.copytree("/etc/libvirt", etc, symlinks=True, dirs_exist_ok=True)
        # No network of libvirt's own is started: no bridge, no dnsmasq, no iptables.
        for autostart in etc.glob("**/autostart"):
            shutil.rmtree(autostart)
        (etc / "qemu.conf").write_text(self.qemu_conf)
        self.sock_dir.mkdir(mode=0o700)
        self.workdir.mkdir()
        (self.base / "libvirtd.conf").write_text(
            f'unix_sock_dir = "{self.sock_dir}"\n'
            'unix_sock_rw_perms = "0700"\n'
            'auth_unix_rw = "none"\nauth_unix_ro = "none"\n'
            f'log_outputs = "3:file:{self.log}"\n')

    def start(self) -> None:
        self._configure()
        subprocess.run(["mount", "--bind", str(self.workdir), str(self.workdir)], check=True)
        self._mounted = True
        subprocess.run(["mount", "--make-shared", str(self.workdir)], check=True)
        self._spawn()

    def _spawn(self) -> None:
        binds = "; ".join(f"mount --bind {self.base / name} {target}"
                          for name, target in PRIVATE_DIRS.items())
        logd = (f"{VIRTLOGD} --pid-file {self.base / 'virtlogd.pid'} & "
                f"echo $! > {self.base / 'virtlogd.pid'}; ") if self.virtlogd else ""
        script = (f"set -e; mount -t tmpfs -o mode=0755,size=1m paracell-test-run /run; "
                  f"mkdir /run/libvirt; {binds}; {logd}exec {LIBVIRTD} --config "
                  f"{self.base / 'libvirtd.conf'} --pid-file {self.pid_file}")
        with open(self.base / "daemon.out", "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.reaper", "unshare",
                                          "--mount", "--propagation", "slave", "sh", "-c", script],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         start_new_session=True, cwd=REPO)
        self.wait_ready()

    def wait_ready(self) -> None:
        import libvirt

        # Refused connections while it starts are expected: not printed.
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"libvirtd exited: {(self.base / 'daemon.out').read_text()}")
            try:
                libvirt.open(self.uri).close()
                if not self.virtlogd or (self.base / "run" / "virtlogd-sock").exists():
                    return
            except libvirt.libvirtError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"libvirtd did not answer at {self.uri} in {START_TIMEOUT_S:.0f} s")

    def restart(self) -> None:
        """Stops the daemon and starts it again, as `systemctl restart` would:
        the domains' QEMUs keep running, and the new daemon finds them."""
        self._stop_daemon()
        self._spawn()

    def _stop_daemon(self) -> None:
        if self.virtlogd:
            try:
                os.kill(int((self.base / "virtlogd.pid").read_text().split()[0]), signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                pass
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def domains(self) -> list[str]:
        import libvirt

        conn = libvirt.open(self.uri)
        try:
            return [d.name() for d in conn.listAllDomains()]
        finally:
            conn.close()

    def stop(self) -> None:
        import libvirt

        if self.proc is not None and self.proc.poll() is None:
            try:
                conn = libvirt.open(self.uri)
                for dom in conn.listAllDomains():
                    dom.destroy()
                conn.close()
            except libvirt.libvirtError:
                pass
        self._stop_daemon()
        if self._mounted:
            subprocess.run(["umount", "-R", "-l", str(self.workdir)], capture_output=True)
