"""Mutual TLS for every gRPC server and channel, with grpcio's own credentials.

Every server and channel in NotebookOS is made here:

- ``add_secure_port(server, config, address)``: serve on ``address`` (a ``grpc.Server`` or a
  ``grpc.aio.Server``); a client must present a certificate signed by the cluster CA, or the
  handshake fails. The server re-reads its files when they change (checked at each new
  handshake), so certificates rotate without a restart.
- ``secure_channel(config, target)`` / ``secure_aio_channel(config, target)``: a channel that
  presents this process's certificate and accepts only a server certificate signed by the
  cluster CA that names ``security.server_name``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from notebookos.config import Config
from notebookos.security.files import SecurityError, TlsMaterial, credential_files, load_tls

log = logging.getLogger(__name__)

ChannelOptions = Sequence[tuple[str, Any]]
Connect = Callable[[str], grpc.Channel]  # target -> a channel with this process's credentials


class _Reloader:
    """``dynamic_ssl_server_credentials``' fetcher: a new configuration when the files changed."""

    def __init__(self, config: Config, material: TlsMaterial) -> None:
        self.config = config
        self.stamp = material.stamp

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            material = load_tls(self.config)
        except SecurityError as exc:
            log.error("keeping the current TLS certificate: %s", exc)
            return None
        except Exception:  # noqa: BLE001 - never fail a handshake because of a reload
            log.exception("keeping the current TLS certificate")
            return None
        if material.stamp == self.stamp:
            return None
        self.stamp = material.stamp
        log.info("TLS files changed: serving the new certificate %s",
                 credential_files(self.config).cert)
        return _server_configuration(material)


def _server_configuration(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(material.key, material.cert)], root_certificates=material.ca)


def server_credentials(config: Config) -> grpc.ServerCredentials:
    """Server credentials that require a client certificate signed by the cluster CA."""
    material = load_tls(config)
    return grpc.dynamic_ssl_server_credentials(
        _server_configuration(material), _Reloader(config, material),
        require_client_authentication=True)


def add_secure_port(server: grpc.Server | grpc.aio.Server, config: Config, address: str) -> int:
    """Bind ``address`` with mutual TLS; returns the port (raises OSError when it cannot bind)."""
    port = server.add_secure_port(address, server_credentials(config))
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return port


def channel_credentials(config: Config) -> grpc.ChannelCredentials:
    material = load_tls(config)
    return grpc.ssl_channel_credentials(root_certificates=material.ca,
                                        private_key=material.key,
                                        certificate_chain=material.cert)


# A channel between daemons outlives its peer's restarts: it must try again soon after one.
# gRPC's default reconnect backoff grows by 1.6x from 1 s up to 120 s, and calls fail fast
# meanwhile: after a burst of Global Scheduler restarts a Local Scheduler's channel waited
# longer than the heartbeat timeout to connect again, and the restarted scheduler removed the
# healthy host with its replicas (benchmarks/chaos.py).
# The Global Scheduler's channels to its Local Schedulers ping every second and give up on a
# ping unanswered for 2 s: a host whose machine or network is gone sends nothing (no reset), and
# without pings its held WatchHost call would wait for the heartbeat timeout. gRPC reports such
# a failure as "ping timeout" (a daemon that exited: "Socket closed"); hosts.py tells them apart.
KEEPALIVE_OPTIONS = (("grpc.keepalive_time_ms", 1000),
                     ("grpc.keepalive_timeout_ms", 2000),
                     ("grpc.http2.ping_timeout_ms", 2000),
                     ("grpc.keepalive_permit_without_calls", 1),
                     ("grpc.http2.max_pings_without_data", 0),
                     ("grpc.http2.min_sent_ping_interval_without_data_ms", 1000))
# What a Local Scheduler's server must allow for those pings (its default: one in 5 minutes).
KEEPALIVE_SERVER_OPTIONS = (("grpc.http2.min_ping_interval_without_data_ms", 500),
                            ("grpc.keepalive_permit_without_calls", 1),
                            ("grpc.http2.max_ping_strikes", 0))
RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 250),
                     ("grpc.min_reconnect_backoff_ms", 250),
                     ("grpc.max_reconnect_backoff_ms", 2000))


def channel_options(config: Config, options: ChannelOptions = ()) -> list[tuple[str, Any]]:
    """``options`` over the project's defaults (``RECONNECT_OPTIONS``)."""
    given = {name for name, _ in options}
    out = [o for o in RECONNECT_OPTIONS if o[0] not in given] + list(options)
    if config.security.server_name:
        out.append(("grpc.ssl_target_name_override", config.security.server_name))
    return out


def secure_channel(config: Config, target: str, options: ChannelOptions = ()) -> grpc.Channel:
    return grpc.secure_channel(target, channel_credentials(config),
                               options=channel_options(config, options))


def secure_aio_channel(config: Config, target: str,
                       options: ChannelOptions = ()) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(target, channel_credentials(config),
                                   options=channel_options(config, options))


def connector(config: Config, options: ChannelOptions = ()) -> Connect:
    """``connect(target)`` -> a mutual TLS channel with ``config``'s credentials and
    ``options`` (what a daemon hands to the parts of it that open channels). Checks the files
    now."""
    load_tls(config)
    return functools.partial(secure_channel, config, options=options)
