"""Only here because cffi's extension hook (cffi_modules) is a setup() keyword."""

from setuptools import setup

setup(cffi_modules=["csrc/build_native.py:ffibuilder"])
