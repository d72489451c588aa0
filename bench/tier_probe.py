"""What a running stack keeps below DRAM, seen from outside: the block files in its NVMe
folder, the objects in its S3 bucket, the catalogue's rows and tierd's metrics. The tests
list, read and damage these directly, as an operator (or a failing disk) would."""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import botocore.config
import botocore.session
from botocore.client import BaseClient

from crescent.s3_server import BUCKET, PREFIX, s3_keys
from shared.kv import block_file, block_io
from shared.kv.block_file import BlockHeader
from shared.kv.seal import BlockSeal
from shared.kv.tiers import NVME, S3
from shared.model.tokenizer import Tokenizer
from shared.secrets import read_secret_file


@dataclass
class TierProbe:
    """Reads a stack's tiers through its data dir (``stack.json``, secrets, catalogue)."""

    data_dir: Path

    @property
    def where(self) -> dict[str, str]:
        return dict(json.loads((self.data_dir / "stack.json").read_text()))

    def seal(self, tier: str) -> BlockSeal:
        """The stack's at-rest keys of ``tier`` (from its cache secret), to read its blocks."""
        secret = read_secret_file(self.data_dir / "secrets" / "cache.secret")
        return BlockSeal(secret, tier)

    @property
    def nvme_dir(self) -> Path:
        return Path(self.where["nvme_dir"])

    def s3(self) -> BaseClient:
        keys = s3_keys(self.data_dir / "secrets")
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.where["s3_endpoint"],
            aws_access_key_id=keys.access_key,
            aws_secret_access_key=keys.secret_key,
            region_name="us-east-1",
            config=botocore.config.Config(retries={"max_attempts": 1}, read_timeout=5),
        )

    def nvme_headers(self) -> dict[bytes, BlockHeader]:
        found, seal = {}, self.seal(NVME)
        for path in self.nvme_dir.glob("*/*.blk"):
            block_hash = bytes.fromhex(path.stem)
            try:
                found[block_hash] = block_io.read_header(path, block_hash, seal)[0]
            except (OSError, block_file.BlockFormatError):
                continue  # being written, moved or deleted right now
        return found

    def s3_keys(self) -> list[str]:
        s3, keys = self.s3(), []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys

    def s3_headers(self) -> dict[bytes, BlockHeader]:
        s3, found, seal = self.s3(), {}, self.seal(S3)
        for key in self.s3_keys():
            block_hash = bytes.fromhex(key.rsplit("/", 1)[-1])
            try:
                body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
                header, _ = block_file.decode_header(body, seal)
            except Exception:
                continue
            found[block_hash] = header
        return found

    def rows(self) -> set[tuple[bytes, str, str]]:
        """(block hash, holder, tier) of every replica the catalogue lists."""
        with sqlite3.connect(self.data_dir / "cachemeta.db") as db:
            return {
                (bytes(h), n, t)
                for h, n, t in db.execute("SELECT block_hash, node_id, tier FROM replicas")
            }

    def node_row(self, node_id: str) -> tuple[str, bool] | None:
        """The catalogue's (epoch, needs resync) of a node, None when it lists no such node."""
        with sqlite3.connect(self.data_dir / "cachemeta.db") as db:
            row = db.execute(
                "SELECT epoch, needs_resync FROM nodes WHERE node_id = ?", (node_id,)
            ).fetchone()
        return None if row is None else (str(row[0]), bool(row[1]))

    def corrupt_blocks(self, tier: str) -> float:
        """tierd's count of damaged copies found in ``tier``."""
        with urllib.request.urlopen(self.where["tierd_metrics"], timeout=5) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith("crescent_tierd_corrupt_blocks") and f'tier="{tier}"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def intact(self, block_hash: bytes, tier: str) -> bool:
        """Whether ``tier``'s copy of the block passes every check of a read."""
        try:
            if tier == "nvme":
                path = self.nvme_dir / block_file.file_name(block_hash)
                block_io.read_file(path, block_hash, self.seal(NVME))
                return True
            key = block_file.object_key(PREFIX, block_hash)
            data = self.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read()
            block_file.unpack(data, block_hash, self.seal(S3))
            return True
        except (OSError, block_file.BlockFormatError):
            return False

    def flip_nvme(self, block_hash: bytes) -> None:
        """Flips one byte of the block's payload in its NVMe file."""
        path = self.nvme_dir / block_file.file_name(block_hash)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    def flip_s3(self, block_hash: bytes) -> None:
        """Flips one byte of the block's payload in its S3 object."""
        s3 = self.s3()
        key = block_file.object_key(PREFIX, block_hash)
        data = bytearray(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
        data[len(data) // 2] ^= 0xFF
        s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(data))


def chain_of(marker: str, headers: dict[bytes, BlockHeader], tokenizer: Tokenizer) -> list[bytes]:
    """The hashes of the prompt that starts with ``marker``, first block first, as far as
    ``headers`` hold its chain without a gap."""
    children: dict[bytes, list[bytes]] = {}
    for h in headers.values():
        children.setdefault(h.parent_hash, []).append(h.block_hash)
    firsts = [h for h in headers.values() if marker in tokenizer.decode(list(h.token_ids))]
    if not firsts:
        return []
    chain = [firsts[0].block_hash]
    while len(children.get(chain[-1], [])) == 1:
        chain.append(children[chain[-1]][0])
    return chain


def tiers_of(block_hashes: Iterable[bytes], nvme: set[bytes], s3: set[bytes]) -> dict[str, int]:
    hashes = list(block_hashes)
    return {"nvme": sum(h in nvme for h in hashes), "s3": sum(h in s3 for h in hashes)}
