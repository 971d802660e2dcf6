"""Container images the project builds itself from Debian's packages."""

from paracell.images.debian import debian_rootfs, image_key

__all__ = ["debian_rootfs", "image_key"]
