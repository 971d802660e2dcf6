"""Guest artifacts: the kernel, the agent and the initramfs, built once per input hash."""
