"""Sandboxes and containers: the VM, the host processes that stand for the
container, and the channel to the guest agent."""
