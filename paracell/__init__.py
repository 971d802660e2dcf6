"""ParaCell: an OCI runtime that runs every container in its own QEMU micro-VM."""

__version__ = "0.1.0"
OCI_VERSION = "1.0.2"
