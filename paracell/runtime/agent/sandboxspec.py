"""The SANDBOX message: what makes a booted VM one sandbox's, sent once after
READY and before any container (docs/agent-protocol.md). Each device says
what the guest attaches for it (Device.sandbox_records: its share, its
interfaces); to that come the VM's hostname, the host's wall clock, and
fresh entropy, so that no two sandboxes share the guest's random state even
when they come from one saved VM."""

from __future__ import annotations

import os
import time

from paracell import speckeys as K

TYPE_CHECKING = False
if TYPE_CHECKING:
    from paracell.vmm.builder import VmBuilder

# Bytes of fresh entropy per sandbox: a full reseed of the guest's CRNG is
# 32 bytes; the rest is margin, well under PC_SANDBOX_ENTROPY_MAX.
ENTROPY_BYTES = 64


def clock_record(now_ns: int) -> tuple[str, str]:
    return (K.CLOCK, f"{now_ns // 1_000_000_000}.{now_ns % 1_000_000_000:09d}")


def payload(vm: VmBuilder, hostname: str) -> bytes:
    """Built at the moment it is sent: the clock is read last."""
    records = vm.sandbox_records()
    # The VM's own name, for what runs outside a UTS namespace of its own;
    # the container's comes with its SPEC, whatever bytes the spec gave it.
    if hostname and hostname.isascii() and hostname.isprintable():
        records.append((K.HOSTNAME, hostname))
    records.append((K.ENTROPY, os.urandom(ENTROPY_BYTES).hex()))
    records.append(clock_record(time.time_ns()))
    return K.encode(records)
