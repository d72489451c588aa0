"""Certificates for tests: the deployment's CA and certificate, and another CA's, made once
per folder with ``crescent.certs``; and the opt-in that runs test stacks with TLS on."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from crescent.certs import CertFiles, write_cert
from shared.tls import TlsSettings


def settings_of(files: CertFiles, **overrides: object) -> TlsSettings:
    """TLS on with ``files``; ``overrides`` replace some of them (a mismatched pair)."""
    values: dict[str, object] = {
        "tls": "on",
        "tls_ca_file": files.ca,
        "tls_cert_file": files.cert,
        "tls_key_file": files.key,
    }
    return TlsSettings(**(values | overrides))  # type: ignore[arg-type]


@dataclass(frozen=True)
class CertSet:
    """``ours``: the deployment's files (loopback names); ``theirs``: a certificate for the
    same names from an unrelated CA."""

    ours: CertFiles
    theirs: CertFiles

    @classmethod
    def make(cls, directory: Path) -> CertSet:
        return cls(write_cert(directory / "ours", "service"), write_cert(directory / "theirs", "x"))

    def good(self) -> TlsSettings:
        return settings_of(self.ours)

    def foreign_cert(self) -> TlsSettings:
        """Trusts the deployment's CA but presents a certificate of another CA."""
        return settings_of(self.ours, tls_cert_file=self.theirs.cert, tls_key_file=self.theirs.key)

    def foreign_ca(self) -> TlsSettings:
        """Everything from another CA: it trusts only that CA's servers."""
        return settings_of(self.theirs)

    def clear(self) -> TlsSettings:
        return TlsSettings(tls="off")


#: ``CRESCENT_TEST_TLS=1`` runs the test stacks (``tests/chaos``) with TLS on every internal
#: link: NATS, cachemeta's gRPC, and KV pulls over TCP instead of UCX.
TLS_OPT_IN = "CRESCENT_TEST_TLS"


def stack_certs(directory: Path, environ: Mapping[str, str] | None = None) -> CertFiles | None:
    """A certificate for every process of a test stack (loopback names) when the environment
    asks for TLS (``CRESCENT_TEST_TLS``); None otherwise."""
    raw = (os.environ if environ is None else environ).get(TLS_OPT_IN, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return None
    return write_cert(directory, "stack")
