#!/bin/sh
# Build the NotebookOS image without an image registry (see Dockerfile).
#
#   scripts/build-image.sh [--torch cpu|cuda|none|<pip requirement>] [--tag IMAGE]
#
#   --torch cpu   torch==2.13.0+cpu: the CPU wheel that pip finds on this machine (its find-links);
#                 the tests and machines without a GPU use it. Fails if pip cannot find it.
#   --torch cuda  torch==2.13.0 from PyPI, with its CUDA libraries (GPU VMs; several GB).
#   --torch none  no torch (the default; the kernel works without it).
#   --tag         the image to make (default notebookos:latest).
#
# The base image comes from scripts/base-image.sh (debootstrap, once per machine). Layers are
# cached by the engine: a second build after a code change reinstalls only the project. Needs
# root (or a user of the docker group), a Docker engine and, the first time, debootstrap.
set -eu

torch=none
tag=notebookos:latest
while [ $# -gt 0 ]; do
    case "$1" in
        --torch) torch=$2; shift 2 ;;
        --tag) tag=$2; shift 2 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "build-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$torch" in
    cpu) spec="torch==2.13.0+cpu" ;;
    cuda) spec="torch==2.13.0" ;;
    none) spec=none ;;
    *) spec=$torch ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
stage="$root/build/docker"
mkdir -p "$stage/wheels"
# pip in the build goes through whatever TLS proxy this machine's pip trusts.
ca="${PIP_CERT:-${REQUESTS_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}}"
if [ -f "$ca" ]; then cp "$ca" "$stage/ca.pem"; else : > "$stage/ca.pem"; fi
# A wheel pip finds only locally (the CPU build of torch is not on PyPI) is staged for the build.
find "$stage/wheels" -type f ! -name "$(echo "$spec" | sed 's/==.*//')-*" -delete
if [ "$spec" != none ] && [ "$torch" != cuda ]; then
    python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$stage/wheels" "$spec" \
        || { echo "build-image: pip cannot find $spec here (use --torch cuda or none)" >&2; exit 1; }
fi

base=$("$root/scripts/base-image.sh")
echo "build-image: building $tag from $base with torch: $spec" >&2
start=$(date +%s)
nice -n 10 docker build --force-rm --build-arg "BASE_IMAGE=$base" --build-arg "TORCH_SPEC=$spec" \
    --tag "$tag" "$root" >&2
echo "build-image: $tag built in $(( $(date +%s) - start )) s" >&2
echo "$tag"
