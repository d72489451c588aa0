"""The certificates of a container deployment's internal plane: a CA of the deployment and a
certificate for each service that needs one (``crescent.certs`` makes them).

Which certificates, and the names in each:

- NATS and cachemeta serve under their service names (compose: ``nats``; Kubernetes: the
  Service name and its namespace-qualified forms);
- the S3 server of the stack serves https under its service names;
- every Crescent role presents one as a client (the NATS server and cachemeta require it);
- prefill, decode and tierd serve KV pulls, which peers dial by address (a container or pod IP
  nobody knows in advance), so they carry the fixed name ``SERVER_NAME`` and their processes
  check it instead of the address (``CRESCENT_TLS_SERVER_NAME``). That setting applies to all
  links of a process, so NATS's and cachemeta's certificates carry the name as well.

Compose keeps the CA's key in a folder only secrets-init mounts; a service's folder holds the
CA certificate and the certificates, each with its key (files 0600).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from crescent.certs import Authority
from crescent.secret_files import private_dir, write_private

#: The name pull servers present and pulling processes check (``CRESCENT_TLS_SERVER_NAME``).
SERVER_NAME = "crescent-internal"
#: Roles that serve KV pulls, dialled by address.
PULL_SERVERS = ("prefill", "decode", "tierd")
#: Roles that are clients only (of NATS, and the scheduler of cachemeta).
CLIENTS = ("gateway", "scheduler")
#: A certificate this close to its end, or a CA this close to its end, is made again.
RENEW_BEFORE = datetime.timedelta(days=30)
CA_RENEW_BEFORE = datetime.timedelta(days=365)
#: Where each service reads its files in a compose container and in a Kubernetes pod.
COMPOSE_TLS_DIR = "/var/lib/crescent/secrets/tls"
K8S_TLS_DIR = "/var/run/crescent/tls"
#: The keys of a Kubernetes TLS Secret.
K8S_CA, K8S_CERT, K8S_KEY = "ca.crt", "tls.crt", "tls.key"


@dataclass(frozen=True, slots=True)
class CertSpec:
    """One certificate: its name (files, Secret) and the DNS names it is valid for.
    Invariant: at least one name."""

    name: str
    dns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TlsPaths:
    """Where a container finds its CA, certificate and key."""

    ca: str
    cert: str
    key: str

    def env(self, *, server_name: bool = False) -> dict[str, str]:
        """The variables that turn TLS on with these files (``shared.tls``)."""
        env = {
            "CRESCENT_TLS": "on",
            "CRESCENT_TLS_CA_FILE": self.ca,
            "CRESCENT_TLS_CERT_FILE": self.cert,
            "CRESCENT_TLS_KEY_FILE": self.key,
        }
        if server_name:
            env["CRESCENT_TLS_SERVER_NAME"] = SERVER_NAME
        return env


def compose_paths(name: str, folder: str = COMPOSE_TLS_DIR) -> TlsPaths:
    """The files of certificate ``name`` in the compose secrets volume."""
    return TlsPaths(f"{folder}/ca.pem", f"{folder}/{name}.pem", f"{folder}/{name}.key")


def k8s_paths(folder: str = K8S_TLS_DIR) -> TlsPaths:
    """The files of a pod's TLS Secret, mounted at ``folder``."""
    return TlsPaths(f"{folder}/{K8S_CA}", f"{folder}/{K8S_CERT}", f"{folder}/{K8S_KEY}")


def _role_specs(service_dns: dict[str, tuple[str, ...]]) -> tuple[CertSpec, ...]:
    specs = [CertSpec(name, (*dns, SERVER_NAME)) for name, dns in service_dns.items()]
    specs += [CertSpec(role, (role,)) for role in CLIENTS]
    specs += [CertSpec(role, (SERVER_NAME,)) for role in PULL_SERVERS]
    return tuple(specs)


def compose_specs() -> tuple[CertSpec, ...]:
    """docker-compose.yml's certificates: its services meet by service name."""
    specs = _role_specs({"nats": ("nats",), "cachemeta": ("cachemeta",)})
    return (*specs, CertSpec("s3", ("s3",)))


