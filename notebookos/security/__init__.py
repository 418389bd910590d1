"""The cluster's credentials, in one place: every gRPC server and channel is made here.

- ``add_secure_port`` / ``server_credentials``: mutual TLS servers (a client without a
  certificate signed by the cluster CA is refused in the handshake);
- ``secure_channel`` / ``secure_aio_channel``: mutual TLS channels;
- ``JoinTokenInterceptor`` / ``AioJoinTokenInterceptor`` and ``JoinTokens``: the cluster join
  token that Local Schedulers present to the Global Scheduler;
- ``ensure_cluster_credentials``: the embedded default's CA, certificate and token, created in
  the state directory on first start;
- ``metrics_ssl_context``: HTTPS with client certificates for the Prometheus endpoints
  (``security.metrics_tls``);
- ``SecurityError``: files or token missing or unusable (the message names the setting).

See docs/security.md.
"""

from notebookos.security.channels import (
    KEEPALIVE_OPTIONS,
    KEEPALIVE_SERVER_OPTIONS,
    Connect,
    add_secure_port,
    channel_credentials,
    connector,
    secure_aio_channel,
    secure_channel,
    server_credentials,
)
from notebookos.security.files import (
    CredentialFiles,
    SecurityError,
    check_credentials,
    child_environment,
    create_credentials,
    credential_files,
    ensure_cluster_credentials,
    load_tls,
)
from notebookos.security.join_token import (
    HOST_METHODS,
    METADATA_KEY,
    AioJoinTokenInterceptor,
    JoinTokenInterceptor,
    JoinTokens,
)
from notebookos.security.metrics_tls import metrics_ssl_context

__all__ = [
    "KEEPALIVE_OPTIONS",
    "KEEPALIVE_SERVER_OPTIONS",
    "Connect",
    "HOST_METHODS",
    "METADATA_KEY",
    "AioJoinTokenInterceptor",
    "CredentialFiles",
    "JoinTokenInterceptor",
    "JoinTokens",
    "SecurityError",
    "add_secure_port",
    "channel_credentials",
    "check_credentials",
    "connector",
    "child_environment",
    "create_credentials",
    "credential_files",
    "ensure_cluster_credentials",
    "load_tls",
    "metrics_ssl_context",
    "secure_aio_channel",
    "secure_channel",
    "server_credentials",
]
