#!/bin/sh
# Build a Prometheus image from Debian's `prometheus` package on the NotebookOS base image, for
# machines that reach no image registry (docker-compose.monitoring.yml pulls prom/prometheus
# otherwise). Prints the image's tag; reuses it when it exists. Needs what base-image.sh needs.
#
#   NOTEBOOKOS_PROMETHEUS_IMAGE=$(scripts/prometheus-image.sh) docker compose \
#       -f docker-compose.yml -f docker-compose.monitoring.yml --profile monitoring up -d
set -eu

here=$(cd "$(dirname "$0")" && pwd)
base=$("$here/base-image.sh")
hash=$( (echo "$base"; cat "$here/prometheus-image.sh") | sha256sum | cut -c1-12)
tag="notebookos-prometheus:$hash"

if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag"
    exit 0
fi
echo "prometheus-image: building $tag from $base (Debian's prometheus package)" >&2
# The official image's entrypoint is the binary, with the compose file's `command` as its flags.
nice -n 10 docker build --force-rm --build-arg "BASE_IMAGE=$base" --tag "$tag" - >&2 <<'DOCKERFILE'
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
    && mkdir -p /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
DOCKERFILE
echo "$tag"
