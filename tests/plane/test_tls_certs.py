"""``crescent.certs``: a CA made once per folder, and per-service certificates of ECDSA P-256
keys naming their hosts, usable as server and client, in private files."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID

from crescent.certs import main, write_cert


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_certificate_names_its_hosts_and_is_signed_by_the_folders_ca(tmp_path: Path) -> None:
    folder = tmp_path / "tls"
    files = write_cert(folder, "nats", dns=["nats", "localhost"], ips=["10.0.0.5", "::1"])
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["nats", "localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.5"), ipaddress.ip_address("::1"),
    ]  # fmt: skip
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    key = load_pem_private_key(files.key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert mode(folder) == 0o700
    assert {mode(p) for p in folder.iterdir()} == {0o600}


def test_the_ca_is_made_once_and_a_certificate_is_renewed_in_place(tmp_path: Path) -> None:
    first = write_cert(tmp_path, "a")
    ca = first.ca.read_bytes()
    old = first.cert.read_bytes()
    again = write_cert(tmp_path, "a")
    write_cert(tmp_path, "b")
    assert first.ca.read_bytes() == ca
    assert again.cert.read_bytes() != old


def test_the_command_prints_the_variables_of_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path), "--name", "decode-0", "--ip", "127.0.0.1"]) == 0
    printed = dict(line.split("=", 1) for line in capsys.readouterr().out.split())
    assert printed["CRESCENT_TLS_CERT_FILE"] == str(tmp_path / "decode-0.pem")
    assert main([str(tmp_path), "--name", "ca", "--dns", "x"]) == 2
    assert main([str(tmp_path), "--name", "nohosts"]) == 2
