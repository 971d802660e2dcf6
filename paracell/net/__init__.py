"""Container networking for the VM: the network namespace the shim joins
(netns.py), the interfaces found there (discover.py), the TAPs (tap.py) and
tc mirroring (mirror.py) behind each virtio-net device (device.py), and the
records that tell the agent how to configure them (guestconfig.py).
See docs/networking.md."""
