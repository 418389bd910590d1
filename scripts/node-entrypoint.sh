#!/bin/sh
# Entrypoint of a node of the multi-node test cluster (scripts/node-image.sh): make /sys and the
# cgroup hierarchies writable (the node runs with every capability this machine's engine can give
# but not --privileged, which asks for CAP_SYS_RESOURCE too and is refused where the engine itself
# runs in a container without it), then run the node's own Docker engine with its arguments.
set -eu
mount -o remount,rw /sys
for hierarchy in /sys/fs/cgroup/*/; do
    mount -o remount,rw,bind "$hierarchy"
done
mkdir -p /run/nbos-node
exec dockerd --host unix:///var/run/docker.sock --host unix:///run/nbos-node/docker.sock \
    --storage-driver overlay2 "$@"
