"""The test S3 server itself: loopback only, on the ports it was given, several at once, and
it checks credentials."""

from __future__ import annotations

from pathlib import Path

import botocore.exceptions
import pytest

from tests.support.s3 import WeedS3


def test_two_servers_side_by_side_on_their_own_ports(s3_server: WeedS3, tmp_path: Path) -> None:
    other = WeedS3.start(tmp_path / "other")
    try:
        for server in (s3_server, other):
            listening = server.listening()
            assert {port for _, port in listening} == server.all_ports()
            assert len(server.all_ports()) == 10
            assert {address for address, _ in listening} == {"127.0.0.1"}
        assert not set(s3_server.ports.values()) & set(other.ports.values())
        for i, server in enumerate((s3_server, other)):
            client = server.client()
            client.create_bucket(Bucket="side")
            client.put_object(Bucket="side", Key="who", Body=str(i).encode())
        for i, server in enumerate((s3_server, other)):
            assert server.client().get_object(Bucket="side", Key="who")["Body"].read() == (
                str(i).encode()
            )
    finally:
        other.stop()
    assert not other.running


def test_credentials_are_checked(s3_server: WeedS3) -> None:
    s3_server.client().list_buckets()
    with pytest.raises(botocore.exceptions.ClientError, match="SignatureDoesNotMatch"):
        s3_server.client(secret_key="wrong-secret").list_buckets()
