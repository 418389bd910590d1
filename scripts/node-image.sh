#!/bin/sh
# Build the image of a *node* of the multi-node test cluster (notebookos/testing/multinode.py): a
# Docker engine in a privileged container, Debian's docker.io on the project's debootstrap base
# (scripts/base-image.sh), so that no image registry is needed. Prints the image's tag.
#
# Each node runs its own dockerd with its data root on a volume of the outer engine (ext4 under
# it, so the nested engine's overlay2 works: overlay on overlay does not). The tag carries a
# hash of this script and of the base image: built once per machine.
#
# Each node also runs an SSH server (root, key only; the harness puts its throwaway public key in
# /root/.ssh/authorized_keys), so that the ansible playbook can deploy to the nodes as to VMs:
# python3 (in the base), python3-apt (the apt module) and sudo (the playbook's become) with it.
# Host keys are made when a node starts, each node its own.
#
#   scripts/node-image.sh
set -eu

here=$(cd "$(dirname "$0")" && pwd)
base=$("$here/base-image.sh")
hash=$( (cat "$here/node-image.sh" "$here/node-entrypoint.sh"; echo "$base") | sha256sum | cut -c1-12)
tag="notebookos-node:bookworm-$hash"

if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag"
    exit 0
fi
echo "node-image: building $tag from $base" >&2
start=$(date +%s)
context=$(mktemp -d "${TMPDIR:-/var/tmp}/notebookos-node.XXXXXX")
trap 'rm -rf "$context"' EXIT INT TERM
cp "$here/node-entrypoint.sh" "$context/"
cat > "$context/Dockerfile" <<DOCKERFILE
FROM $base
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
        docker.io iproute2 iptables procps openssh-server python3-apt sudo \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /etc/ssh/ssh_host_*
COPY node-entrypoint.sh /usr/local/bin/node-entrypoint
VOLUME /var/lib/docker
ENTRYPOINT ["/usr/local/bin/node-entrypoint"]
DOCKERFILE
nice -n 10 docker build --force-rm --tag "$tag" "$context" >&2
echo "node-image: $tag built in $(( $(date +%s) - start )) s" >&2
echo "$tag"
