"""Only here because cffi_modules and a hand-written script are setup() keywords."""

from setuptools import setup

setup(cffi_modules=["csrc/build_native.py:ffibuilder", "csrc/build_seccomp.py:ffibuilder",
                    "csrc/build_linux.py:ffibuilder"],
      scripts=["bin/paracell"])
