"""`pause` and `resume`: the whole VM stops and goes on, through its hypervisor."""

from __future__ import annotations

from paracell.runtime.context import Context
from paracell.runtime.state import status
from paracell.vmm import backends


def _set_paused(ctx: Context, container_id: str, paused: bool) -> None:
    store = ctx.store
    with store.locked(container_id):
        state = store.load(container_id)
        target = status.transition("pause" if paused else "resume", state.status, container_id)
        vmm = backends.hypervisor_of(state.vm.config)
        if paused:
            vmm.pause()
        else:
            vmm.resume()
        state.status = target
        store.save(state)


def pause(ctx: Context, container_id: str) -> None:
    _set_paused(ctx, container_id, True)


def resume(ctx: Context, container_id: str) -> None:
    _set_paused(ctx, container_id, False)
