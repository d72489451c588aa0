"""The ``tls`` block of a NATS server configuration (``crescent.nats_config``).

Mutual TLS: the server presents its certificate and asks every client for one signed by the
deployment's CA (``verify``). The handshake comes first (``handshake_first``): a client never
reads the server's INFO in clear, so nothing on the path can tell it that TLS is not required
and keep the connection in clear; a client that does not start with TLS gets no answer.
Clients connect with ``tls_handshake_first`` (``shared.bus``).
"""

from __future__ import annotations

from shared.tls import TlsSettings, from_env

#: Seconds a client has to complete the handshake.
HANDSHAKE_TIMEOUT_S = 2


def tls_section(settings: TlsSettings | None = None) -> dict[str, object]:
    """``{"tls": {...}}`` for a server configuration when ``settings`` (default: this
    process's environment) turn TLS on; an empty dict otherwise."""
    tls = from_env() if settings is None else settings
    if not tls.enabled:
        return {}
    ca, cert, key = tls.files()
    block: dict[str, object] = {
        "cert_file": str(cert),
        "key_file": str(key),
        "ca_file": str(ca),
        "verify": True,
        "handshake_first": True,
        "timeout": HANDSHAKE_TIMEOUT_S,
    }
    return {"tls": block}
