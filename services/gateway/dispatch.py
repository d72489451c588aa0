"""The gateway's side of the bus: hand requests to a scheduler and know they landed, receive
their TokenChunks, watch the nodes that serve them, and answer the nodes' checks.

The bus is passed in (``main`` hands over the connected ``NatsBus``); this module only uses
the ``shared.bus.Bus`` protocol, so it stays free of NATS itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.gateway import errors
from shared import subjects
from shared.background import Background
from shared.bus import Bus, BusRequestError, NoResponders, Subscription
from shared.cluster_messages import NodeStatus
from shared.liveness import Liveness
from shared.messages import (
    AbortRequest,
    GatewayCheck,
    GatewayCheckReply,
    GenerateRequest,
    ReplayReply,
    ReplayRequest,
    SubmitReply,
    TokenChunk,
)
from shared.nats_events import disconnected_node
from shared.stream_auth import chunk_is_authentic, seal_abort

log = logging.getLogger(__name__)
REPLAY_TIMEOUT_S = 1.5
PRUNE_EVERY_S = 10.0


class SubmitTimeout(Exception):
    """A scheduler took the request but did not answer in time: it may have placed it."""


@dataclass(frozen=True, slots=True)
class SubmitPolicy:
    """``no_scheduler_s``: how long "nobody serves requests" is retried before a 503.
    ``reply_timeout_s``: how long one scheduler may take to place a request and answer."""

    no_scheduler_s: float = 1.0
    reply_timeout_s: float = 3.0


@dataclass(slots=True)
class _TokenSubscription:
    """A request's token subscription; ending it forgets the request's stream key."""

    inner: Subscription
    request_id: str
    keys: dict[str, bytes]

    async def unsubscribe(self) -> None:
        self.keys.pop(self.request_id, None)
        await self.inner.unsubscribe()


class Listener(Protocol):
    """A flight, as the dispatcher sees it: told when the bus came back."""

    def bus_reconnected(self) -> None: ...


class Dispatcher:
    """Sends requests on the bus and keeps what the gateway must know to recover them.

    Owns the bus client, this gateway's id, the liveness view of every service (heartbeats
    and disconnect events), the set of request ids in flight (what the nodes' checks are
    answered from) and the background tasks that publish aborts. Invariant: a request id is
    in flight from before its submission until its flight lets it go, so a node never hears
    "unknown" for a request whose client still waits.
    """

    def __init__(
        self,
        bus: Bus,
        gateway_id: str,
        liveness: Liveness | None = None,
        submit: SubmitPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bus = bus
        self.gateway_id = gateway_id
        self.clock = clock
        self.liveness = liveness or Liveness(started_at=clock())
        self.submit_policy = submit or SubmitPolicy()
        self.in_flight: dict[str, Listener] = {}
        self._floors: dict[str, tuple[float, float]] = {}  # scheduler -> (TTFT floor, SLO)
        self._pruned_at = clock()
        self._cleanups = Background()
        self._subscriptions: list[Subscription] = []
        self._stream_keys: dict[str, bytes] = {}  # attempt id -> its stream key
        self.forged_chunks = 0  # chunks dropped because their tag did not verify

    async def start(self) -> None:
        bus = self.bus
        self._subscriptions += [
            await bus.watch(subjects.HEARTBEATS_ALL, NodeStatus, self._on_heartbeat),
            await bus.subscribe_raw(subjects.DISCONNECTS, self._on_disconnect),
            await bus.serve(subjects.gateway_checks(self.gateway_id), GatewayCheck, self._on_check),
        ]
        bus.on_reconnect(self._on_reconnect)

    @property
    def connected(self) -> bool:
        return bool(self.bus.connected)

    def readiness(self) -> tuple[bool, str]:
        """Whether requests can be served now: the bus, a scheduler, a prefill and a decode
        node. The reason names what is missing."""
        if not self.connected:
            return False, "not connected to NATS"
        now = self.clock()
        for role in ("scheduler", "prefill", "decode"):
            if not self.liveness.serving(role, now):
                return False, f"no live {role}"
        return True, ""

    def overloaded(self) -> float | None:
        """Seconds to wait (a Retry-After) when every live scheduler says that even the
        fastest request would miss the TTFT objective now; None otherwise. Refusing here
        costs a request no hop at all, and an overload is when hops are slow."""
        now = self.clock()
        floors = [
            (floor, slo)
            for node_id, (floor, slo) in self._floors.items()
            if self.liveness.alive(node_id, now)
        ]
        if not floors or any(slo <= 0 or floor <= slo for floor, slo in floors):
            return None
        return max(1.0, min(floor - slo for floor, slo in floors))

    async def _on_heartbeat(self, subject: str, status: NodeStatus) -> None:
        if subject != subjects.heartbeats(status.role, status.node_id):
            log.warning("dropped a heartbeat of %s sent on %s", status.node_id, subject)
            return
        if status.role == "scheduler":
            self._floors[status.node_id] = (status.ttft_floor_s, status.ttft_slo_s)
        self._forget_old(self.clock())
        self.liveness.beat(
            status.node_id,
            status.role,
            status.epoch,
            self.clock(),
            healthy=status.healthy,
            draining=status.draining,
        )

    def _forget_old(self, now: float) -> None:
        """Lets services gone for good (replaced under new ids) leave the view."""
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        self.liveness.forget_old(now)
        for node_id in [n for n in self._floors if n not in self.liveness.peers]:
            del self._floors[node_id]

    async def _on_disconnect(self, data: bytes) -> None:
        node_id = disconnected_node(data)
        if node_id is not None and self.liveness.disconnected(node_id, self.clock()) is not None:
            log.info("NATS reports that %s's connection closed", node_id)

    async def _on_check(self, check: GatewayCheck) -> GatewayCheckReply:
        return GatewayCheckReply(unknown=[i for i in check.request_ids if i not in self.in_flight])

    async def _on_reconnect(self) -> None:
        self.liveness.reconnected(self.clock())
        # One flight listens under each of its attempts' ids; tell it once (by identity:
        # flights compare by value and are not hashable).
        for listener in {id(f): f for f in self.in_flight.values()}.values():
            listener.bus_reconnected()

    async def subscribe_tokens(
        self,
        request_id: str,
        handler: Callable[[TokenChunk], Awaitable[None]],
        stream_key: bytes = b"",
    ) -> Subscription:
        """Delivers ``request_id``'s chunks to ``handler``, only those tagged with its
        ``stream_key`` (``shared.stream_auth``); the key also signs the attempt's aborts
        until the subscription ends."""

        async def authentic(chunk: TokenChunk) -> None:
            if chunk_is_authentic(chunk, request_id, stream_key):
                await handler(chunk)
                return
            self.forged_chunks += 1
            log.warning("dropped a chunk of %s not signed with its stream key", request_id)

        self._stream_keys[request_id] = stream_key
        subject = subjects.tokens(request_id)
        inner = await self.bus.subscribe(subject, TokenChunk, authentic)
        return _TokenSubscription(inner, request_id, self._stream_keys)

    async def submit(self, request: GenerateRequest) -> SubmitReply:
        """Hands the request to a scheduler and returns its answer. ``ApiError`` 503 when no
        scheduler runs (after ``no_scheduler_s`` of retries) or the bus is down;
        ``SubmitTimeout`` when a scheduler took it but did not answer."""
        policy = self.submit_policy
        give_up = self.clock() + policy.no_scheduler_s
        while True:
            try:
                return await self.bus.request(
                    subjects.REQUESTS, request, SubmitReply, policy.reply_timeout_s
                )
            except NoResponders:
                if self.clock() >= give_up:
                    raise errors.unavailable("No scheduler is running.") from None
            except BusRequestError as exc:
                raise SubmitTimeout(str(exc)) from exc
            except Exception as exc:  # the connection is down: retried like a missing scheduler
                if self.clock() >= give_up:
                    raise errors.unavailable("The message bus did not accept the request.") from exc
            await asyncio.sleep(0.05)

    async def replay(self, owner: str, request_id: str, from_index: int) -> ReplayReply | None:
        """The owner's record of a request from ``from_index``; None if it did not answer."""
        ask = ReplayRequest(request_id=request_id, from_index=from_index)
        try:
            return await self.bus.request(
                subjects.replays(owner), ask, ReplayReply, REPLAY_TIMEOUT_S
            )
        except Exception as exc:
            log.info("replay of %s from %s failed: %s", request_id, owner, exc)
            return None

    def abort_soon(
        self, request_ids: Sequence[str], subscriptions: Sequence[Subscription], only_node: str = ""
    ) -> None:
        if not request_ids and not subscriptions:
            return
        self._cleanups.spawn(self._cleanup(request_ids, subscriptions, only_node))

    async def _cleanup(
        self, request_ids: Sequence[str], subscriptions: Sequence[Subscription], only_node: str
    ) -> None:
        for request_id in request_ids:
            try:
                abort = AbortRequest(request_id=request_id, only_node=only_node)
                key = self._stream_keys.get(request_id, b"")
                await self.bus.publish(subjects.ABORTS, seal_abort(abort, key))
            except Exception as exc:
                log.warning("could not publish the abort of %s: %s", request_id, exc)
        for subscription in subscriptions:
            try:
                await subscription.unsubscribe()
            except Exception as exc:
                log.debug("unsubscribe failed: %s", exc)

    async def drain(self) -> None:
        """Waits for pending aborts, so that none is lost when the connection closes."""
        await self._cleanups.wait()
        for subscription in self._subscriptions:
            try:
                await subscription.unsubscribe()
            except Exception as exc:
                log.debug("unsubscribe failed: %s", exc)