def k8s_specs(namespace: str) -> tuple[CertSpec, ...]:
    """deploy/k8s's certificates: each Service's name in every form a pod may dial it by."""

    def names(service: str) -> tuple[str, ...]:
        qualified = f"{service}.{namespace}"
        return (service, qualified, f"{qualified}.svc", f"{qualified}.svc.cluster.local")

    specs = _role_specs({"nats": names("nats"), "cachemeta": names("cachemeta")})
    return (*specs, CertSpec("s3", names("s3")))


def key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _fresh(cert: x509.Certificate, margin: datetime.timedelta) -> bool:
    return cert.not_valid_after_utc - _now() > margin


def ca_in(folder: Path) -> tuple[Authority, bool]:
    """The CA kept in ``folder`` (``ca.pem``, ``ca.key``), made there when missing, unreadable
    or near its end; True when this call made it."""
    private_dir(folder)
    cert_file, key_file = folder / "ca.pem", folder / "ca.key"
    try:
        ca = Authority.load(cert_file, key_file)
        if _fresh(ca.cert, CA_RENEW_BEFORE) and _key_matches(ca.key, ca.cert):
            return ca, False
    except (OSError, ValueError):
        pass
    ca = Authority.create()
    write_private(key_file, key_pem(ca.key))
    write_private(cert_file, cert_pem(ca.cert))
    return ca, True


def _key_matches(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> bool:
    public = cert.public_key()
    return isinstance(public, ec.EllipticCurvePublicKey) and public == key.public_key()


def _names(cert: x509.Certificate) -> set[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(sans.get_values_for_type(x509.DNSName))


def still_good(ca: Authority, spec: CertSpec, cert_file: Path, key_file: Path) -> bool:
    """Whether the pair in these files may be kept: signed by ``ca``, for exactly the names
    of ``spec``, with its own key, and not near its end."""
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        cert.verify_directly_issued_by(ca.cert)
    except (OSError, ValueError, TypeError, InvalidSignature):
        return False
    return (
        isinstance(key, ec.EllipticCurvePrivateKey)
        and _key_matches(key, cert)
        and _names(cert) == set(spec.dns)
        and _fresh(cert, RENEW_BEFORE)
    )


def ensure_certs(folder: Path, ca_folder: Path, specs: Sequence[CertSpec]) -> list[str]:
    """The CA certificate and every certificate of ``specs`` in ``folder`` (0700, files 0600),
    keeping each pair that is still good; the CA's key stays in ``ca_folder``. Returns the
    file names made by this call."""
    ca, new_ca = ca_in(ca_folder)
    private_dir(folder)
    made = ["tls/ca.pem"] if new_ca or not (folder / "ca.pem").exists() else []
    write_private(folder / "ca.pem", cert_pem(ca.cert))
    for spec in specs:
        cert_file, key_file = folder / f"{spec.name}.pem", folder / f"{spec.name}.key"
        if still_good(ca, spec, cert_file, key_file):
            continue
        key, cert = ca.issue(spec.name, spec.dns, ())
        write_private(key_file, key_pem(key))
        write_private(cert_file, cert_pem(cert))
        made.append(f"tls/{spec.name}.pem")
    return made


def k8s_tls_data(ca: Authority, specs: Sequence[CertSpec]) -> dict[str, dict[str, str]]:
    """Each certificate's name -> the keys of its TLS Secret (``tls.crt``, ``tls.key`` and the
    CA's ``ca.crt``), freshly issued by ``ca``."""
    data = {}
    for spec in specs:
        key, cert = ca.issue(spec.name, spec.dns, ())
        data[spec.name] = {
            K8S_CA: cert_pem(ca.cert),
            K8S_CERT: cert_pem(cert),
            K8S_KEY: key_pem(key),
        }
    return data


def nats_tls_block(paths: TlsPaths) -> dict[str, object]:
    """The NATS server's ``tls`` block for its files at ``paths``, as ``crescent.nats_tls``
    renders it (mutual, handshake first)."""
    from crescent.nats_tls import tls_section
    from shared.tls import TlsSettings

    # The files live where the NATS container mounts them, not here: nothing to validate.
    settings = TlsSettings.model_construct(
        tls="on", tls_ca_file=Path(paths.ca), tls_cert_file=Path(paths.cert),
        tls_key_file=Path(paths.key), tls_server_name=None,
    )  # fmt: skip
    return tls_section(settings)
