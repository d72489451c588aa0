"""The gRPC adapter of cachemeta: checks the caller's token and requests, calls the catalogue,
translates errors.

A call without the deployment's token is UNAUTHENTICATED before it reaches the servicer. Bad
input — including a list longer than its cap per call — is answered INVALID_ARGUMENT with a
message naming the field; a database failure is UNAVAILABLE (the caller may retry); anything
else is INTERNAL and logged. No request can stop the service.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from services.cachemeta.catalogue import Catalogue
from services.cachemeta.keeps import Keeps
from services.cachemeta.repository import DatabaseUnavailable
from shared.rpc import cachemeta_pb2 as pb
from shared.rpc import cachemeta_pb2_grpc as pb_grpc
from shared.rpc.client import AUTH_METADATA, MAX_BLOCKS_PER_CALL, MAX_TOKENS_PER_BLOCK
from shared.rpc.types import TIERS, BlockRecord, TierCapacity

log = logging.getLogger(__name__)
T = TypeVar("T")
HASH_BYTES = 16
MAX_ID_CHARS = 255
MAX_ROLE_CHARS = 64
MAX_I64 = (1 << 63) - 1
MAX_QUOTA_KEY_BYTES = 64
#: The longest keep a call may ask for (30 days; a pin has no end).
MAX_KEEP_TTL_S = 30 * 86_400.0


class InvalidArgument(ValueError):
    """A request field is out of range; the message says which and why."""


class TokenCheck(grpc.aio.ServerInterceptor):
    """Admits only calls whose metadata carries ``authorization: Bearer <token>``.

    Invariant: a call without the token never reaches the servicer and is counted in
    ``calls`` as UNAUTHENTICATED; the comparison (of digests, so of equal lengths) takes the
    same time whatever was presented.
    """

    def __init__(self, token: str, calls: Counter[tuple[str, str]]) -> None:
        self._expected = _digest(f"Bearer {token}")
        self.calls = calls
        self._deny = grpc.unary_unary_rpc_method_handler(self._refuse)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        metadata = details.invocation_metadata or ()
        given = next((value for key, value in metadata if key == AUTH_METADATA), "")
        if hmac.compare_digest(_digest(given), self._expected):
            return await continuation(details)
        self.calls[(details.method.rpartition("/")[2], "UNAUTHENTICATED")] += 1
        return self._deny

    async def _refuse(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong cachemeta token")


def _digest(value: str | bytes) -> bytes:
    return hashlib.sha256(value.encode() if isinstance(value, str) else value).digest()


class CacheMetaServicer(pb_grpc.CacheMetaServicer):
    """Owns the per-method call counters. Invariant: every call ends with a reply or one of
    INVALID_ARGUMENT, UNAVAILABLE or INTERNAL, and leaves the catalogue serving."""

    def __init__(self, catalogue: Catalogue, keeps: Keeps) -> None:
        self.catalogue = catalogue
        self.keeps = keeps
        self.calls: Counter[tuple[str, str]] = Counter()
        self.seconds: dict[str, float] = {}
        #: Told each call's method and seconds (the metrics' latency histogram), if set.
        self.on_call: Callable[[str, float], None] | None = None

    async def RegisterBlocks(
        self, request: pb.RegisterBlocksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RegisterBlocksReply:
        def check() -> list[BlockRecord]:
            _node_id(request.node_id)
            _tier(request.tier)
            _cap("blocks", len(request.blocks), MAX_BLOCKS_PER_CALL)
            return [_block(i, b) for i, b in enumerate(request.blocks)]

        async def run(records: list[BlockRecord]) -> pb.RegisterBlocksReply:
            count = await self.catalogue.register(
                request.node_id, request.tier, records, replace_all=request.replace
            )
            return pb.RegisterBlocksReply(num_registered=count)

        return await self._serve("RegisterBlocks", context, check, run)

    async def DropBlocks(
        self, request: pb.DropBlocksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DropBlocksReply:
        def check() -> list[bytes]:
            _node_id(request.node_id)
            _tier(request.tier)
            return _hashes(request.block_hashes)

        async def run(hashes: list[bytes]) -> pb.DropBlocksReply:
            count = await self.catalogue.drop(request.node_id, request.tier, hashes)
            return pb.DropBlocksReply(num_dropped=count)

        return await self._serve("DropBlocks", context, check, run)

    async def MatchPrefix(
        self, request: pb.MatchPrefixRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.MatchPrefixReply:
        def check() -> tuple[list[bytes], list[str]]:
            tiers = list(request.tiers)
            _cap("tiers", len(tiers), len(TIERS))
            for tier in tiers:
                _tier(tier)
            return _hashes(request.block_hashes), tiers

        async def run(query: tuple[list[bytes], list[str]]) -> pb.MatchPrefixReply:
            reply = pb.MatchPrefixReply()
            add = reply.holders.add  # faster than building the messages apart
            for node_id, tier, num_blocks in self.catalogue.match_counts(*query):
                add(node_id=node_id, tier=tier, num_blocks=num_blocks)
            return reply

        return await self._serve("MatchPrefix", context, check, run)

    async def TouchBlocks(
        self, request: pb.TouchBlocksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.TouchBlocksReply:
        async def run(hashes: list[bytes]) -> pb.TouchBlocksReply:
            return pb.TouchBlocksReply(num_touched=self.catalogue.touch(hashes))

        return await self._serve("TouchBlocks", context, lambda: _hashes(request.block_hashes), run)

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.HeartbeatReply:
        def check() -> list[TierCapacity]:
            _node_id(request.node_id)
            _text("role", request.role, MAX_ROLE_CHARS, allow_empty=True)
            _text("epoch", request.epoch, MAX_ID_CHARS, allow_empty=False)
            return _tiers(request.tiers)

        async def run(tiers: list[TierCapacity]) -> pb.HeartbeatReply:
            resync = await self.catalogue.heartbeat(
                request.node_id, request.role, request.epoch, tiers
            )
            return pb.HeartbeatReply(resync=resync)

        return await self._serve("Heartbeat", context, check, run)

    async def ListNodes(
        self, request: pb.ListNodesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListNodesReply:
        async def run(_: None) -> pb.ListNodesReply:
            nodes = [
                pb.NodeInfo(
                    node_id=n.node_id,
                    role=n.role,
                    epoch=n.epoch,
                    last_seen_unix=n.last_seen_unix,
                    tiers=[
                        pb.TierCapacity(
                            tier=t.tier, capacity_bytes=t.capacity_bytes, used_bytes=t.used_bytes
                        )
                        for t in n.tiers
                    ],
                    num_replicas=n.num_replicas,
                )
                for n in self.catalogue.list_nodes()
            ]
            return pb.ListNodesReply(nodes=nodes)

        return await self._serve("ListNodes", context, lambda: None, run)

    async def Stats(
        self, request: pb.StatsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.StatsReply:
        async def run(_: None) -> pb.StatsReply:
            s = self.catalogue.stats()
            return pb.StatsReply(
                num_blocks=s.num_blocks,
                num_replicas=s.num_replicas,
                num_nodes=s.num_nodes,
                replica_bytes=s.replica_bytes,
            )

        return await self._serve("Stats", context, lambda: None, run)

    async def KeepBlocks(
        self, request: pb.KeepBlocksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.KeepBlocksReply:
        def check() -> list[bytes]:
            if not 0 < len(request.quota_key) <= MAX_QUOTA_KEY_BYTES:
                raise InvalidArgument(f"quota_key must be 1 to {MAX_QUOTA_KEY_BYTES} bytes long")
            if not 0.0 <= request.ttl_s <= MAX_KEEP_TTL_S:  # NaN fails this too
                raise InvalidArgument(f"ttl_s must be between 0 and {MAX_KEEP_TTL_S:g}")
            return _hashes(request.block_hashes)

        async def run(hashes: list[bytes]) -> pb.KeepBlocksReply:
            grant = await self.keeps.keep(
                request.quota_key,
                hashes,
                ttl_s=request.ttl_s,
                pin=request.pin,
                max_blocks=request.max_blocks,
            )
            return pb.KeepBlocksReply(
                granted=grant.granted,
                num_kept=grant.num_kept,
                new_block_hashes=grant.new_block_hashes,
            )

        return await self._serve("KeepBlocks", context, check, run)

    async def ListKeeps(
        self, request: pb.ListKeepsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListKeepsReply:
        async def run(_: None) -> pb.ListKeepsReply:
            version, changed, keeps = self.keeps.listing(request.version)
            reply = pb.ListKeepsReply(version=version, changed=changed)
            add = reply.keeps.add
            for block_hash, until in keeps.items():
                pinned = until == math.inf
                add(block_hash=block_hash, until_unix=0.0 if pinned else until, pinned=pinned)
            return reply

        return await self._serve("ListKeeps", context, lambda: None, run)

    async def _serve(
        self,
        method: str,
        context: grpc.aio.ServicerContext[Any, Any],
        check: Callable[[], T],
        run: Callable[[T], Awaitable[Any]],
    ) -> Any:
        started = time.perf_counter()
        code, message = grpc.StatusCode.CANCELLED, "cancelled"  # unless it ends otherwise
        try:
            reply = await run(check())
            code = grpc.StatusCode.OK
            return reply
        except InvalidArgument as exc:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        except DatabaseUnavailable as exc:
            code, message = grpc.StatusCode.UNAVAILABLE, str(exc)
            log.warning("%s: %s", method, message)
        except Exception:
            log.exception("%s failed", method)
            code, message = grpc.StatusCode.INTERNAL, "internal error in cachemeta (see its log)"
        finally:
            self.calls[(method, code.name)] += 1
            seconds = time.perf_counter() - started
            self.seconds[method] = self.seconds.get(method, 0.0) + seconds
            if self.on_call is not None:
                self.on_call(method, seconds)
        await context.abort(code, message)
        raise AssertionError("abort returned")


def _text(name: str, value: str, max_chars: int, *, allow_empty: bool) -> None:
    if not value and not allow_empty:
        raise InvalidArgument(f"{name} must not be empty")
    if len(value) > max_chars:
        raise InvalidArgument(f"{name} is {len(value)} characters long; at most {max_chars}")


def _node_id(value: str) -> None:
    _text("node_id", value, MAX_ID_CHARS, allow_empty=False)
    if value != value.strip():
        raise InvalidArgument(f"node_id {value!r} has leading or trailing whitespace")


def _tier(value: str) -> None:
    if value not in TIERS:
        raise InvalidArgument(f"tier {value!r} is not one of {', '.join(TIERS)}")


def _hash_error(name: str, value: bytes) -> InvalidArgument:
    return InvalidArgument(f"{name} is {len(value)} bytes long; a block hash is {HASH_BYTES}")


def _cap(name: str, count: int, cap: int) -> None:
    # Checked before anything else is: a call's cost grows with its lists.
    if count > cap:
        raise InvalidArgument(f"{name} has {count} entries; at most {cap} per call")


def _hashes(values: Sequence[bytes]) -> list[bytes]:
    _cap("block_hashes", len(values), MAX_BLOCKS_PER_CALL)
    hashes = list(values)
    if hashes and set(map(len, hashes)) != {HASH_BYTES}:  # the loop below only on error
        for i, value in enumerate(hashes):
            if len(value) != HASH_BYTES:
                raise _hash_error(f"block_hashes[{i}]", value)
    return hashes


def _block(i: int, block: pb.Block) -> BlockRecord:
    block_hash, parent_hash = block.block_hash, block.parent_hash
    if len(block_hash) != HASH_BYTES:
        raise _hash_error(f"blocks[{i}].block_hash", block_hash)
    if len(parent_hash) != HASH_BYTES:
        raise _hash_error(f"blocks[{i}].parent_hash", parent_hash)
    if len(block.token_ids) > MAX_TOKENS_PER_BLOCK:
        raise InvalidArgument(
            f"blocks[{i}].token_ids has {len(block.token_ids)} ids; at most "
            f"{MAX_TOKENS_PER_BLOCK} per block"
        )
    if block.num_bytes > MAX_I64:
        raise InvalidArgument(f"blocks[{i}].num_bytes {block.num_bytes} is too large")
    # Token ids are accepted from older clients but dropped here: nothing keeps or needs them.
    return BlockRecord(block_hash, parent_hash, (), block.num_bytes, block.checksum)


def _tiers(values: Sequence[pb.TierCapacity]) -> list[TierCapacity]:
    _cap("tiers", len(values), len(TIERS))
    tiers = []
    for t in values:
        _tier(t.tier)
        if max(t.capacity_bytes, t.used_bytes) > MAX_I64:
            raise InvalidArgument(f"tier {t.tier}: byte counts must be below 2**63")
        tiers.append(TierCapacity(t.tier, t.capacity_bytes, t.used_bytes))
    if len({t.tier for t in tiers}) != len(tiers):
        raise InvalidArgument("tiers lists a tier more than once")
    return tiers
