"""The NVMe store on real files in a temp dir."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from services.tierd.nvme import NvmeStore
from services.tierd.store_index import StoreFull
from shared.kv import block_file
from shared.kv.block_file import BlockFormatError, LayoutMismatch
from tests.tierd.blocks import NVME_SEAL, layout_of, make_block, make_chain


def test_put_get_and_the_index(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = NvmeStore(tmp_path, capacity_bytes=1 << 20)
        chain = make_chain(3, num_bytes=1000)
        for header, payload in chain:
            await store.put(header, payload)
        assert store.num_blocks == 3
        files = [store.path_of(h.block_hash) for h, _ in chain]
        assert store.used_bytes == sum(f.stat().st_size for f in files)
        assert files[0].parent.name == chain[0][0].block_hash.hex()[:2]
        for header, payload in chain:
            assert store.contains(header.block_hash)
            assert await store.get(header.block_hash) == (header, bytearray(payload))
        assert store.headers() == {h.block_hash: h for h, _ in chain}

        header, payload = chain[1]
        dest = bytearray(1000)
        assert await store.read_into(header.block_hash, memoryview(dest), layout_of(header)) == (
            header
        )
        assert dest == payload

        assert await store.delete(header.block_hash) is True
        assert await store.delete(header.block_hash) is False
        assert not files[1].exists() and not store.contains(header.block_hash)
        assert store.used_bytes == files[0].stat().st_size + files[2].stat().st_size
        with pytest.raises(KeyError):
            await store.get(header.block_hash)
        with pytest.raises(KeyError):
            await store.read_into(header.block_hash, memoryview(dest), layout_of(header))

    asyncio.run(scenario())


def test_capacity_is_never_exceeded(tmp_path: Path) -> None:
    async def scenario() -> None:
        header, payload = make_block(1000, first_token=50)
        size = block_file.packed_size(header, True)
        store = NvmeStore(tmp_path, capacity_bytes=5 * size)
        blocks = [make_block(1000, first_token=i) for i in range(8)]
        results = await asyncio.gather(
            *(store.put(h, p) for h, p in blocks), return_exceptions=True
        )
        assert sum(isinstance(r, StoreFull) for r in results) == 3
        assert store.used_bytes == 5 * size == store.capacity_bytes
        assert store.free_bytes == 0
        # Replacing a block it holds takes no new room.
        stored = next(h for (h, p), r in zip(blocks, results, strict=True) if r is None)
        await store.put(stored, next(p for h, p in blocks if h == stored))
        assert store.used_bytes == 5 * size and store.num_blocks == 5
        with pytest.raises(StoreFull):
            await store.put(header, payload)

    asyncio.run(scenario())


def test_put_refuses_a_payload_its_header_does_not_describe(tmp_path: Path) -> None:
    header, payload = make_block(100)
    store = NvmeStore(tmp_path, capacity_bytes=1 << 20)
    with pytest.raises(BlockFormatError):
        asyncio.run(store.put(header, payload[1:] + b"x"))
    assert not store.path_of(header.block_hash).exists() and store.used_bytes == 0


def test_a_corrupt_file_is_refused_and_removed(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = NvmeStore(tmp_path, capacity_bytes=1 << 20)
        header, payload = make_block(500)
        await store.put(header, payload)
        path = store.path_of(header.block_hash)
        data = bytearray(path.read_bytes())
        data[-7] ^= 0x10
        path.write_bytes(data)
        with pytest.raises(BlockFormatError, match="authentication"):
            await store.get(header.block_hash)
        assert not path.exists() and not store.contains(header.block_hash)
        assert store.used_bytes == 0

    asyncio.run(scenario())


def test_a_layout_mismatch_keeps_the_file(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = NvmeStore(tmp_path, capacity_bytes=1 << 20)
        header, payload = make_block(500)
        await store.put(header, payload)
        wrong = block_file.Layout("other-model", header.block_size, header.kv_dtype, 500)
        with pytest.raises(LayoutMismatch):
            await store.read_into(header.block_hash, memoryview(bytearray(500)), wrong)
        assert store.contains(header.block_hash)
        assert (await store.get(header.block_hash))[1] == payload

    asyncio.run(scenario())


def test_scan_keeps_good_blocks_and_removes_the_rest(tmp_path: Path) -> None:
    async def scenario() -> None:
        first = NvmeStore(tmp_path, capacity_bytes=1 << 20, fsync=False)
        chain = make_chain(4, num_bytes=300)
        for header, payload in chain:
            await first.put(header, payload)
        good = {h.block_hash for h, _ in chain[:2]}
        # chain[2]: cut short; chain[3]: garbage under its name.
        truncated = first.path_of(chain[2][0].block_hash)
        truncated.write_bytes(truncated.read_bytes()[:-1])
        first.path_of(chain[3][0].block_hash).write_bytes(b"not a block")
        # A valid block under another block's name, and one with an impossible name.
        stray, stray_payload = make_block(300, first_token=777)
        misnamed = tmp_path / block_file.file_name(bytes.fromhex("ab" * 16))
        misnamed.parent.mkdir(exist_ok=True)
        misnamed.write_bytes(block_file.pack(stray, stray_payload, NVME_SEAL))
        (misnamed.parent / "zz.blk").write_bytes(b"")
        leftover = truncated.parent / f".{truncated.stem}.dead.tmp"
        leftover.write_bytes(b"half a block")
        # Not this store's: left alone.
        (tmp_path / "README").write_text("hands off")
        (misnamed.parent / "notes.txt").write_text("hands off")

        store = NvmeStore(tmp_path, capacity_bytes=1 << 20)
        result = await store.scan()
        assert set(result.valid) == good == set(store.headers())
        assert store.headers() == {h.block_hash: h for h, _ in chain[:2]}
        sizes = sum(first.path_of(h).stat().st_size for h in good)
        assert result.valid_bytes == store.used_bytes == sizes
        reasons = {r.name: r.reason for r in result.removed}
        rel = lambda p: p.relative_to(tmp_path).as_posix()  # noqa: E731
        assert set(reasons) == {
            rel(truncated),
            rel(first.path_of(chain[3][0].block_hash)),
            rel(misnamed),
            rel(misnamed.parent / "zz.blk"),
            rel(leftover),
        }
        assert "header says" in reasons[rel(truncated)]
        assert "holds block" in reasons[rel(misnamed)]
        assert "temporary" in reasons[rel(leftover)]
        assert set(result.ignored) == {"README", f"{misnamed.parent.name}/notes.txt"}
        assert all(not (tmp_path / name).exists() for name in reasons)
        assert (tmp_path / "README").exists()
        for header, payload in chain[:2]:
            assert (await store.get(header.block_hash))[1] == payload

    asyncio.run(scenario())


_CRASHING_PUT = """
import asyncio, os, sys, time
from pathlib import Path
from services.tierd import nvme
from tests.tierd.blocks import make_block

def crash_before_rename(src, dst):
    print("written", flush=True)
    time.sleep(60)  # stays between write and rename until the test kills it

nvme.os.replace = crash_before_rename
store = nvme.NvmeStore(Path(sys.argv[1]), capacity_bytes=1 << 30)
header, payload = make_block(1 << 20)
print(header.block_hash.hex(), flush=True)
asyncio.run(store.put(header, payload))
"""


def test_a_crash_mid_put_leaves_no_file_under_the_final_name(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_PUT, str(tmp_path)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert process.stdout is not None
    block_hash = bytes.fromhex(process.stdout.readline().decode().strip())
    assert process.stdout.readline().strip() == b"written"
    process.kill()
    process.wait()
    final = tmp_path / block_file.file_name(block_hash)
    leftovers = list(final.parent.glob("*.tmp"))
    assert not final.exists() and len(leftovers) == 1

    store = NvmeStore(tmp_path, capacity_bytes=1 << 30)
    result = asyncio.run(store.scan())
    assert result.valid == () and [r.name for r in result.removed] == [
        leftovers[0].relative_to(tmp_path).as_posix()
    ]
    assert not leftovers[0].exists()
