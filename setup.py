"""Only here because cffi_modules and a hand-written script are setup() keywords,
and because QEMU's Pager plugin is a plain shared object, not a Python module."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

# csrc/ramplugin.c: loaded by QEMU (-plugin) for copy-on-write guest RAM, never imported.
PLUGIN = "paracell/_qemu_ram_plugin.so"
PLUGIN_SOURCES = ["csrc/ramplugin.c", "csrc/pager.c", "csrc/dirtylog.c"]
# csrc/relayexec.c: what exec and pod-member proxies exec into once their
# process runs (paracell/runtime/agent/channel.py: exec_relay).
# csrc/vmshimexec.c: what a VM's shim execs into once its container's process
# is created (paracell/runtime/vm/shim.py: become_native).
RELAY = "paracell/paracell-relay"
VMSHIM = "paracell/paracell-vmshim"
RELAY_LIBRARY = ["csrc/relay.c", "csrc/sink.c", "csrc/streams.c", "csrc/portfwd.c",
                 "csrc/execargs.c", "csrc/latenet.c"]
EXECUTABLES = {RELAY: "csrc/relayexec.c", VMSHIM: "csrc/vmshimexec.c"}
FLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]


class BuildExtAndPlugin(build_ext):
    def run(self) -> None:
        super().run()
        target = Path(PLUGIN) if self.inplace else Path(self.build_lib) / PLUGIN
        objects = self.compiler.compile(
            PLUGIN_SOURCES, output_dir=self.build_temp, include_dirs=["proto", "csrc"],
            extra_preargs=["-fPIC", "-fvisibility=hidden"], extra_postargs=FLAGS)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.compiler.link_shared_object(objects, str(target), libraries=["pthread"])
        library = self.compiler.compile(
            RELAY_LIBRARY, output_dir=str(Path(self.build_temp) / "relay"),
            include_dirs=["proto", "csrc"], extra_preargs=["-fPIE"], extra_postargs=FLAGS)
        for name, main in EXECUTABLES.items():
            target = Path(name) if self.inplace else Path(self.build_lib) / name
            objects = self.compiler.compile(
                [main], output_dir=str(Path(self.build_temp) / "relay"),
                include_dirs=["proto", "csrc"], extra_preargs=["-fPIE"], extra_postargs=FLAGS)
            self.compiler.link_executable(objects + library, target.name,
                                          output_dir=str(target.parent), extra_preargs=["-pie"])


setup(cffi_modules=["csrc/build_native.py:ffibuilder", "csrc/build_seccomp.py:ffibuilder",
                    "csrc/build_linux.py:ffibuilder"],
      cmdclass={"build_ext": BuildExtAndPlugin},
      scripts=["bin/paracell", "bin/containerd-shim-paracell-v2"])
