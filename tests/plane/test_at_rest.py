"""Data at rest: blocks on NVMe and in a real S3 server (weed) are encrypted per tenant and
authenticated with the cache secret, and the catalogue's SQLite file keeps no token ids and
is readable by its owner alone.

The attacker here can write the data folder or the bucket but does not hold the cache secret:
every forgery they can make, even one whose xxh3 checksum is right, must be refused and never
served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import stat
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from crescent.processes import spawn
from services.cachemeta.database import create_engine
from services.cachemeta.migrations import upgrade
from services.cachemeta.repository import NodeRecord, Repository
from services.tierd.nvme import NvmeStore
from services.tierd.s3 import S3Config, S3Store
from shared.kv import block_file
from shared.kv.block_file import BlockFormatError
from shared.kv.layout import KVLayout
from shared.kv.seal import BlockSeal
from shared.kv.tiers import NVME, S3
from shared.model.kv_cache import PagedKVCache
from shared.node.direct import DirectReader
from tests.cachemeta.chains import chain
from tests.support.s3 import WeedS3
from tests.tierd.blocks import make_block

SECRET = "at-rest-test-secret-" + secrets.token_hex(8)
# Token ids no random payload is likely to hold, to look for them in stored bytes.
MARKER = 0x5A17C0DE
MARKER_BYTES = struct.pack("<I", MARKER)


@pytest.fixture(scope="module")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeedS3]:
    server = WeedS3.start(Path(tmp_path_factory.mktemp("weed")))
    try:
        yield server
    finally:
        server.stop()


def _s3_config(weed: WeedS3) -> S3Config:
    return S3Config(
        endpoint=weed.endpoint,
        bucket="at-rest",
        prefix=f"t-{secrets.token_hex(4)}",
        access_key=weed.access_key,
        secret_key=weed.secret_key,
    )


def _forged(num_bytes: int = 4096) -> tuple[block_file.BlockHeader, bytes, bytes]:
    """A genuine block, and another payload for the same hash and tenant whose header
    checksum is right: what an attacker who knows the format (not the secret) would write."""
    header, genuine = make_block(
        num_bytes, first_token=MARKER, quota_key=b"tenant-a", secret=SECRET
    )
    poison = bytes(b ^ 0xFF for b in genuine)
    return header, genuine, poison


def test_s3_objects_are_encrypted_and_a_forged_or_flipped_object_is_never_served(
    weed: WeedS3,
) -> None:
    config = _s3_config(weed)
    header, genuine, poison = _forged()
    mallory = BlockSeal("not-the-cache-secret-at-all", S3, encrypt=False)
    forged_header = block_file.BlockHeader(
        **{f: getattr(header, f) for f in ("block_hash", "parent_hash", "token_ids")},
        checksum=mallory.checksum(poison),
        num_bytes=len(poison),
        model_id=header.model_id,
        block_size=header.block_size,
        kv_dtype=header.kv_dtype,
        quota_key=header.quota_key,
    )
    sync = weed.client()

    async def scenario() -> None:
        store = S3Store(config, BlockSeal(SECRET, S3))
        await store.start()
        await store.put(header, genuine)
        key = store.key_of(header.block_hash)
        stored = sync.get_object(Bucket=config.bucket, Key=key)["Body"].read()
        assert MARKER_BYTES not in stored and genuine[:64] not in stored
        assert await store.get(header.block_hash) == (header, bytearray(genuine))

        flipped = bytearray(stored)
        flipped[len(stored) // 2] ^= 0x01
        sync.put_object(Bucket=config.bucket, Key=key, Body=bytes(flipped))
        with pytest.raises(BlockFormatError):
            await store.get(header.block_hash)
        with pytest.raises(KeyError):  # reported corrupt and deleted: never used again
            await store.get(header.block_hash)

        forged = block_file.pack(forged_header, poison, mallory)
        sync.put_object(Bucket=config.bucket, Key=key, Body=forged)
        with pytest.raises(BlockFormatError, match="tag"):
            await store.get(header.block_hash)
        await store.close()

    asyncio.run(scenario())


def test_nvme_files_are_private_encrypted_and_a_forged_file_is_never_served(
    tmp_path: Path,
) -> None:
    header, genuine, poison = _forged()
    root = tmp_path / "nvme"

    async def scenario() -> None:
        store = NvmeStore(root, 1 << 24, fsync=False, seal=BlockSeal(SECRET, NVME))
        await store.put(header, genuine)
        path = store.path_of(header.block_hash)
        for folder in (root, path.parent):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        data = path.read_bytes()
        assert MARKER_BYTES not in data and genuine[:64] not in data

        # A poisoned payload under a header whose checksum matches it, tagged with a key
        # that is not the cluster's, is refused and the file removed.
        mallory = BlockSeal("not-the-cache-secret-at-all", NVME, encrypt=False)
        forged = dataclasses_replace_checksum(header, poison, mallory)
        path.write_bytes(block_file.pack(forged, poison, mallory))
        dest = memoryview(bytearray(len(genuine)))
        layout = block_file.Layout(
            header.model_id, header.block_size, header.kv_dtype, header.num_bytes
        )
        with pytest.raises(BlockFormatError, match="tag"):
            await store.read_into(header.block_hash, dest, layout)
        assert not path.exists()

        await store.put(header, genuine)
        flipped = bytearray(path.read_bytes())
        flipped[-100] ^= 0x80
        path.write_bytes(bytes(flipped))
        with pytest.raises(BlockFormatError):
            await store.get(header.block_hash)
        assert not store.contains(header.block_hash)

    asyncio.run(scenario())


def dataclasses_replace_checksum(
    header: block_file.BlockHeader, payload: bytes, seal: BlockSeal
) -> block_file.BlockHeader:
    """``header`` claiming ``payload``, its checksum computed with ``seal``'s key."""
    return dataclasses.replace(header, checksum=seal.checksum(payload))


