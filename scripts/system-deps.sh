#!/bin/sh
# System packages the tests (and a local cluster) need on a fresh Debian/Ubuntu machine.
# Idempotent: apt-gets only what is missing, and only when root with apt-get available;
# otherwise it says what is missing and carries on (the tests that need it skip, or fail under
# NOTEBOOKOS_REQUIRE_SERVICES=1). Called by `make install-test`.
# Keep the list sorted (one package a line) to ease merges.
set -eu

PACKAGES="
chromium
debootstrap
docker.io
prometheus
"

missing=""
for pkg in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $pkg"
    fi
done

install_missing() {
    if [ -z "$missing" ]; then
        return 0
    fi
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "system-deps: missing system packages:$missing (install them as root with apt-get)" >&2
        return 0
    fi
    echo "system-deps: installing$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || true
    # shellcheck disable=SC2086 - one word per package
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# The deployment tests need a running Docker engine. Machines without systemd (CI containers and
# VMs) do not start the docker.io service on install: start dockerd here, once, in the background.
start_dockerd() {
    command -v dockerd >/dev/null 2>&1 || return 0
    docker info >/dev/null 2>&1 && return 0
    [ "$(id -u)" = 0 ] || { echo "system-deps: dockerd is not running (start it as root)" >&2; return 0; }
    echo "system-deps: starting dockerd (log: /var/log/dockerd.log)" >&2
    setsid dockerd >/var/log/dockerd.log 2>&1 < /dev/null &
    i=0
    while [ $i -lt 60 ] && ! docker info >/dev/null 2>&1; do sleep 0.5; i=$((i + 1)); done
    docker info >/dev/null 2>&1 || echo "system-deps: dockerd did not start; see /var/log/dockerd.log" >&2
}

install_missing
start_dockerd
