"""TLS on the internal links (NATS, cachemeta's gRPC, KV pulls over TCP): one settings class
every process reads, and the ``ssl`` contexts built from it.

``CRESCENT_TLS`` picks the mode:

- ``auto`` (the default): TLS when a certificate is configured; without one, links in clear
  are allowed to loopback addresses only, and anything else is refused (``PlaintextRefused``).
- ``on``: TLS on every link; the CA, certificate and key files must be given.
- ``off``: every link in clear, wherever it goes: the operator's explicit choice.

TLS here is always mutual: a server asks each client for a certificate signed by the
deployment's CA (``CRESCENT_TLS_CA_FILE``), and a client checks that the server's certificate,
signed by the same CA, names the host it dialled (or ``CRESCENT_TLS_SERVER_NAME``). Every
process presents the same kind of certificate in both roles, so one file pair serves both.
"""

from __future__ import annotations

import functools
import ipaddress
import ssl
from pathlib import Path
from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from shared.errors import CrescentError
from shared.service_settings import ServiceSettings

TlsMode = Literal["auto", "on", "off"]
_LOOPBACK_NAMES = ("localhost", "localhost.")


class PlaintextRefused(CrescentError):
    """A link would carry the internal plane in clear beyond this host: it needs TLS, or
    ``CRESCENT_TLS=off`` to allow it on purpose."""


class TlsSettings(ServiceSettings):
    """The TLS files and mode of one process, shared by all its internal links.

    Invariant: after validation either no file is set, or the CA, certificate and key files
    all are and exist; ``enabled`` is true exactly when the mode is ``on``, or ``auto`` with
    files given.
    """

    tls: TlsMode = Field(
        default="auto",
        description="TLS on NATS, cachemeta's gRPC and TCP pulls: auto (on when a "
        "certificate is set; else clear to loopback only), on, or off (clear everywhere)",
    )
    tls_ca_file: Path | None = Field(
        default=None, description="PEM CA bundle that signs every peer's certificate"
    )
    tls_cert_file: Path | None = Field(
        default=None, description="PEM certificate this process presents, as server and client"
    )
    tls_key_file: Path | None = Field(default=None, description="PEM private key of that cert")
    tls_server_name: str | None = Field(
        default=None,
        description="name checked in servers' certificates instead of the host dialled",
    )

    @model_validator(mode="after")
    def _check_files(self) -> Self:
        files = {
            "CRESCENT_TLS_CA_FILE": self.tls_ca_file,
            "CRESCENT_TLS_CERT_FILE": self.tls_cert_file,
            "CRESCENT_TLS_KEY_FILE": self.tls_key_file,
        }
        given = [name for name, path in files.items() if path is not None]
        if self.tls == "on" and len(given) < len(files):
            raise ValueError("CRESCENT_TLS=on needs " + ", ".join(files))
        if given and len(given) < len(files):
            missing = [name for name in files if name not in given]
            raise ValueError(f"{', '.join(given)} also needs {', '.join(missing)}")
        for name, path in files.items():
            if path is not None and not path.expanduser().is_file():
                raise ValueError(f"the file {name} names does not exist: {path}")
        return self

    @property
    def enabled(self) -> bool:
        return self.tls == "on" or (self.tls == "auto" and self.tls_cert_file is not None)

    def client_context(self, link: str, host: str) -> ssl.SSLContext | None:
        """The context of a connection to ``host`` for ``link`` (named in errors); None for
        clear, which outside loopback only ``CRESCENT_TLS=off`` allows."""
        if not self.enabled:
            self.check_clear(link, host)
            return None
        return _client_context(*self.files())

    def server_context(self, link: str, host: str) -> ssl.SSLContext | None:
        """The context of a server bound to ``host``; None for clear (see ``client_context``)."""
        if not self.enabled:
            self.check_clear(link, host)
            return None
        return _server_context(*self.files())

    def check_clear(self, link: str, host: str) -> None:
        """Raises ``PlaintextRefused`` unless ``link`` may run in clear to (or on) ``host``."""
        if self.tls == "auto" and not is_loopback(host):
            raise PlaintextRefused(
                f"{link} to {host!r} would run without TLS beyond this host: set "
                "CRESCENT_TLS_CA_FILE, CRESCENT_TLS_CERT_FILE and CRESCENT_TLS_KEY_FILE, "
                "or CRESCENT_TLS=off to allow it in clear"
            )

    def pem_files(self) -> tuple[bytes, bytes, bytes]:
        """The CA bundle, certificate and key as bytes (what gRPC's credentials take)."""
        ca, cert, key = self.files()
        return ca.read_bytes(), cert.read_bytes(), key.read_bytes()

    def files(self) -> tuple[Path, Path, Path]:
        if self.tls_ca_file is None or self.tls_cert_file is None or self.tls_key_file is None:
            raise PlaintextRefused("TLS is on but its CA, certificate or key file is not set")
        return (
            self.tls_ca_file.expanduser(),
            self.tls_cert_file.expanduser(),
            self.tls_key_file.expanduser(),
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, brackets allowed) never leaves this machine."""
    host = host.strip().strip("[]").lower()
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def url_host(url: str) -> str:
    """The host of a NATS URL (``nats://h:4222``, ``tls://h``, or a bare ``h:4222``)."""
    parsed = urlsplit(url if "://" in url else f"nats://{url}")
    return parsed.hostname or ""


def target_host(target: str) -> str:
    """The host of a gRPC target (``h:50051``, ``[::1]:50051``, ``dns:///h:50051``)."""
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme) :]
            break
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        host = target  # no port: the whole target is the host
    return host.strip("[]")


def summary(settings: TlsSettings) -> str:
    """One line for a launcher's output: how the internal links travel."""
    if settings.enabled:
        return (
            f"Internal links use mutual TLS (CA {settings.tls_ca_file}): NATS, cachemeta's "
            "gRPC and TCP pulls; UCX pulls are not encrypted"
        )
    if settings.tls == "off":
        return "Internal links run in clear (CRESCENT_TLS=off), whatever their addresses"
    return (
        "Internal links (NATS, cachemeta's gRPC, KV pulls) run in clear on loopback; "
        "CRESCENT_TLS_CA_FILE, _CERT_FILE and _KEY_FILE turn on TLS"
    )


def from_env() -> TlsSettings:
    """This process's settings, read from its environment (a process reads them once in each
    component that opens a link, when it is built)."""
    return TlsSettings()


# Contexts are cached per file triple: loading a key and a CA costs milliseconds, and a
# process opens many connections with the same files. Rotating them means a restart.
@functools.lru_cache(maxsize=8)
def _client_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(str(cert), str(key))
    return context


@functools.lru_cache(maxsize=8)
def _server_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_cert_chain(str(cert), str(key))
    # No session tickets: they would arrive on an idle pull connection after the handshake,
    # out of step with the pull protocol, and connections live long enough not to need them.
    context.num_tickets = 0
    return context
