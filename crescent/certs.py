"""Certificates of a deployment's internal plane: a CA of its own and one certificate per
service, ECDSA P-256, written as PEM files of mode 0600 in a 0700 folder.

Every certificate may serve and may connect (both extended key usages), since each service is
a server on one link and a client on others, and names its hosts in subject alternative names
(DNS names and IP addresses): a client checks the host it dialled against them.

    python -m crescent.certs DIR --name nats --dns nats --dns localhost --ip 127.0.0.1

makes ``DIR/ca.pem`` and ``DIR/ca.key`` (unless they exist: the CA is reused) and
``DIR/nats.pem`` with ``DIR/nats.key``.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from crescent.secret_files import private_dir, write_private

CA_DAYS = 3650
CERT_DAYS = 365
#: What every certificate ``crescent up`` makes names: this machine's loopback.
LOOPBACK_DNS = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")
# Clocks of a deployment's hosts disagree a little: a fresh certificate is valid from a bit
# before it was made.
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class CertFiles:
    """A certificate, its key and the CA bundle that verifies its peers."""

    ca: Path
    cert: Path
    key: Path

    def env(self) -> dict[str, str]:
        """The variables that make a Crescent process use these files (``shared.tls``)."""
        return {
            "CRESCENT_TLS": "on",
            "CRESCENT_TLS_CA_FILE": str(self.ca),
            "CRESCENT_TLS_CERT_FILE": str(self.cert),
            "CRESCENT_TLS_KEY_FILE": str(self.key),
        }


class Authority:
    """A CA's key and certificate, loaded or made. Invariant: ``cert`` is signed by ``key``."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self.key = key
        self.cert = cert

    @classmethod
    def create(cls, name: str = "Crescent internal CA", days: int = CA_DAYS) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_ca_usage(), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @classmethod
    def load(cls, cert_file: Path, key_file: Path) -> Authority:
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_file} is not an EC private key")
        return cls(key, x509.load_pem_x509_certificate(cert_file.read_bytes()))

    def issue(
        self, name: str, dns: Sequence[str], ips: Sequence[str], days: int = CERT_DAYS
    ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        """A new key and a certificate for ``name``, valid for the given hosts."""
        if not dns and not ips:
            raise ValueError("a certificate needs at least one DNS name or IP address")
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        now = _now()
        ca_key_id = x509.SubjectKeyIdentifier.from_public_key(self.key.public_key())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_leaf_usage(), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id), False
            )
            .sign(self.key, hashes.SHA256())
        )
        return key, cert


def authority(directory: Path) -> Authority:
    """The CA kept in ``directory`` (``ca.pem``, ``ca.key``), made there on first use."""
    private_dir(directory)
    cert_file, key_file = directory / "ca.pem", directory / "ca.key"
    if cert_file.exists() and key_file.exists():
        return Authority.load(cert_file, key_file)
    ca = Authority.create()
    write_private(key_file, _key_pem(ca.key))
    write_private(cert_file, _cert_pem(ca.cert))
    return ca


def write_cert(
    directory: Path,
    name: str,
    dns: Sequence[str] = LOOPBACK_DNS,
    ips: Sequence[str] = LOOPBACK_IPS,
    days: int = CERT_DAYS,
) -> CertFiles:
    """A certificate for ``name`` (``directory/<name>.pem`` and ``.key``) from the folder's CA,
    replacing any earlier one: writing it again is how a certificate is renewed."""
    if name == "ca" or not name or "/" in name:
        raise ValueError(f"{name!r} cannot name a certificate's files")
    ca = authority(directory)
    key, cert = ca.issue(name, dns, ips, days)
    key_file = write_private(directory / f"{name}.key", _key_pem(key))
    cert_file = write_private(directory / f"{name}.pem", _cert_pem(cert))
    return CertFiles(directory / "ca.pem", cert_file, key_file)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _ca_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _leaf_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=True, key_cert_sign=False, crl_sign=False,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m crescent.certs",
        description="Make a deployment's CA (once) and a certificate for one service.",
    )
    p.add_argument("directory", type=Path, help="folder of the CA and the certificates (0700)")
    p.add_argument("--name", required=True, help="the service: its files are NAME.pem/.key")
    p.add_argument("--dns", action="append", default=[], help="a DNS name it is reached by")
    p.add_argument("--ip", action="append", default=[], help="an IP address it is reached by")
    p.add_argument("--days", type=int, default=CERT_DAYS, help="validity of the certificate")
    args = p.parse_args(argv)
    try:
        files = write_cert(args.directory, args.name, args.dns, args.ip, args.days)
    except ValueError as exc:
        sys.stderr.write(f"crescent.certs: error: {exc}\n")
        return 2
    for variable, value in files.env().items():
        print(f"{variable}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
