"""Text constants of proto/ (names the guest looks for), as Python strings.
Integer constants need no help: they are `paracell._native.lib.PC_*`."""

from __future__ import annotations


def text(name: str) -> str:
    from paracell._native import ffi, lib

    return ffi.string(getattr(lib, name)).decode()
