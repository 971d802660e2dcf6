#!/usr/bin/env bash
# Installs the Debian packages ParaCell needs; does nothing when all are present.
set -euo pipefail
packages=(
    qemu-system-x86 linux-source-6.1 busybox-static
    build-essential flex bison bc libelf-dev libssl-dev cpio xz-utils libseccomp-dev
    python3 python3-venv python3-dev
    containerd runc crun podman conmon containernetworking-plugins iptables
    iproute2 nftables conntrack socat bindfs fuse3
    mmdebstrap wrk redis-tools
    libvirt-daemon-system libvirt-dev pkg-config
    e2fsprogs libxxhash-dev qemu-utils criu libpython3.11-testsuite
)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "paracell: installing Debian packages: ${missing[*]}" >&2
if [ "$(id -u)" != 0 ]; then
    echo "paracell: run as root (apt-get install needs it)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
