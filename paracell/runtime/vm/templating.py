"""A sandbox's VM from a template, and a template from a VM that booted cold
(paracell/vmm/templatestore.py, docs/templates.md).

The shim asks here for its VM. If the store holds a template of the VM's
shape, the new QEMU waits for it (`-incoming defer`) on its RAM, mapped
copy-on-write (or copied: settings.template_ram), loads its device state
and runs on from the agent's READY: the SANDBOX that follows makes it this
sandbox's. Otherwise the VM boots cold, and once its agent is READY, before
anything of the sandbox reaches it, it is saved as the template for the next
create.

Nothing here may fail a create: a template that cannot be used is logged
in one line, removed, and the VM boots cold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paracell.errors import ParacellError
from paracell.runtime.vm.vmplan import PlannedVm
from paracell.vmm import memory, templatestore
from paracell.vmm.builder import Vm
from paracell.vmm.hypervisor import Hypervisor

ANNOTATION = "io.paracell.template"
SWITCH = {"on": True, "off": False}


def wanted(no_template_flag: bool, annotations: dict[str, str]) -> bool:
    """The annotation wins for its container, then --no-template, then the
    operator's setting ("templates" in /etc/paracell/config.json)."""
    from paracell import settings

    value = annotations.get(ANNOTATION)
    if value is not None:
        if value not in SWITCH:
            raise ParacellError(f"invalid annotation {ANNOTATION}={value[:32]!r}: expected on "
                                "or off")
        return SWITCH[value]
    return not no_template_flag and settings.templates_default()


@dataclass
class Slot:
    """Where this VM's template goes, or comes from."""

    store: templatestore.TemplateStore
    key: str
    shape: dict[str, Any]


class Templating:
    """One VM's use of the template store, in the shim."""

    def __init__(self, vm: PlannedVm, hypervisor: Hypervisor,
                 launch: Callable[[bool], Vm], log: Callable[[str], None],
                 debug: Callable[[str], None]) -> None:
        self.vm, self.hypervisor, self._launch = vm, hypervisor, launch
        self._log, self._debug = log, debug
        self.slot: Slot | None = None
        self.outcome = ""  # "restored KEY" or "saved KEY": what this VM did

    def restore(self) -> Vm | None:
        """The VM restored and running, or None: boot it cold (and save it)."""
        store = templatestore.store()
        try:
            store.pin()
        except (OSError, ParacellError) as err:
            self._log(f"templates: the store cannot be opened ({err}); booting cold")
            return None
        try:
            shape = self.vm.builder.shape()
        except (OSError, ParacellError) as err:
            self._log(f"templates: the VM's shape cannot be read ({err}); booting cold")
            return None
        self.slot = Slot(store, templatestore.key_of(shape), shape)
        try:
            found = store.find(self.slot.key, shape)
        except (OSError, ParacellError) as err:
            return self._discard(f"template {self.slot.key} cannot be used: {err}")
        if found is None:
            self._debug(f"no template {self.slot.key} yet: booting cold")
            return None
        began = time.monotonic()
        vm = None
        try:
            self._arm(found)
            vm = self._launch(True)
            launched = time.monotonic()
            self.hypervisor.restore(found.state_fd)
            self.hypervisor.resume()
        except (OSError, ParacellError) as err:
            self._end(vm)
            return self._discard(f"restoring from template {found.key} failed: {err}")
        finally:
            found.close()
        # The slot stays until the guest has answered the SANDBOX (attached).
        self.outcome = f"restored {found.key}"
        how = "RAM shared" if self.vm.ram.copy_on_write else "RAM copied"
        self._debug(f"restored from template {found.key} in "
                    f"{time.monotonic() - began:.3f} s ({how} and QEMU started in "
                    f"{launched - began:.3f} s)")
        return vm

    def attached(self) -> None:
        """The restored guest answered the SANDBOX: the template is good."""
        if self.outcome.startswith("restored "):
            self.slot = None

    def abandon(self, vm: Vm, why: ParacellError) -> None:
        """A restored VM that failed before its SANDBOX reply: it goes, the
        template goes, and the caller boots cold (and saves it anew)."""
        self._end(vm)
        self.outcome = ""
        self._discard(f"the VM restored from template {self.slot.key if self.slot else '?'} "
                      f"failed before its sandbox was attached: {why}")

    def _end(self, vm: Vm | None) -> None:
        if vm is not None:
            vm.kill()
            vm.stop(5)
            vm.release()
        self._disarm()

    def _discard(self, why: str) -> None:
        assert self.slot is not None
        self._log(f"{why}; booting cold, and making it again")
        try:
            self.slot.store.remove(self.slot.key)
        except OSError as err:
            self._log(f"template {self.slot.key}: not removed: {err.strerror}")
        return None

    def _arm(self, found: templatestore.Template) -> None:
        """The devices start from the template: its RAM, its NICs' MACs."""
        if found.shareable and self._shares_ram():
            found.check_ram()
            self.vm.ram.shared_from = found.ram_fd
        else:
            self.vm.ram.fill = found.copy_ram
        if self.vm.nics is not None:
            self.vm.nics.device_macs = found.macs

    def _shares_ram(self) -> bool:
        """Copy-on-write RAM, unless told otherwise or unless something else
        needs a RAM file of the VM's own: snapshot mode's checkpoints read and
        rewrite it, and QEMU 7.2's balloon would punch a discarded page out of
        the file a private mapping maps, the template's own. Under TCG only:
        the plugin that serves the Pager is TCG's (docs/templates.md)."""
        from paracell import settings

        try:
            shared = settings.template_ram() == "shared"
        except ParacellError as err:
            self._log(f"templates: {err}; copying the template's RAM")
            shared = False
        config = self.vm.config
        return shared and self.vm.rootdisk is None and config.memory_manager != "balloon" \
            and config.engine == "tcg"

    def _disarm(self) -> None:
        self.vm.ram.fill = None
        self.vm.ram.shared_from = -1
        if self.vm.nics is not None:
            self.vm.nics.device_macs = None

    def save(self) -> None:
        """At READY, on a VM that booted cold: saves it as its shape's
        template, unless another create is saving it. The VM runs on."""
        slot, self.slot = self.slot, None
        if slot is None:
            return
        ram, nics = self.vm.ram, self.vm.nics
        capture = templatestore.Capture(
            save_state=self.hypervisor.save, ram=ram.path, ram_bytes=ram.size_mib << 20,
            macs=nics.macs() if nics is not None else [],
            shareable=memory.plugin_loads(self.vm.builder.machine.qemu))
        began = time.monotonic()
        try:
            saved = slot.store.save(slot.key, slot.shape, capture)
        except (OSError, ParacellError) as err:
            self._log(f"template {slot.key} not saved: {err}")
            saved = None
        finally:
            # Saving stops the vCPUs; whatever happened, the VM goes on.
            self.hypervisor.resume()
        if saved is not None:
            self.outcome = f"saved {saved.key}"
            self._debug(f"saved template {slot.key} in {time.monotonic() - began:.3f} s")

