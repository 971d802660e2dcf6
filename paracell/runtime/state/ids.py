"""Container IDs: runc's rules, because IDs become directory names."""

from paracell.errors import ParacellError

# runc's [\w+.-]+ in ASCII; a set test keeps `re` off the fast CLI path.
_ALLOWED = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+.-")
MAX_ID_LENGTH = 255


def check_id(container_id: str) -> str:
    if not container_id:
        raise ParacellError("container id cannot be empty")
    if (container_id in (".", "..") or len(container_id) > MAX_ID_LENGTH
            or not _ALLOWED.issuperset(container_id)):
        raise ParacellError(f"invalid container id format: {container_id}")
    return container_id
