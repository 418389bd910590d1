"""HTTPS for the daemons' Prometheus endpoints, with the cluster's own credentials.

With ``security.metrics_tls`` on, ``/metrics`` (and the Global Scheduler's ``/sd``) are served
with the daemon's certificate and only to scrapers that present a certificate signed by the
cluster CA: the same mutual TLS as the gRPC control plane, so the metrics (host names, GPU use,
kernel counts) are no more open than the control plane. Prometheus scrapes them with
``scheme: https`` and a ``tls_config`` naming the CA, a client certificate and its key
(docs/observability.md). Off by default: plain HTTP on each daemon's ``host``.
"""

from __future__ import annotations

import ssl

from notebookos.config import Config
from notebookos.security.files import SecurityError, credential_files, load_tls


def metrics_ssl_context(config: Config) -> ssl.SSLContext | None:
    """The server context for the metrics endpoint, or None when ``metrics_tls`` is off."""
    if not config.security.metrics_tls:
        return None
    load_tls(config)  # the files exist and belong together, or a SecurityError names them
    files = credential_files(config)
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(files.ca))
        context.load_cert_chain(str(files.cert), str(files.key))
    except (OSError, ssl.SSLError) as exc:
        raise SecurityError(f"security.metrics_tls: cannot use {files.cert} / {files.key} "
                            f"with the CA {files.ca}: {exc}") from exc
    context.verify_mode = ssl.CERT_REQUIRED  # a scraper without a cluster certificate is refused
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
