"""An OCI image layout, tarred, made offline from a directory: what `ctr
images import` takes. The tests and `bench shim` give containerd their
busybox and pause images this way (these machines reach no registry)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

DEFAULT_NAME = "localhost/bb:latest"


def _layer_tar(rootfs: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(rootfs.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(rootfs)), recursive=False)
    return buf.getvalue()


def _blob(blobs: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def oci_image_tar(rootfs: Path, out: Path, name: str = DEFAULT_NAME,
                  cmd: tuple[str, ...] = ("/bin/sh",)) -> Path:
    """An OCI image layout, tarred, as `ctr images import` takes it."""
    layout = out.with_suffix(".d")
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layer = _layer_tar(rootfs)
    layer_desc = _blob(blobs, gzip.compress(layer, mtime=0))
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": list(cmd), "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    config_desc = _blob(blobs, json.dumps(config).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_desc}],
    }
    manifest_desc = _blob(blobs, json.dumps(manifest).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_desc,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": "latest"},
        }],
    }
    (layout / "index.json").write_text(json.dumps(index))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    with tarfile.open(out, "w") as tar:
        for path in sorted(layout.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(layout)), recursive=False)
    return out


