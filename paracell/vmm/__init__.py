"""Host side of the micro-VM: probe, QEMU command line, QMP, RAM backing."""
