#!/usr/bin/env bash
# Builds the ParaCell guest kernel from Debian's linux-source-6.1.
# usage: build.sh SOURCE_TARBALL OUT_DIR
# Writes OUT_DIR/bzImage and OUT_DIR/config. The caller picks OUT_DIR from a
# hash of every input, so this script never has to decide about staleness.
set -euo pipefail
tarball=$1
out=$2
guest_dir=$(cd "$(dirname "$0")/.." && pwd)
jobs=${PARACELL_BUILD_JOBS:-$(nproc)}

work="$out.work"
rm -rf "$work"
mkdir -p "$work/src"
echo "paracell: unpacking $tarball" >&2
tar -xf "$tarball" -C "$work/src" --strip-components=1

cd "$work/src"
{ grep -v -E '^\s*(#|$)' "$guest_dir/kernel/series" || true; } | while read -r patch; do
    echo "paracell: applying $patch" >&2
    patch -p1 --forward --batch < "$guest_dir/$patch"
done

# Formats shared with the host have one definition, in proto/; the drivers
# that speak them get a copy at build time.
cp "$guest_dir/../proto/pager_proto.h" drivers/misc/paracell/

fragment="$guest_dir/kernel/paracell.config"
# The guest has no module loader (tinyconfig leaves CONFIG_MODULES off), so an
# `=m` line can never take effect; say why instead of "not applied" below.
if grep -nE '^CONFIG_[A-Z0-9_]+=m$' "$fragment" >&2; then
    echo "paracell: the guest loads no modules: build these in (=y)" >&2
    exit 1
fi
make -s ARCH=x86_64 tinyconfig
scripts/kconfig/merge_config.sh -m -O . .config "$fragment" >/dev/null
make -s ARCH=x86_64 olddefconfig

# merge_config only warns when Kconfig drops an option; a silently missing
# feature would surface much later as a confusing guest failure.
missing=0
while read -r line; do
    if ! grep -qx -- "$line" .config; then
        echo "paracell: kernel option not applied: $line" >&2
        missing=1
    fi
done < <(grep -E '^CONFIG_' "$fragment")
# An option the fragment turns off must stay off: a `select` elsewhere can
# quietly turn it back on.
while read -r _ option _; do
    if grep -qE "^${option}=" .config; then
        echo "paracell: kernel option still enabled: $option" >&2
        missing=1
    fi
done < <(grep -E '^# CONFIG_[A-Z0-9_]+ is not set' "$fragment")
[ "$missing" = 0 ] || exit 1

echo "paracell: compiling the kernel with $jobs jobs (a few minutes)" >&2
# Not silent: Kbuild's "  CC      kernel/fork.o" lines are what the caller
# (paracell/guest/buildprogress.py) counts to show progress.
make ARCH=x86_64 -j"$jobs" bzImage
mkdir -p "$out"
cp arch/x86/boot/bzImage "$out/bzImage.tmp" && mv "$out/bzImage.tmp" "$out/bzImage"
cp .config "$out/config"
cd /
rm -rf "$work"
echo "paracell: kernel ready: $out/bzImage" >&2
