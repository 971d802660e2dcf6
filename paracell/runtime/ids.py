"""Container IDs: runc's rules, because IDs become directory names."""

import re

from paracell.errors import ParacellError

_VALID = re.compile(r"[\w+.-]{1,255}", re.ASCII)


def check_id(container_id: str) -> str:
    if not container_id:
        raise ParacellError("container id cannot be empty")
    if container_id in (".", "..") or not _VALID.fullmatch(container_id):
        raise ParacellError(f"invalid container id format: {container_id}")
    return container_id
