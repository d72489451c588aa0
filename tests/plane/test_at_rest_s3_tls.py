"""tierd's S3 tier over https against a real ``weed`` serving a test CA's certificate: it works
with that CA as the bundle, and is refused, within seconds, by a client that does not trust it."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.tierd.s3 import S3Config, S3Store, S3Unavailable
from shared.kv.seal import BlockSeal
from shared.kv.tiers import S3
from tests.support.s3 import WeedS3
from tests.support.s3_tls import S3Tls, make_s3_tls
from tests.tierd.blocks import make_block

SECRET = "s3-tls-test-secret-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> S3Tls:
    return make_s3_tls(Path(tmp_path_factory.mktemp("tls")))


@pytest.fixture(scope="module")
def weed(tmp_path_factory: pytest.TempPathFactory, tls: S3Tls) -> Iterator[WeedS3]:
    server = WeedS3.start(Path(tmp_path_factory.mktemp("weed")), tls=tls)
    try:
        yield server
    finally:
        server.stop()


def _config(weed: WeedS3, ca_bundle: Path | None) -> S3Config:
    return S3Config(
        endpoint=weed.endpoint,
        bucket="tls",
        prefix=f"t-{secrets.token_hex(4)}",
        access_key=weed.access_key,
        secret_key=weed.secret_key,
        ca_bundle=None if ca_bundle is None else str(ca_bundle),
    )


def test_blocks_round_trip_over_https_with_the_ca_bundle(weed: WeedS3, tls: S3Tls) -> None:
    assert weed.endpoint.startswith("https://")
    header, payload = make_block(4096, quota_key=b"tenant-a", secret=SECRET)

    async def scenario() -> None:
        store = S3Store(_config(weed, tls.ca), BlockSeal(SECRET, S3))
        await store.start()
        await store.put(header, payload)
        assert await store.get(header.block_hash) == (header, bytearray(payload))
        await store.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("trust", ["system", "another CA"])
def test_a_certificate_the_client_does_not_trust_is_refused(
    weed: WeedS3, tmp_path: Path, trust: str
) -> None:
    bundle = None if trust == "system" else make_s3_tls(tmp_path / "other", "another CA").ca

    async def scenario() -> None:
        store = S3Store(_config(weed, bundle), BlockSeal(SECRET, S3))
        started = time.monotonic()
        with pytest.raises(S3Unavailable, match=r"(?i)certificate|ssl"):
            await store.start()
        assert time.monotonic() - started < 30
        await store.close()

    asyncio.run(scenario())
