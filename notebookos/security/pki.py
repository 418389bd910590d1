"""A small certificate authority for one cluster (the ``cryptography`` package).

``create_ca`` makes a self-signed CA; ``issue`` signs a certificate for a daemon or a client. Every
issued certificate is good for both TLS roles (server and client: every NotebookOS process is
both) and names ``server_name`` (``security.server_name``, default ``notebookos``) among its DNS
names, which is what clients check, so a certificate does not depend on the addresses a host has.
Keys are ECDSA P-256: fast to make and to handshake with, and supported by gRPC.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALID_DAYS = 3650
CERT_VALID_DAYS = 825  # what browsers and most PKIs still accept for leaf certificates


@dataclass(frozen=True)
class PemPair:
    certificate: bytes
    private_key: bytes


def _name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "NotebookOS"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def create_ca(common_name: str = "NotebookOS cluster CA", valid_days: int = CA_VALID_DAYS) -> PemPair:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return PemPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: PemPair,
    common_name: str,
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    valid_days: int = CERT_VALID_DAYS,
) -> PemPair:
    """A certificate signed by ``ca`` for server and client authentication."""
    ca_cert = x509.load_pem_x509_certificate(ca.certificate)
    ca_key = serialization.load_pem_private_key(ca.private_key, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = [x509.DNSName(d) for d in dict.fromkeys(dns_names) if d]
    alt_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in dict.fromkeys(ip_addresses)]
    if not alt_names:
        raise ValueError("a certificate needs at least one DNS name or IP address")
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + datetime.timedelta(days=valid_days),
                             ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=False, key_cert_sign=False, crl_sign=False,
            content_commitment=False, data_encipherment=False, key_agreement=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            ca_cert.public_key()), critical=False)  # type: ignore[arg-type]
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return PemPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def expires_within(certificate_pem: bytes, days: float) -> bool:
    """Whether the (first) certificate in ``certificate_pem`` expires within ``days``."""
    cert = x509.load_pem_x509_certificate(certificate_pem)
    return cert.not_valid_after_utc <= _now() + datetime.timedelta(days=days)


def describe(certificate_pem: bytes) -> str:
    """Subject, names and validity of a certificate, for messages (nothing secret)."""
    cert = x509.load_pem_x509_certificate(certificate_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(n.value) for n in san]
    except x509.ExtensionNotFound:
        names = []
    return (f"{cert.subject.rfc4514_string()} (names {', '.join(names) or 'none'}; valid until "
            f"{cert.not_valid_after_utc:%Y-%m-%d})")
