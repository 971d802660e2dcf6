"""Whether a libvirt daemon can run ParaCell's domains: its setup
(hostsetup.py) and its QEMU's features (features.py), checked by `create`
before any domain exists and shown by `paracell check`."""

from __future__ import annotations

from typing import Any

from paracell.errors import ParacellError
from paracell.vmm.libvirt import connection, hostsetup
from paracell.vmm.libvirt.features import probe


def require(uri: str, qemu: str, engine: str, memory_dir: str) -> None:
    """One line naming the first thing missing, setup first: a daemon whose
    QEMU user cannot open /dev/kvm answers each capabilities call slowly.
    What cannot be verified passes (`paracell check` shows it)."""
    conn = connection.open_uri(uri)
    try:
        for feature in hostsetup.findings(conn, uri, engine, memory_dir):
            if feature.present is False:
                raise ParacellError(feature.refusal(uri))
        for feature in probe(conn, qemu, engine):
            if not feature.present:
                raise ParacellError(feature.refusal(uri))
    finally:
        conn.close()


def report(uri: str, qemu: str | None, engine: str | None, memory_dir: str) -> dict[str, Any]:
    """For `paracell check`: reachable or why not, the version, the setup
    and each feature, and the line `create` would fail with."""
    try:
        conn = connection.open_uri(uri)
    except ParacellError as err:
        return {"uri": uri, "reachable": False, "detail": str(err)}
    try:
        version = connection.version_text(conn.getLibVersion())
        setup = list(hostsetup.findings(conn, uri, engine or "tcg", memory_dir))
        features = probe(conn, qemu, engine or "tcg") if qemu else []
    finally:
        conn.close()
    missing = next((f for f in setup + features if f.present is False), None)
    return {"uri": uri, "reachable": True, "version": version,
            "setup": [f.as_dict(uri) for f in setup],
            "features": [f.as_dict(uri) for f in features],
            "refusal": missing.refusal(uri) if missing else None}
