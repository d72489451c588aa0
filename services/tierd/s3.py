"""The S3 tier: one object per block at ``object_key(prefix, hash)`` (``shared.kv.block_file``
format), with an in-memory index of their headers filled by put, delete and ``scan``.

Invariants: at most ``max_concurrency`` requests are in flight; every failure to reach the
server (refused, timed out, credentials refused, server errors) surfaces as ``S3Unavailable``
within seconds, never as a hang or an endless retry; nothing unverified is returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from services.tierd.store_index import BlockIndex, Removed, ScanResult
from shared.errors import CrescentError
from shared.kv import block_file
from shared.kv.block_file import BlockFormatError, BlockHeader
from shared.kv.hashing import HASH_BYTES
from shared.kv.seal import BlockSeal
from shared.kv.tiers import S3
from shared.secrets import DEV_CACHE_SECRET

# One ranged GET reads a whole header of any real block (a few hundred bytes).
_HEADER_PROBE_BYTES = 4096
_MISSING = {"NoSuchKey", "NotFound", "404"}
_BUCKET_MISSING = {"NoSuchBucket", "NotFound", "404"}


@dataclass(frozen=True)
class S3Config:
    """Where the S3 tier keeps its objects, and as whom."""

    endpoint: str
    bucket: str
    prefix: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    max_concurrency: int = 8
    #: A PEM bundle of the CAs an https endpoint's certificate must chain to; None: the
    #: system's. Certificates are always verified.
    ca_bundle: str | None = None
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 5.0


class S3Unavailable(CrescentError):
    """The server could not be reached, timed out or refused us: the caller keeps its data
    elsewhere and retries later."""


def _client_config(config: S3Config) -> AioConfig:
    return AioConfig(
        # Measured on weed mini: unsigned payloads and checksums only where the API requires
        # them save a full pass over every block on put.
        s3={"payload_signing_enabled": False, "addressing_style": "path"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        connect_timeout=config.connect_timeout_s,
        read_timeout=config.read_timeout_s,
        retries={"max_attempts": 2, "mode": "standard"},
        max_pool_connections=config.max_concurrency,
    )


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextlib.contextmanager
def _unavailable(what: str) -> Iterator[None]:
    """Turns transport and server errors into S3Unavailable; ClientErrors the caller expects
    (a missing key) are left to it."""
    try:
        yield
    except ClientError as exc:
        if _code(exc) in _MISSING:
            raise
        raise S3Unavailable(f"S3 {what}: {exc}") from exc
    except (BotoCoreError, aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise S3Unavailable(f"S3 {what}: {type(exc).__name__}: {exc}") from exc


class S3Store:
    """Owns the objects under ``config.prefix`` in ``config.bucket`` and the index of what they
    hold (see the module invariants). Nothing else writes under that prefix."""

    def __init__(self, config: S3Config, seal: BlockSeal | None = None) -> None:
        """``seal`` holds the keys (tierd passes the cache secret's; the default, the public
        development secret's, is for tests and tools)."""
        self.config = config
        self.seal = seal or BlockSeal(DEV_CACHE_SECRET, S3)
        self._index = BlockIndex()
        self._gate = asyncio.Semaphore(config.max_concurrency)
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        prefix = config.prefix.rstrip("/")
        self._list_prefix = f"{prefix}/" if prefix else ""

    @property
    def used_bytes(self) -> int:
        return self._index.used_bytes

    @property
    def num_blocks(self) -> int:
        return len(self._index)

    def contains(self, block_hash: bytes) -> bool:
        return block_hash in self._index

    def headers(self) -> dict[bytes, BlockHeader]:
        return self._index.headers()

    def key_of(self, block_hash: bytes) -> str:
        return block_file.object_key(self.config.prefix, block_hash)

    async def start(self) -> None:
        """Opens the client and makes sure the bucket exists; S3Unavailable if the server
        cannot be reached or refuses us (start may then be called again)."""
        if self._client is not None:
            return
        self._stack = contextlib.AsyncExitStack()
        cfg = self.config
        try:
            self._client = await self._stack.enter_async_context(
                get_session().create_client(
                    "s3",
                    endpoint_url=cfg.endpoint,
                    region_name=cfg.region,
                    aws_access_key_id=cfg.access_key,
                    aws_secret_access_key=cfg.secret_key,
                    config=_client_config(cfg),
                    verify=cfg.ca_bundle or True,
                )
            )
            await self._ensure_bucket()
        except BaseException:
            await self.close()
            raise

    async def _ensure_bucket(self) -> None:
        bucket = self.config.bucket
        # A listing rather than a HEAD: its error body says why a refusal happened.
        with _unavailable("list bucket"):
            try:
                await self._client.list_objects_v2(Bucket=bucket, MaxKeys=1)
                return
            except ClientError as exc:
                if _code(exc) not in _BUCKET_MISSING:
                    raise
        with _unavailable("create bucket"):
            try:
                await self._client.create_bucket(Bucket=bucket)
            except ClientError as exc:
                if _code(exc) not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                    raise

    async def close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    @contextlib.asynccontextmanager
    async def _call(self, what: str) -> AsyncIterator[Any]:
        if self._client is None:
            raise S3Unavailable(f"S3 {what}: the store is not started")
        async with self._gate:
            with _unavailable(what):
                yield self._client

    async def put(self, header: BlockHeader, payload: bytes | memoryview) -> None:
        """Stores (or replaces) a block; BlockFormatError if the payload does not match."""
        data = await asyncio.to_thread(block_file.pack, header, payload, self.seal)
        header = dataclasses.replace(header, encrypted=self.seal.encrypt)
        async with self._call("put") as s3:
            await s3.put_object(
                Bucket=self.config.bucket, Key=self.key_of(header.block_hash), Body=data
            )
        self._index.add(header, len(data))

    async def get(self, block_hash: bytes) -> tuple[BlockHeader, bytearray]:
        """The verified block; KeyError if absent. A corrupt object is deleted (and leaves the
        index) before BlockFormatError is raised."""
        try:
            data = await self._read(block_hash)
        except ClientError:
            self._index.discard(block_hash)
            raise KeyError(block_hash) from None
        try:
            header, payload = await asyncio.to_thread(
                block_file.unpack, data, block_hash, self.seal
            )
        except BlockFormatError:
            await self.delete(block_hash)
            raise
        if block_hash not in self._index:
            self._index.add(header, len(data))
        return header, payload

    async def _read(self, block_hash: bytes, byte_range: str | None = None) -> bytes:
        extra = {"Range": byte_range} if byte_range else {}
        async with self._call("get") as s3:
            response = await s3.get_object(
                Bucket=self.config.bucket, Key=self.key_of(block_hash), **extra
            )
            async with response["Body"] as body:
                return bytes(await body.read())

    async def delete(self, block_hash: bytes) -> bool:
        """Removes the block's object; whether there was one."""
        known = block_hash in self._index
        key = self.key_of(block_hash)
        async with self._call("delete") as s3:
            if not known:
                known = await _exists(s3, self.config.bucket, key)
            await s3.delete_object(Bucket=self.config.bucket, Key=key)
        self._index.discard(block_hash)
        return known

    async def scan(self) -> ScanResult:
        """Rebuilds the index from the objects under the prefix (their headers, by ranged
        GETs), deleting those whose header is unreadable, names another block or disagrees
        with the object's size. Objects whose names are not block hashes are left alone."""
        self._index.clear()
        removed: list[Removed] = []
        ignored: list[str] = []
        async for page in self._pages():
            ours = []
            for item in page.get("Contents", []):
                key, size = item["Key"], int(item["Size"])
                name = key[len(self._list_prefix) :]
                if _is_block_name(name):
                    ours.append((bytes.fromhex(name), key, size))
                else:
                    ignored.append(key)
            ignored.extend(p["Prefix"] for p in page.get("CommonPrefixes", []))
            checks = [self._check_object(h, k, s) for h, k, s in ours]
            removed.extend(r for r in await asyncio.gather(*checks) if r is not None)
        return ScanResult(
            valid=tuple(self._index.headers()),
            valid_bytes=self._index.used_bytes,
            removed=tuple(removed),
            ignored=tuple(ignored),
        )

    async def _pages(self) -> AsyncIterator[dict[str, Any]]:
        if self._client is None:
            raise S3Unavailable("S3 list: the store is not started")
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(
            Bucket=self.config.bucket, Prefix=self._list_prefix, Delimiter="/"
        )
        with _unavailable("list"):
            async for page in pages:
                yield page

    async def _check_object(self, block_hash: bytes, key: str, size: int) -> Removed | None:
        try:
            if size < block_file.PREFIX_BYTES:
                raise BlockFormatError(f"object is {size} bytes, too short for a header")
            header = await self._read_header(block_hash)
            expected = block_file.packed_size(header)
            if size != expected:
                raise BlockFormatError(f"object is {size} bytes, its header says {expected}")
        except ClientError:
            return None  # gone since the listing
        except BlockFormatError as exc:
            await self.delete(block_hash)
            return Removed(key, str(exc))
        self._index.add(header, size)
        return None

    async def _read_header(self, block_hash: bytes) -> BlockHeader:
        data = await self._read(block_hash, f"bytes=0-{_HEADER_PROBE_BYTES - 1}")
        needed = block_file.header_size(data[: block_file.PREFIX_BYTES])
        if needed > len(data):
            data = await self._read(block_hash, f"bytes=0-{needed - 1}")
        header, _ = block_file.decode_header(data, self.seal)
        block_file.verify_identity(header, block_hash)
        return header


async def _exists(s3: Any, bucket: str, key: str) -> bool:
    try:
        await s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if _code(exc) in _MISSING:
            return False
        raise
    return True


def _is_block_name(name: str) -> bool:
    return len(name) == 2 * HASH_BYTES and all(c in "0123456789abcdef" for c in name)
