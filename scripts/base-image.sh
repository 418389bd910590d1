#!/bin/sh
# Build the NotebookOS base image without any image registry: debootstrap a minimal Debian root
# filesystem from Debian's package mirror and `docker import` it. Prints the image's tag.
#
# The tag carries a hash of this script, so the (slow, ~3-5 min) bootstrap runs once per machine
# and again only when the package list below changes. Needs root, debootstrap and a Docker engine.
#
#   scripts/base-image.sh                    # builds (or reuses) notebookos-base:<suite>-<hash>
#   SUITE=bookworm MIRROR=http://deb.debian.org/debian scripts/base-image.sh
set -eu

SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# What every NotebookOS container needs beyond Debian's minbase: Python 3.11 (the interpreter the
# wheels are built for) with venv, TLS roots for pip, Redis (the registry and store service of the
# compose file, from the same image since no registry is reachable) and tini as PID 1.
PACKAGES="ca-certificates python3 python3-venv redis-server tini"

here=$(cd "$(dirname "$0")" && pwd)
hash=$( (cat "$here/base-image.sh"; echo "$SUITE $MIRROR") | sha256sum | cut -c1-12)
tag="notebookos-base:$SUITE-$hash"

if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag"
    exit 0
fi
for tool in debootstrap docker; do
    command -v "$tool" >/dev/null 2>&1 || { echo "base-image: $tool is missing (scripts/system-deps.sh installs it)" >&2; exit 1; }
done
if [ "$(id -u)" != 0 ]; then
    echo "base-image: debootstrap needs root" >&2
    exit 1
fi

rootfs=$(mktemp -d "${TMPDIR:-/var/tmp}/notebookos-rootfs.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT INT TERM
echo "base-image: bootstrapping Debian $SUITE into $rootfs (a few minutes)" >&2
include=$(echo "$PACKAGES" | tr ' ' ,)
nice -n 10 debootstrap --variant=minbase --include="$include" "$SUITE" "$rootfs" "$MIRROR" >&2

# apt works in derived images; nothing else of the bootstrap is kept that an image does not need.
cat > "$rootfs/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
SOURCES
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
       "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
       "$rootfs"/usr/share/locale/* "$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old
# Redis from the image runs as a service of its own, never as a system daemon here.
rm -f "$rootfs"/etc/rc*.d/*redis*

tar -C "$rootfs" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "debootstrap --variant=minbase $SUITE + $PACKAGES" - "$tag" >&2
docker tag "$tag" "notebookos-base:$SUITE" >&2
echo "$tag"
