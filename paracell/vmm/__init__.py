"""Host side of the micro-VM: the probe, the VM builder and its devices, RAM
backing, templates, and the backends that run it (qemu/, libvirt/), behind
hypervisor.py's interface."""
