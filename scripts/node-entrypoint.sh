#!/bin/sh
# Entrypoint of a node of the multi-node test cluster (scripts/node-image.sh): make /sys and the
# cgroup hierarchies writable (the node runs with every capability this machine's engine can give
# but not --privileged, which asks for CAP_SYS_RESOURCE too and is refused where the engine itself
# runs in a container without it), start the node's SSH server (its own host keys, made now), then
# run the node's own Docker engine with its arguments.
set -eu
mount -o remount,rw /sys
for hierarchy in /sys/fs/cgroup/*/; do
    mount -o remount,rw,bind "$hierarchy"
done
mkdir -p /run/nbos-node
if [ -x /usr/sbin/sshd ]; then
    ssh-keygen -A >/dev/null
    mkdir -p /run/sshd /root/.ssh
    chmod 700 /root/.ssh
    /usr/sbin/sshd
fi
exec dockerd --host unix:///var/run/docker.sock --host unix:///run/nbos-node/docker.sock \
    --storage-driver overlay2 "$@"
