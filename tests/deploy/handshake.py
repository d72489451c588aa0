"""A TLS handshake between two contexts in memory: what a client of a deployment and the server
it dials would negotiate, without sockets or a running service."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable

from shared.tls import TlsSettings

#: A container or pod address, as a peer dials a pull server (nobody's certificate names it).
PEER_ADDRESS = "10.42.0.17"


def handshake(client: ssl.SSLContext, server: ssl.SSLContext, server_hostname: str) -> None:
    """Runs a full handshake; raises ``ssl.SSLError`` when either side refuses the other."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_out, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    near = client.wrap_bio(to_client, client_out, server_hostname=server_hostname)
    far = server.wrap_bio(to_server, server_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for side, end in (("client", near), ("server", far)):
            if not done[side]:
                try:
                    end.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        to_server.write(client_out.read())
        to_client.write(server_out.read())
        if all(done.values()):
            # TLS 1.3: the server checks the client's certificate after the client is done;
            # a refusal reaches the client as an alert on its first read.
            near.write(b"x")
            to_server.write(client_out.read())
            far.read(1)
            return
    raise AssertionError("the handshake did not finish")


def dial(client: TlsSettings, server: TlsSettings, link: str, host: str) -> None:
    """``client`` opens ``link`` to ``host`` served by ``server``, as the services would: the
    contexts its settings give (``PlaintextRefused`` for a link in clear that would leave the
    host), and the name it checks, its server name if set, else the host."""
    near = client.client_context(link, host)
    far = server.server_context(link, "0.0.0.0")
    assert near is not None and far is not None, f"{link} to {host} would run in clear"
    handshake(near, far, client.tls_server_name or host)


def nats_server_tls(config: str, localize: Callable[[str], str]) -> TlsSettings:
    """The TLS of a NATS server running ``config`` (its ``tls`` block must be mutual and
    handshake-first), with the block's paths passed through ``localize``."""
    (line,) = [row for row in config.splitlines() if row.startswith("tls: ")]
    block = json.loads(localize(line.removeprefix("tls: ")))
    assert block["verify"] is True and block["handshake_first"] is True
    return TlsSettings(
        tls="on",
        tls_ca_file=block["ca_file"],
        tls_cert_file=block["cert_file"],
        tls_key_file=block["key_file"],
    )
