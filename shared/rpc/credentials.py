"""gRPC's side of ``shared.tls``: the credentials of cachemeta's port and of its clients.

With TLS on, the server presents the process's certificate and requires each client to present
one signed by the deployment's CA; a client checks the server's certificate against the same CA
and the host it dials (or ``CRESCENT_TLS_SERVER_NAME``). The bearer token of every call
(``shared.rpc.client``) still decides who may call: TLS keeps it and the catalogue private.
"""

from __future__ import annotations

from typing import Any

import grpc

from shared.tls import TlsSettings, target_host

LINK = "cachemeta's gRPC"
ChannelOptions = list[tuple[str, Any]]


def channel_credentials(
    target: str, tls: TlsSettings
) -> tuple[grpc.ChannelCredentials | None, ChannelOptions]:
    """Credentials and extra options of a channel to ``target``; no credentials for a
    channel in clear, which ``tls`` refuses beyond loopback (``PlaintextRefused``)."""
    if not tls.enabled:
        tls.check_clear(LINK, target_host(target))
        return None, []
    ca, cert, key = tls.pem_files()
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )
    options: ChannelOptions = []
    if tls.tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls.tls_server_name))
    return credentials, options


def open_channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: ChannelOptions
) -> grpc.aio.Channel:
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)


def add_port(server: grpc.aio.Server, host: str, port: int, tls: TlsSettings) -> int:
    """Opens ``host:port`` on ``server``, with TLS when ``tls`` says so; returns the port
    bound (0 when it could not be). ``PlaintextRefused`` for a port in clear beyond loopback."""
    address = f"{host}:{port}"
    if not tls.enabled:
        tls.check_clear(LINK, host)
        return server.add_insecure_port(address)
    ca, cert, key = tls.pem_files()
    credentials = grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )
    return server.add_secure_port(address, credentials)
