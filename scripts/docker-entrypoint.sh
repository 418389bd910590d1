#!/bin/sh
# Entrypoint of the NotebookOS image (under tini). Runs its arguments, after two conveniences:
#
# - NOTEBOOKOS_GLOBAL_SCHEDULER_HOST or NOTEBOOKOS_LOCAL_SCHEDULER_HOST set to "container-ip"
#   becomes this container's address on its network: a daemon binds and advertises the address
#   its peers reach it at, which is known only once the container runs;
# - NOTEBOOKOS_WAIT_FOR="host:port ..." waits (up to 5 minutes) until each answers: the order of
#   start that compose's depends_on and a swarm cannot promise;
# - a few service names of docker-compose.yml:
#     jupyterlab [ARGS]  JupyterLab with NotebookOS as its default kernel; prints its URL
#     redis              a Redis server keeping its data in /var/lib/notebookos/redis
#     s3                 a SeaweedFS S3 server in /var/lib/notebookos/s3, with the bucket
#                        $NOTEBOOKOS_S3_BUCKET made and the keys $AWS_ACCESS_KEY_ID /
#                        $AWS_SECRET_ACCESS_KEY
#     healthcheck NAME   exit 0 when the service NAME of this container answers
# Anything else runs as given (notebookos global-scheduler, notebookos local-scheduler, ...).
set -eu

state=${NOTEBOOKOS_CLUSTER_STATE_DIR:-/var/lib/notebookos}

container_ip() {
    python3 -S -c 'import socket; print(socket.gethostbyname(socket.gethostname()))'
}

for var in NOTEBOOKOS_GLOBAL_SCHEDULER_HOST NOTEBOOKOS_LOCAL_SCHEDULER_HOST; do
    eval "value=\${$var:-}"
    if [ "$value" = container-ip ]; then
        export "$var=$(container_ip)"
    fi
done

tcp_open() {  # tcp_open HOST PORT
    python3 -S -c 'import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), 3).close()' "$1" "$2" 2>/dev/null
}

if [ "${1:-}" != healthcheck ]; then
    for target in ${NOTEBOOKOS_WAIT_FOR:-}; do
        i=0
        until tcp_open "${target%:*}" "${target##*:}"; do
            [ $i -eq 0 ] && echo "waiting for $target ..." >&2
            i=$((i + 1))
            [ $i -lt 300 ] || { echo "gave up waiting for $target" >&2; exit 1; }
            sleep 1
        done
    done
fi

case "${1:-}" in
jupyterlab)
    shift
    token=${NOTEBOOKOS_JUPYTER_TOKEN:-}
    if [ -z "$token" ]; then  # one random token per state volume, kept across restarts
        if [ ! -s "$state/jupyter-token" ]; then
            python3 -S -c 'import secrets; print(secrets.token_hex(24))' > "$state/jupyter-token"
            chmod 600 "$state/jupyter-token"
        fi
        token=$(cat "$state/jupyter-token")
    fi
    mkdir -p "$HOME/work"
    url="http://${NOTEBOOKOS_PUBLIC_HOST:-localhost}:${NOTEBOOKOS_JUPYTER_PORT:-8888}/lab?token=$token"
    echo "$url" > "$state/jupyter-url"
    printf '\n    NotebookOS JupyterLab: %s\n\n' "$url"
    exec jupyter lab --ip=0.0.0.0 --port=8888 --port-retries=0 --no-browser \
        "--IdentityProvider.token=$token" \
        --MappingKernelManager.default_kernel_name=notebookos \
        "--ServerApp.root_dir=$HOME/work" "$@"
    ;;
redis)
    mkdir -p "$state/redis"
    exec redis-server --bind 0.0.0.0 --protected-mode no --port 6379 --dir "$state/redis" \
        --appendonly yes --save ""
    ;;
s3)
    mkdir -p "$state/s3"
    python3 -S -c 'import json, os
keys = {"accessKey": os.environ["AWS_ACCESS_KEY_ID"], "secretKey": os.environ["AWS_SECRET_ACCESS_KEY"]}
identity = {"name": "notebookos", "credentials": [keys],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
print(json.dumps({"identities": [identity]}))' > "$state/s3/identities.json"
    rm -f /tmp/s3-ready
    weed server -s3 -filer -dir="$state/s3" -ip="$(container_ip)" -ip.bind=0.0.0.0 \
        -s3.port=8333 -s3.config="$state/s3/identities.json" -master.volumeSizeLimitMB=1024 \
        -volume.max=100 -s3.port.iceberg=0 -s3.port.lance=0 &
    weed=$!
    trap 'kill -TERM $weed 2>/dev/null' TERM INT
    python3 - <<'EOF'
import os, sys, time
import boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:8333", region_name="us-east-1",
                  config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}))
bucket = os.environ.get("NOTEBOOKOS_S3_BUCKET", "notebookos")
deadline = time.monotonic() + 120
while True:
    try:
        s3.head_bucket(Bucket=bucket)
        break
    except Exception:
        try:
            s3.create_bucket(Bucket=bucket)
            break
        except Exception as exc:
            if time.monotonic() > deadline:
                sys.exit(f"s3: bucket {bucket} could not be made: {exc}")
            time.sleep(0.5)
open("/tmp/s3-ready", "w").close()
print(f"s3: bucket {bucket} ready", flush=True)
EOF
    wait $weed
    ;;
healthcheck)
    case "${2:-}" in
        global-scheduler) tcp_open "${NOTEBOOKOS_GLOBAL_SCHEDULER_HOST:-127.0.0.1}" \
                                   "${NOTEBOOKOS_GLOBAL_SCHEDULER_GRPC_PORT:-8079}" ;;
        local-scheduler) tcp_open "${NOTEBOOKOS_LOCAL_SCHEDULER_HOST:-127.0.0.1}" \
                                  "${NOTEBOOKOS_LOCAL_SCHEDULER_GRPC_PORT:-8080}" ;;
        jupyterlab) python3 -S -c 'import urllib.request
urllib.request.urlopen("http://127.0.0.1:8888/api", timeout=5).read()' ;;
        redis) [ "$(redis-cli -p 6379 ping)" = PONG ] ;;
        s3) [ -f /tmp/s3-ready ] && tcp_open 127.0.0.1 8333 ;;
        *) echo "healthcheck: unknown service ${2:-}" >&2; exit 2 ;;
    esac
    ;;
*)
    exec "$@"
    ;;
esac
