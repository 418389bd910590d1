# The NotebookOS image: one image for the Global Scheduler, the Local Schedulers, the replica
# containers, JupyterLab, and the Redis and SeaweedFS (S3) services of docker-compose.yml.
#
# Build it with scripts/build-image.sh, which makes the base image from Debian's packages
# (debootstrap + docker import: no image registry is needed) and stages what the build needs:
#
#   scripts/build-image.sh --torch cpu     # the CPU wheel pip finds on this machine (tests)
#   scripts/build-image.sh --torch cuda    # torch from PyPI with its CUDA libraries (GPU VMs)
#   scripts/build-image.sh --torch none    # no torch (the kernel works without it)
#
# Build arguments: BASE_IMAGE (the debootstrapped base), TORCH_SPEC (a pip requirement, or
# "none"). Everything runs as the unprivileged user notebookos (uid 1000) except the Local
# Scheduler, which compose runs as root to reach the Docker socket.
ARG BASE_IMAGE=notebookos-base:bookworm

FROM ${BASE_IMAGE} AS deps
ARG TORCH_SPEC=none
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_CERT=/tmp/build/ca.pem PIP_FIND_LINKS=/tmp/build/wheels
# build/docker/ holds the CA bundle of the build host (pip goes through its TLS proxy, if any) and
# any wheel staged for TORCH_SPEC. Nothing of this stage but the virtualenv reaches the image.
COPY build/docker/ /tmp/build/
RUN python3 -m venv /opt/notebookos \
 && /opt/notebookos/bin/pip install -q --upgrade pip "setuptools>=77" wheel
# torch first: the largest layer, and the one that changes least.
RUN if [ "$TORCH_SPEC" != none ]; then /opt/notebookos/bin/pip install -q "$TORCH_SPEC"; fi
# The dependencies (project + the `deploy` extra) straight from pyproject.toml.
COPY pyproject.toml /tmp/src/pyproject.toml
RUN python3 -c "import tomllib; p = tomllib.load(open('/tmp/src/pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['deploy']))" > /tmp/requirements.txt \
 && /opt/notebookos/bin/pip install -q -r /tmp/requirements.txt

FROM ${BASE_IMAGE}
RUN groupadd --gid 1000 notebookos \
 && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/notebookos --shell /bin/bash notebookos \
 && mkdir -p /var/lib/notebookos/security && chmod 700 /var/lib/notebookos/security \
 && chown -R notebookos:notebookos /var/lib/notebookos
# The dependencies in one layer that a change of the code alone leaves cached; then the project,
# installed offline (no build isolation: setuptools is in the virtualenv).
COPY --from=deps /opt/notebookos /opt/notebookos
COPY pyproject.toml README.md /tmp/src/
COPY notebookos /tmp/src/notebookos
COPY kernel /tmp/src/kernel
COPY provisioner /tmp/src/provisioner
COPY global_scheduler /tmp/src/global_scheduler
COPY local_scheduler /tmp/src/local_scheduler
COPY jupyter-config /tmp/src/jupyter-config
RUN PIP_DISABLE_PIP_VERSION_CHECK=1 /opt/notebookos/bin/pip install -q --no-deps --no-build-isolation \
        --no-index /tmp/src \
 && /opt/notebookos/bin/notebookos kernelspec install --prefix /opt/notebookos >/dev/null \
 && chmod -R a+rX /opt/notebookos/share/jupyter/kernels \
 && rm -rf /tmp/src
COPY scripts/docker-entrypoint.sh /usr/local/bin/notebookos-entrypoint
ENV PATH=/opt/notebookos/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    NOTEBOOKOS_CLUSTER_STATE_DIR=/var/lib/notebookos \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title="NotebookOS" \
      org.opencontainers.image.description="GPU-efficient Jupyter: Raft-replicated kernels, GPUs bound per cell"
USER notebookos
WORKDIR /home/notebookos
ENTRYPOINT ["tini", "-g", "--", "notebookos-entrypoint"]
CMD ["notebookos", "--help"]