def _db_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def test_the_catalogue_file_is_private_and_holds_no_token_ids(tmp_path: Path) -> None:
    path = tmp_path / "cachemeta.db"
    blocks = chain([MARKER] * 16)
    node = NodeRecord("prefill-0", "prefill", "e1", 1.0, False)

    async def scenario() -> None:
        engine = create_engine(f"sqlite+aiosqlite:///{path}")
        try:
            await upgrade(engine)
            await Repository(engine).register(node, "dram", blocks, replace=False, now=1.0)
            assert await Repository(engine).block(blocks[0].block_hash) is not None
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if file.exists():
            assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    assert MARKER_BYTES not in _db_bytes(path)


def test_the_migration_removes_stored_token_ids(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    path.touch(mode=0o644)
    path.chmod(0o644)

    async def scenario() -> None:
        engine = create_engine(f"sqlite+aiosqlite:///{path}")
        try:
            await upgrade(engine, "0002")
            async with engine.begin() as conn:
                await conn.execute(
                    text("INSERT INTO blocks VALUES (:h, :p, :t, 4096, 0, 1.0, 1.0, 0)"),
                    {"h": b"h" * 16, "p": b"p" * 16, "t": MARKER_BYTES * 32},
                )
            await upgrade(engine)
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert MARKER_BYTES not in _db_bytes(path)


def test_service_logs_are_private_even_when_an_older_log_was_not(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    logs.chmod(0o755)
    older = logs / "old.log"
    older.write_text("from an older release\n")
    older.chmod(0o644)
    fresh = spawn("fresh", [sys.executable, "-c", "print('hello')"], {}, logs / "new")
    again = spawn("old", [sys.executable, "-c", "print('again')"], {}, logs)
    for child in (fresh, again):
        assert child.proc.wait(timeout=30) == 0
        assert stat.S_IMODE(child.log_path.stat().st_mode) == 0o600
    assert stat.S_IMODE((logs / "new").stat().st_mode) == 0o700
    assert older.read_text().startswith("from an older release")


def test_a_node_reads_tierd_files_directly_only_with_the_keys_and_never_a_forgery(
    tmp_path: Path,
) -> None:
    layout = KVLayout(num_layers=2, num_kv_heads=1, head_dim=8, block_size=4, dtype="float32")
    cache = PagedKVCache(layout, num_blocks=4)
    block_bytes = layout.block_bytes
    first, genuine = make_block(
        block_bytes, first_token=MARKER, quota_key=b"tenant-a", secret=SECRET
    )
    second, other = make_block(
        block_bytes, parent=first.block_hash, quota_key=b"tenant-a", secret=SECRET
    )
    expected = block_file.Layout(first.model_id, first.block_size, first.kv_dtype, block_bytes)
    seal = BlockSeal(SECRET, NVME)
    store = NvmeStore(tmp_path, 1 << 24, fsync=False, seal=seal)
    asyncio.run(store.put(first, genuine))
    asyncio.run(store.put(second, other))
    hashes = [first.block_hash, second.block_hash]

    keyless = DirectReader(tmp_path, "tierd-a", cache, expected)
    assert not keyless.prefer("tierd-a", None)  # cannot check the files: asks tierd instead
    reader = DirectReader(tmp_path, "tierd-a", cache, expected, seal)
    assert reader.prefer("tierd-a", None)
    read = asyncio.run(reader.read(hashes, [0, 1]))
    assert read.verified == 2 and not read.corrupt
    assert bytes(cache.block_buffer(0)) == genuine and bytes(cache.block_buffer(1)) == other

    # The second file replaced by a forgery whose checksum matches its poisoned payload.
    poison = bytes(b ^ 0x55 for b in other)
    mallory = BlockSeal("not-the-cache-secret-at-all", NVME, encrypt=False)
    forged = dataclasses_replace_checksum(second, poison, mallory)
    store.path_of(second.block_hash).write_bytes(block_file.pack(forged, poison, mallory))
    read = asyncio.run(reader.read(hashes, [2, 3]))
    assert read.verified == 1 and read.corrupt == [second.block_hash]
