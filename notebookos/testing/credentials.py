"""The cluster credentials of a test session (or a benchmark run): one CA, one certificate and
one join token, made once, given to every process through ``NOTEBOOKOS_SECURITY_*`` variables.

``tests/conftest.py`` calls ``install_session_credentials`` when it is imported, so every daemon a
test starts (they inherit ``os.environ``) and every client made with ``connect`` /
``aio_connect`` / ``security_config`` use the same files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import grpc

from notebookos.config import Config, load_config
from notebookos.security import (
    JoinTokens,
    child_environment,
    ensure_cluster_credentials,
    secure_aio_channel,
    secure_channel,
)

PREFIX = "NOTEBOOKOS_SECURITY_"


def make_credentials(directory: Path) -> dict[str, str]:
    """Create a CA, a certificate and a join token under ``directory``; returns the
    ``NOTEBOOKOS_SECURITY_*`` variables that point a process at them."""
    config = load_config(env={}, overrides={"cluster.state_dir": str(directory)})
    ensure_cluster_credentials(config)
    return child_environment(config)


def install_session_credentials() -> Path:
    """Make this process's credentials (once) and put them in ``os.environ``; returns the
    directory to delete at the end (``remove_session_credentials``)."""
    directory = Path(tempfile.mkdtemp(prefix="notebookos-tls-"))
    os.environ.update(make_credentials(directory))
    return directory


def remove_session_credentials(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def security_env() -> dict[str, str]:
    """The ``NOTEBOOKOS_SECURITY_*`` variables of this process (for ``load_config(env=...)``)."""
    return {k: v for k, v in os.environ.items() if k.startswith(PREFIX)}


def security_config() -> Config:
    """A configuration holding only this process's credentials."""
    return load_config(env=security_env())


def connect(address: str) -> grpc.Channel:
    """A mutual TLS channel to a daemon of this session."""
    return secure_channel(security_config(), address)


def aio_connect(address: str) -> grpc.aio.Channel:
    return secure_aio_channel(security_config(), address)


def join_token_metadata() -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the session's join token (what a Local Scheduler presents)."""
    return JoinTokens(security_config()).metadata()


def state_dir_config(state_dir: Path) -> Config:
    """The credentials ``notebookos up --state-dir STATE_DIR`` uses (made now if missing, as it
    would make them), as a configuration for clients."""
    config = load_config(env={}, overrides={"cluster.state_dir": str(state_dir)})
    ensure_cluster_credentials(config)
    return config
