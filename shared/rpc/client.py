"""The cachemeta client: the only code outside the cachemeta service that touches the stubs.

Every call is unary with a deadline and ``wait_for_ready=False``: while the service is down calls
fail fast with ``CacheMetaUnavailable`` instead of queueing, and a channel that lost its server is
replaced, so the first call after the service is back connects at once instead of waiting out
gRPC's reconnect backoff. A channel still connecting is kept for ``CONNECT_GRACE_S``: a call
whose deadline is shorter than the connection's setup (a loaded host, a 100 ms lookup budget)
must not throw the half-made connection away, or every later call would start from scratch.

Every call carries the deployment's token (``authorization: Bearer <token>``) when one is given;
the channel is TLS when ``shared.tls`` turns it on (``shared.rpc.credentials``).
The server caps the lists of one call (``MAX_BLOCKS_PER_CALL`` entries, ``MAX_TOKENS_PER_BLOCK``
token ids per block); this client splits longer registrations, drops and touches into several
calls, and matches at most the first ``MAX_BLOCKS_PER_CALL`` blocks of a chain.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from shared.errors import CrescentError
from shared.lifecycle import Tasks
from shared.rpc import cachemeta_pb2 as pb
from shared.rpc import cachemeta_pb2_grpc as pb_grpc
from shared.rpc.credentials import channel_credentials, open_channel
from shared.rpc.types import (
    BlockRecord,
    CatalogueStats,
    KeepGrant,
    KeepListing,
    NodeInfo,
    PrefixHolder,
    TierCapacity,
)
from shared.tls import TlsSettings, from_env

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Entries of one list in one call (blocks, hashes); more are refused with INVALID_ARGUMENT.
MAX_BLOCKS_PER_CALL = 8192
#: Token ids of one block (the largest block size a node accepts).
MAX_TOKENS_PER_BLOCK = 1024
AUTH_METADATA = "authorization"
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
#: How long a channel may stay CONNECTING before a failed call replaces it: enough for a
#: connection to a live server on a loaded host, far less than gRPC's 20 s connect timeout
#: to an address that never answers.
CONNECT_GRACE_S = 2.0
_UNAVAILABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
)

Reply = TypeVar("Reply")


class CacheMetaUnavailable(CrescentError):
    """cachemeta cannot answer now: unreachable, too slow for the deadline, or its database is
    down. Retrying later may succeed."""


class CacheMetaError(CrescentError):
    """cachemeta refused the call (invalid argument or an internal error); retrying the same
    call will not help."""


class CacheMetaClient:
    """A connection to one cachemeta service.

    Owns one lazily created gRPC channel (replaced after it loses its server) and a semaphore
    that caps the calls in flight on it. Invariant: at most ``max_in_flight`` calls are in
    flight, and every call ends within ``timeout_s`` (or its own timeout), waiting for a free
    slot included.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = 1.0,
        max_in_flight: int = 64,
        token: str | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        """``tls``: default this process's environment; ``PlaintextRefused`` here when the
        channel would run in clear beyond loopback."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.target = target
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self._slots = asyncio.Semaphore(max_in_flight)
        self._channel: grpc.aio.Channel | None = None
        self._channel_born = 0.0  # monotonic time the current channel was made
        self._stub: pb_grpc.CacheMetaStub | None = None
        self._closing = Tasks("cachemeta client")
        self._closed = False
        self._metadata = ((AUTH_METADATA, f"Bearer {token}"),) if token else None
        credentials, options = channel_credentials(target, from_env() if tls is None else tls)
        self._credentials = credentials
        self._options = CHANNEL_OPTIONS + options

    async def register_blocks(
        self, node_id: str, tier: str, blocks: Sequence[BlockRecord], *, replace: bool = False
    ) -> int:
        """Adds replicas of ``blocks`` on ``node_id``/``tier``; with ``replace`` they become the
        node's whole content of that tier. Returns how many replicas were new.

        More than ``MAX_BLOCKS_PER_CALL`` blocks go in several calls, only the first with
        ``replace``: if a later one fails, the catalogue holds a part of the node's blocks
        (never a block the node lacks), and the caller's next snapshot repairs it."""
        chunks = [blocks[i : i + MAX_BLOCKS_PER_CALL] for i in _chunks(len(blocks))]
        total = 0
        for i, chunk in enumerate(chunks):
            total += await self._register(node_id, tier, chunk, replace and i == 0)
        return total

    async def _register(
        self, node_id: str, tier: str, blocks: Sequence[BlockRecord], replace: bool
    ) -> int:
        request = pb.RegisterBlocksRequest(
            node_id=node_id, tier=tier, replace=replace, blocks=[_block_to_pb(b) for b in blocks]
        )
        reply = await self._call("RegisterBlocks", lambda s, t: s.RegisterBlocks(request, **t))
        return int(reply.num_registered)

    async def drop_blocks(self, node_id: str, tier: str, block_hashes: Sequence[bytes]) -> int:
        """Removes replicas on ``node_id``/``tier``; returns how many it had."""
        total = 0
        for i in _chunks(len(block_hashes)):
            total += await self._drop(node_id, tier, block_hashes[i : i + MAX_BLOCKS_PER_CALL])
        return total

    async def _drop(self, node_id: str, tier: str, block_hashes: Sequence[bytes]) -> int:
        request = pb.DropBlocksRequest(node_id=node_id, tier=tier, block_hashes=block_hashes)
        reply = await self._call("DropBlocks", lambda s, t: s.DropBlocks(request, **t))
        return int(reply.num_dropped)

    async def match_prefix(
        self,
        block_hashes: Sequence[bytes],
        *,
        tiers: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> list[PrefixHolder]:
        """Per holder (node, tier) the number of leading blocks of the chain it holds, longest
        first; holders of no leading block are left out, and so are holders outside ``tiers``
        unless it is empty. Only the first ``MAX_BLOCKS_PER_CALL`` blocks are matched."""
        request = pb.MatchPrefixRequest(
            block_hashes=block_hashes[:MAX_BLOCKS_PER_CALL], tiers=tiers
        )
        reply = await self._call("MatchPrefix", lambda s, t: s.MatchPrefix(request, **t), timeout_s)
        return [PrefixHolder(h.node_id, h.tier, h.num_blocks) for h in reply.holders]

    async def touch_blocks(self, block_hashes: Sequence[bytes]) -> int:
        """Records one access of each block; returns how many of them the catalogue knows."""
        total = 0
        for i in _chunks(len(block_hashes)):
            total += await self._touch(block_hashes[i : i + MAX_BLOCKS_PER_CALL])
        return total

    async def _touch(self, block_hashes: Sequence[bytes]) -> int:
        request = pb.TouchBlocksRequest(block_hashes=block_hashes)
        reply = await self._call("TouchBlocks", lambda s, t: s.TouchBlocks(request, **t))
        return int(reply.num_touched)

    async def heartbeat(
        self, node_id: str, role: str, epoch: str, tiers: Sequence[TierCapacity] = ()
    ) -> bool:
        """Says the node is alive. True: the node must re-register everything it holds, each
        tier with ``replace=True`` (it is answered True until it does)."""
        request = pb.HeartbeatRequest(
            node_id=node_id,
            role=role,
            epoch=epoch,
            tiers=[_tier_to_pb(t) for t in tiers],
        )
        reply = await self._call("Heartbeat", lambda s, t: s.Heartbeat(request, **t))
        return bool(reply.resync)

    async def list_nodes(self) -> list[NodeInfo]:
        request = pb.ListNodesRequest()
        reply = await self._call("ListNodes", lambda s, t: s.ListNodes(request, **t))
        return [
            NodeInfo(
                node_id=n.node_id,
                role=n.role,
                epoch=n.epoch,
                last_seen_unix=n.last_seen_unix,
                tiers=[TierCapacity(t.tier, t.capacity_bytes, t.used_bytes) for t in n.tiers],
                num_replicas=n.num_replicas,
            )
            for n in reply.nodes
        ]

    async def stats(self) -> CatalogueStats:
        request = pb.StatsRequest()
        reply = await self._call("Stats", lambda s, t: s.Stats(request, **t))
        return CatalogueStats(
            num_blocks=reply.num_blocks,
            num_replicas=reply.num_replicas,
            num_nodes=reply.num_nodes,
            replica_bytes=reply.replica_bytes,
        )

    async def keep_blocks(
        self,
        quota_key: bytes,
        block_hashes: Sequence[bytes],
        *,
        ttl_s: float = 0.0,
        pin: bool = False,
        max_blocks: int = 0,
    ) -> KeepGrant:
        """Keeps the blocks for the tenant of ``quota_key`` for ``ttl_s`` seconds (or until
        dropped, with ``pin``) if its kept blocks stay within ``max_blocks``; with neither,
        drops their keeps. Only the first ``MAX_BLOCKS_PER_CALL`` hashes are kept (a chain's
        head is what a later prompt reuses)."""
        request = pb.KeepBlocksRequest(
            quota_key=quota_key,
            block_hashes=block_hashes[:MAX_BLOCKS_PER_CALL],
            ttl_s=ttl_s,
            pin=pin,
            max_blocks=max_blocks,
        )
        reply = await self._call("KeepBlocks", lambda s, t: s.KeepBlocks(request, **t))
        return KeepGrant(reply.granted, reply.num_kept, list(reply.new_block_hashes))

    async def list_keeps(self, version: int = 0) -> KeepListing:
        """The keeps in force, unless the ledger is still at ``version``."""
        request = pb.ListKeepsRequest(version=version)
        reply = await self._call("ListKeeps", lambda s, t: s.ListKeeps(request, **t))
        keeps = {k.block_hash: math.inf if k.pinned else k.until_unix for k in reply.keeps}
        return KeepListing(reply.version, reply.changed, keeps)

    async def close(self) -> None:
        self._closed = True
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()
        await self._closing.wait()

    async def _call(
        self,
        method: str,
        invoke: Callable[[pb_grpc.CacheMetaStub, dict[str, Any]], Awaitable[Reply]],
        timeout_s: float | None = None,
    ) -> Reply:
        if self._closed:
            raise CacheMetaUnavailable(f"cachemeta client for {self.target} is closed")
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout)
        except TimeoutError:
            raise CacheMetaUnavailable(
                f"cachemeta at {self.target}: {method} found {self.max_in_flight} calls in "
                f"flight for {timeout:.3g} s"
            ) from None
        try:
            stub, channel = self._connect()
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                options = {"timeout": remaining, "wait_for_ready": False}
                return await invoke(stub, options | {"metadata": self._metadata})
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code in _UNAVAILABLE:
                    self._drop_if_disconnected(channel)
                    raise CacheMetaUnavailable(
                        f"cachemeta at {self.target} unavailable for {method}: "
                        f"{code.name}: {exc.details()}"
                    ) from exc
                raise CacheMetaError(f"cachemeta refused {method}: {exc.details()}") from exc
        finally:
            self._slots.release()

    def _connect(self) -> tuple[pb_grpc.CacheMetaStub, grpc.aio.Channel]:
        if self._channel is None or self._stub is None:
            self._channel = open_channel(self.target, self._credentials, self._options)
            self._channel_born = time.monotonic()
            self._stub = pb_grpc.CacheMetaStub(self._channel)
        return self._stub, self._channel

    def _drop_if_disconnected(self, channel: grpc.aio.Channel) -> None:
        """Replaces a channel that is not connected, so the next call dials at once; one
        that is still making its first connection is left to finish it."""
        current = self._channel
        if current is None or current is not channel:
            return  # already replaced by another call
        state = current.get_state(try_to_connect=False)
        if state == grpc.ChannelConnectivity.READY:
            return  # the server answered UNAVAILABLE itself (e.g. its database is down)
        young = time.monotonic() - self._channel_born < CONNECT_GRACE_S
        if state == grpc.ChannelConnectivity.CONNECTING and young:
            return
        self._channel = None
        self._stub = None
        self._closing.spawn(current.close(grace=self.timeout_s), "close a channel")


def _chunks(count: int) -> range:
    """Where each call's slice starts; one (empty) call for an empty list, since an empty
    ``replace`` registration still means something."""
    return range(0, max(count, 1), MAX_BLOCKS_PER_CALL)


def _block_to_pb(b: BlockRecord) -> pb.Block:
    return pb.Block(
        block_hash=b.block_hash,
        parent_hash=b.parent_hash,
        token_ids=b.token_ids,
        num_bytes=b.num_bytes,
        checksum=b.checksum,
    )


def _tier_to_pb(tier: TierCapacity) -> pb.TierCapacity:
    return pb.TierCapacity(
        tier=tier.tier, capacity_bytes=tier.capacity_bytes, used_bytes=tier.used_bytes
    )
