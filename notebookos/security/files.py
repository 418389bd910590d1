"""Where a process finds its TLS files and join token, how they are created, and how they load.

With the ``security.*`` file settings left empty, everything lives in ``<state_dir>/security/``
(mode 0700): ``ca.pem``, ``ca-key.pem``, ``node.pem``, ``node-key.pem`` and ``join-token``, the
keys and the token mode 0600. ``ensure_cluster_credentials`` (called by ``notebookos up`` and by the
Global Scheduler at start) creates whichever of them are missing; every other process only reads
them, and says which setting to check when it cannot.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from notebookos.config import Config
from notebookos.security import pki

log = logging.getLogger(__name__)

SECURITY_DIR = "security"
CA_FILE, CA_KEY_FILE = "ca.pem", "ca-key.pem"
CERT_FILE, KEY_FILE = "node.pem", "node-key.pem"
TOKEN_FILE = "join-token"
RENEW_WITHIN_DAYS = 30  # a managed certificate this close to expiry is re-issued at start


class SecurityError(Exception):
    """TLS files or the join token are missing or unusable; the message names the setting."""


def _setting(name: str) -> str:
    return f"security.{name} (${'NOTEBOOKOS_SECURITY_' + name.upper()})"


@dataclass(frozen=True)
class CredentialFiles:
    ca: Path
    cert: Path
    key: Path
    token: Path
    # <state_dir>/security when ca/cert/key are all left to it (then they may be created there)
    managed_dir: Path | None
    token_managed: bool  # the token file is the state directory's default one

    @property
    def ca_key(self) -> Path | None:
        return self.managed_dir / CA_KEY_FILE if self.managed_dir is not None else None


def credential_files(config: Config) -> CredentialFiles:
    sec = config.security
    base = (config.state_path / SECURITY_DIR).absolute()
    managed = not (sec.ca_file or sec.cert_file or sec.key_file)
    return CredentialFiles(
        ca=Path(sec.ca_file) if sec.ca_file else base / CA_FILE,
        cert=Path(sec.cert_file) if sec.cert_file else base / CERT_FILE,
        key=Path(sec.key_file) if sec.key_file else base / KEY_FILE,
        token=Path(sec.join_token_file) if sec.join_token_file else base / TOKEN_FILE,
        managed_dir=base if managed else None,
        token_managed=not sec.join_token_file and not sec.join_token,
    )


# -- creating ---------------------------------------------------------------------------------


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` atomically, readable by its owner only (or ``mode``)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, mode)  # in case the umask took bits away
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def new_join_token() -> str:
    return secrets.token_urlsafe(32)


def default_names(server_name: str) -> tuple[list[str], list[str]]:
    """DNS names and IP addresses a certificate made on this machine carries."""
    dns = [n for n in (server_name, "localhost", socket.gethostname()) if n]
    return dns, ["127.0.0.1", "::1"]


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes starting at once make one CA
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def create_credentials(directory: Path, server_name: str = "notebookos",
                       dns_names: list[str] | None = None,
                       ip_addresses: list[str] | None = None) -> list[Path]:
    """Create in ``directory`` whatever is missing of: a CA, a certificate signed by it, a join
    token. A certificate close to expiry is re-issued. Returns the files written."""
    written: list[Path] = []
    with _locked(directory):
        os.chmod(directory, 0o700)
        ca_path, ca_key_path = directory / CA_FILE, directory / CA_KEY_FILE
        cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
        if not ca_path.exists():
            ca = pki.create_ca()
            write_private(ca_key_path, ca.private_key)
            write_private(ca_path, ca.certificate, 0o644)
            written += [ca_path, ca_key_path]
            for stale in (cert_path, key_path):  # signed by a CA that is gone
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
        renew = cert_path.exists() and pki.expires_within(cert_path.read_bytes(),
                                                          RENEW_WITHIN_DAYS)
        if not (cert_path.exists() and key_path.exists()) or renew:
            if not ca_key_path.exists():
                raise SecurityError(
                    f"cannot issue a certificate in {directory}: the CA key {ca_key_path} is "
                    "missing (the CA was made elsewhere: issue certificates there, with "
                    "`notebookos security issue`)")
            ca = pki.PemPair(ca_path.read_bytes(), ca_key_path.read_bytes())
            dns, ips = default_names(server_name)
            pair = pki.issue(ca, f"notebookos node {socket.gethostname()}",
                             dns + list(dns_names or ()), ips + list(ip_addresses or ()))
            write_private(key_path, pair.private_key)
            write_private(cert_path, pair.certificate, 0o644)
            written += [cert_path, key_path]
        token_path = directory / TOKEN_FILE
        if not token_path.exists():
            write_private(token_path, (new_join_token() + "\n").encode())
            written.append(token_path)
    return written


def ensure_cluster_credentials(config: Config) -> CredentialFiles:
    """Make the embedded default secure with no setup: create the state directory's CA,
    certificate and join token where the configuration leaves them to it and they are missing.
    Files a deployment configured are never created, only checked."""
    files = credential_files(config)
    if files.managed_dir is not None:
        written = create_credentials(files.managed_dir, config.security.server_name)
        if written:
            log.info("created %s", ", ".join(p.name for p in written))
    elif files.token_managed and not files.token.exists():
        with _locked(files.token.parent):
            if not files.token.exists():
                write_private(files.token, (new_join_token() + "\n").encode())
    load_tls(config)  # fail now, with the setting's name, rather than at the first handshake
    return files


def child_environment(config: Config) -> dict[str, str]:
    """``NOTEBOOKOS_SECURITY_*`` variables that give a process this one starts the same
    credentials (whatever file or flag this one's configuration came from)."""
    files = credential_files(config)
    env = {
        "NOTEBOOKOS_SECURITY_CA_FILE": str(files.ca),
        "NOTEBOOKOS_SECURITY_CERT_FILE": str(files.cert),
        "NOTEBOOKOS_SECURITY_KEY_FILE": str(files.key),
        "NOTEBOOKOS_SECURITY_SERVER_NAME": config.security.server_name,
        "NOTEBOOKOS_SECURITY_JOIN_TOKEN_FILE": str(files.token),
    }
    if config.security.join_token:
        env["NOTEBOOKOS_SECURITY_JOIN_TOKEN"] = config.security.join_token
    return env


# -- loading ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsMaterial:
    ca: bytes
    cert: bytes
    key: bytes
    stamp: tuple  # (path, mtime_ns, size) of each file: changes when a file is replaced


def _stamp(paths: tuple[Path, ...]) -> tuple:
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((str(p), st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append((str(p), None))
    return tuple(out)


def _read(path: Path, what: str, setting: str, hint: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SecurityError(f"no {what} at {path} (setting {_setting(setting)}); {hint}") from None
    except PermissionError:
        raise SecurityError(
            f"cannot read the {what} {path} (setting {_setting(setting)}): permission denied; "
            "only the user who started the cluster can use its credentials") from None
    except OSError as exc:
        raise SecurityError(f"cannot read the {what} {path} (setting {_setting(setting)}): "
                            f"{exc.strerror}") from None
    if not data.strip():
        raise SecurityError(f"the {what} {path} (setting {_setting(setting)}) is empty")
    return data


_cache: dict[tuple, TlsMaterial] = {}


def load_tls(config: Config) -> TlsMaterial:
    """The CA bundle, certificate and key this process uses, checked to belong together."""
    files = credential_files(config)
    stamp = _stamp((files.ca, files.cert, files.key))
    cached = _cache.get(stamp)
    if cached is not None:
        return cached
    hint = ("`notebookos up` and the Global Scheduler create it on first start in the state "
            "directory (cluster.state_dir); a deployment points this setting at its own file")
    ca = _read(files.ca, "CA certificate", "ca_file", hint)
    cert = _read(files.cert, "certificate", "cert_file", hint)
    key = _read(files.key, "private key", "key_file", hint)
    try:
        cas = x509.load_pem_x509_certificates(ca)
    except ValueError:
        raise SecurityError(f"{files.ca} (setting {_setting('ca_file')}) holds no PEM "
                            "certificate") from None
    try:
        leaf = x509.load_pem_x509_certificates(cert)[0]
    except ValueError:
        raise SecurityError(f"{files.cert} (setting {_setting('cert_file')}) holds no PEM "
                            "certificate") from None
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise SecurityError(f"{files.key} (setting {_setting('key_file')}) holds no "
                            "unencrypted PEM private key") from None
    if private.public_key().public_bytes(  # type: ignore[union-attr]
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) != \
            leaf.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo):
        raise SecurityError(f"the private key {files.key} does not belong to the certificate "
                            f"{files.cert} (settings {_setting('key_file')}, "
                            f"{_setting('cert_file')})")
    if not any(_issued_by(leaf, c) for c in cas):
        raise SecurityError(f"the certificate {files.cert} is not signed by a CA in {files.ca} "
                            f"(settings {_setting('cert_file')}, {_setting('ca_file')})")
    mode = files.key.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("the private key %s is readable by other users (mode %o): chmod 600 it",
                    files.key, stat.S_IMODE(mode))
    material = TlsMaterial(ca, cert, key, stamp)
    _cache.clear()
    _cache[stamp] = material
    return material


def _issued_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def check_credentials(config: Config, join_token: bool = False) -> None:
    """Raise ``SecurityError`` naming every setting to check when this process cannot use its
    TLS files (or, with ``join_token``, its join token): a daemon calls it before it binds."""
    from notebookos.security.join_token import JoinTokens

    problems = []
    try:
        load_tls(config)
    except SecurityError as exc:
        problems.append(str(exc))
    if join_token:
        try:
            JoinTokens(config).check()
        except SecurityError as exc:
            problems.append(str(exc))
    if problems:
        raise SecurityError("; ".join(problems))
