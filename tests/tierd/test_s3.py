"""The S3 store against a real ``weed mini``."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import pytest

from services.tierd.s3 import S3Config, S3Store, S3Unavailable
from shared.kv import block_file
from shared.kv.block_file import BlockFormatError
from tests.support.s3 import WeedS3, free_port_pairs
from tests.tierd.blocks import S3_SEAL, make_block, make_chain


async def _started(config: S3Config) -> S3Store:
    store = S3Store(config)
    await store.start()
    return store


def test_put_get_delete(s3_config: S3Config, s3_server: WeedS3) -> None:
    async def scenario() -> None:
        store = await _started(s3_config)
        try:
            chain = make_chain(3, num_bytes=5000)
            await asyncio.gather(*(store.put(h, p) for h, p in chain))
            assert store.num_blocks == 3
            assert store.used_bytes == sum(len(block_file.pack(h, p, S3_SEAL)) for h, p in chain)
            assert store.headers() == {h.block_hash: h for h, _ in chain}
            for header, payload in chain:
                assert await store.get(header.block_hash) == (header, bytearray(payload))
            gone = chain[0][0].block_hash
            assert await store.delete(gone) is True
            assert await store.delete(gone) is False
            with pytest.raises(KeyError):
                await store.get(gone)
            assert store.num_blocks == 2 and not store.contains(gone)
        finally:
            await store.close()

    asyncio.run(scenario())
    # Objects land at object_key(prefix, hash) in the configured bucket.
    listed = s3_server.client().list_objects_v2(
        Bucket=s3_config.bucket, Prefix=s3_config.prefix + "/"
    )
    assert len(listed["Contents"]) == 2


def test_an_empty_prefix_keys_objects_by_hash_alone(
    make_s3_config: Callable[..., S3Config], s3_server: WeedS3
) -> None:
    config = make_s3_config(bucket="tierd-flat", prefix="")
    header, payload = make_block(100)

    async def scenario() -> None:
        store = await _started(config)
        await store.put(header, payload)
        await store.close()
        again = await _started(config)
        assert (await again.scan()).valid == (header.block_hash,)
        await again.close()

    asyncio.run(scenario())
    body = s3_server.client().get_object(Bucket="tierd-flat", Key=header.block_hash.hex())
    stored = body["Body"].read()
    assert block_file.unpack(stored, header.block_hash, S3_SEAL) == (header, bytearray(payload))


def test_a_corrupt_object_is_refused_and_deleted(s3_config: S3Config, s3_server: WeedS3) -> None:
    header, payload = make_block(2000)
    key = block_file.object_key(s3_config.prefix, header.block_hash)
    data = bytearray(block_file.pack(header, payload, S3_SEAL))
    data[100] ^= 0x04

    async def scenario() -> None:
        store = await _started(s3_config)
        s3_server.client().put_object(Bucket=s3_config.bucket, Key=key, Body=bytes(data))
        with pytest.raises(BlockFormatError):
            await store.get(header.block_hash)
        with pytest.raises(KeyError):
            await store.get(header.block_hash)
        await store.close()

    asyncio.run(scenario())


def test_scan_indexes_good_objects_and_deletes_bad_ones(
    s3_config: S3Config, s3_server: WeedS3
) -> None:
    chain = make_chain(5, num_bytes=3000)
    prefix = s3_config.prefix
    key = lambda h: block_file.object_key(prefix, h.block_hash)  # noqa: E731
    sync = s3_server.client()

    async def scenario() -> None:
        writer = await _started(s3_config)
        for header, payload in chain:
            await writer.put(header, payload)
        await writer.close()
        # chain[2] truncated, chain[3] garbage, chain[4] an empty object; a valid block
        # under another block's key; keys that are not block hashes stay.
        whole = block_file.pack(*chain[2], S3_SEAL)
        sync.put_object(Bucket=s3_config.bucket, Key=key(chain[2][0]), Body=whole[:-10])
        sync.put_object(Bucket=s3_config.bucket, Key=key(chain[3][0]), Body=b"x" * 50)
        sync.put_object(Bucket=s3_config.bucket, Key=key(chain[4][0]), Body=b"")
        stray = make_block(3000, first_token=999)
        misplaced = f"{prefix}/{'cd' * 16}"
        sync.put_object(
            Bucket=s3_config.bucket, Key=misplaced, Body=block_file.pack(*stray, S3_SEAL)
        )
        sync.put_object(Bucket=s3_config.bucket, Key=f"{prefix}/manifest.json", Body=b"{}")
        sync.put_object(Bucket=s3_config.bucket, Key=f"{prefix}/nested/{'ef' * 16}", Body=b"x")

        store = await _started(s3_config)
        result = await store.scan()
        good = {h.block_hash: h for h, _ in chain[:2]}
        assert set(result.valid) == set(good) and store.headers() == good
        assert (
            result.valid_bytes
            == store.used_bytes
            == sum(len(block_file.pack(*b, S3_SEAL)) for b in chain[:2])
        )
        reasons = {r.name: r.reason for r in result.removed}
        assert set(reasons) == {key(chain[2][0]), key(chain[3][0]), key(chain[4][0]), misplaced}
        assert "header says" in reasons[key(chain[2][0])]
        assert "holds block" in reasons[misplaced]
        assert set(result.ignored) == {f"{prefix}/manifest.json", f"{prefix}/nested/"}
        for header, payload in chain[:2]:
            assert (await store.get(header.block_hash))[1] == payload
        await store.close()

    asyncio.run(scenario())
    left = {
        o["Key"] for o in sync.list_objects_v2(Bucket=s3_config.bucket, Prefix=prefix)["Contents"]
    }
    assert left == {key(h) for h, _ in chain[:2]} | {
        f"{prefix}/manifest.json",
        f"{prefix}/nested/{'ef' * 16}",
    }


def test_scan_reads_a_header_longer_than_one_probe(s3_config: S3Config) -> None:
    header, payload = make_block(100)
    long = dataclasses.replace(header, token_ids=tuple(range(2000)))

    async def scenario() -> None:
        store = await _started(s3_config)
        await store.put(long, payload)
        again = await _started(s3_config)
        assert (await again.scan()).valid == (long.block_hash,)
        assert again.headers()[long.block_hash] == long
        await store.close()
        await again.close()

    asyncio.run(scenario())


def test_a_wrong_secret_is_refused(s3_config: S3Config) -> None:
    store = S3Store(dataclasses.replace(s3_config, secret_key="not-the-secret"))
    with pytest.raises(S3Unavailable, match="SignatureDoesNotMatch"):
        asyncio.run(store.start())
    other = S3Store(dataclasses.replace(s3_config, access_key="nobody"))
    with pytest.raises(S3Unavailable, match="InvalidAccessKeyId"):
        asyncio.run(other.start())


def test_no_server_gives_unavailable_within_seconds(s3_config: S3Config) -> None:
    port = free_port_pairs(1)[0]
    store = S3Store(dataclasses.replace(s3_config, endpoint=f"http://127.0.0.1:{port}"))
    start = time.monotonic()
    with pytest.raises(S3Unavailable):
        asyncio.run(store.start())
    assert time.monotonic() - start < 5


def test_calls_before_start_are_unavailable(s3_config: S3Config) -> None:
    store = S3Store(s3_config)
    header, payload = make_block(10)
    with pytest.raises(S3Unavailable, match="not started"):
        asyncio.run(store.put(header, payload))
    with pytest.raises(S3Unavailable, match="not started"):
        asyncio.run(store.scan())


def test_many_concurrent_puts_through_a_small_gate(s3_config: S3Config) -> None:
    blocks = [make_block(20_000, first_token=i) for i in range(24)]

    async def scenario() -> None:
        store = await _started(dataclasses.replace(s3_config, max_concurrency=2))
        await asyncio.gather(*(store.put(h, p) for h, p in blocks))
        got = await asyncio.gather(*(store.get(h.block_hash) for h, _ in blocks))
        assert [p for _, p in got] == [bytearray(p) for _, p in blocks]
        await store.close()

    asyncio.run(scenario())
