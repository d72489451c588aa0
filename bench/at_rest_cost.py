"""What keyed integrity and encryption at rest cost: one 1.5 MB KV block (32 tokens of
SmolLM2 in fp32) checksummed as every pull checks it (keyed BLAKE3), sealed and opened, against
the unkeyed checksum blocks carried before and plain MACs, and an NVMe
tier read (files in the page cache, so the CPU's share alone) encrypted and tag-only.

    .venv/bin/python bench/at_rest_cost.py
"""

import asyncio
import hashlib
import hmac
import os
import tempfile
import time
from pathlib import Path

import xxhash

from services.tierd.nvme import NvmeStore
from shared.kv import block_file
from shared.kv.block_file import BlockHeader, Layout
from shared.kv.checksum import BlockChecksum
from shared.kv.seal import BlockSeal
from shared.kv.tiers import NVME

N = 1_474_560  # 32 tokens x 46,080 B (SmolLM2 fp32)
SECRET = "x" * 32
checksum = BlockChecksum(SECRET)
payload = os.urandom(N)
header = BlockHeader(
    os.urandom(16),
    os.urandom(16),
    tuple(range(32)),
    checksum(payload),
    N,
    "m",
    32,
    "float32",
    b"tenant-a",
)


def rate(fn, n: int = 40) -> tuple[float, float]:
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n
    return N / dt / 1e6, dt * 1e3


key = os.urandom(32)
enc, tag = BlockSeal(SECRET, NVME), BlockSeal(SECRET, NVME, encrypt=False)
packed_enc, packed_tag = (
    block_file.pack(header, payload, enc),
    block_file.pack(header, payload, tag),
)
CASES = [
    ("xxh3-64 (unkeyed, before)", lambda: xxhash.xxh3_64_intdigest(payload)),
    ("keyed BLAKE3-64 (block checksum)", lambda: checksum(payload)),
    ("keyed BLAKE2b-128", lambda: hashlib.blake2b(payload, key=key, digest_size=16).digest()),
    ("HMAC-SHA256", lambda: hmac.new(key, payload, hashlib.sha256).digest()),
    ("seal, AES-256-GCM (pack)", lambda: block_file.pack(header, payload, enc)),
    ("seal, HMAC only (pack)", lambda: block_file.pack(header, payload, tag)),
    ("open, AES-256-GCM (unpack)", lambda: block_file.unpack(packed_enc, header.block_hash, enc)),
    ("open, HMAC only (unpack)", lambda: block_file.unpack(packed_tag, header.block_hash, tag)),
]


async def tier_read(seal: BlockSeal | None, root: Path, n: int = 64) -> tuple[float, float]:
    store = NvmeStore(root, 1 << 34, fsync=False, seal=seal)
    for i in range(n):
        h = BlockHeader(
            i.to_bytes(16, "big"),
            bytes(16),
            (),
            header.checksum,
            N,
            "m",
            32,
            "float32",
            b"tenant-a",
        )
        await store.put(h, payload)
    dest = memoryview(bytearray(N))
    layout = Layout("m", 32, "float32", N)
    t = time.perf_counter()
    for _ in range(3):
        for i in range(n):
            await store.read_into(i.to_bytes(16, "big"), dest, layout)
    dt = (time.perf_counter() - t) / (3 * n)
    return N / dt / 1e6, dt * 1e3


def main() -> None:
    for name, fn in CASES:
        mbs, ms = rate(fn)
        print(f"{name:32s} {mbs:7.0f} MB/s  {ms:6.2f} ms/block")
    with tempfile.TemporaryDirectory() as d:
        for name, seal in [("AES-256-GCM", enc), ("HMAC only", tag)]:
            mbs, ms = asyncio.run(tier_read(seal, Path(d) / name.replace(" ", "")))
            print(f"NVMe tier read, {name:17s} {mbs:7.0f} MB/s  {ms:6.2f} ms/block (page cache)")


if __name__ == "__main__":
    main()
