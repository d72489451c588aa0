"""A node's upkeep: ending what nobody waits for any more. Leases whose pull never came,
requests past their deadline, and requests whose gateway is gone or forgot them (its client
hung up and the abort was lost, or the gateway itself was killed)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from shared import subjects
from shared.bus import BusRequestError, NoResponders
from shared.messages import GatewayCheck, GatewayCheckReply

if TYPE_CHECKING:
    from shared.node.serving import NodeServing

log = logging.getLogger(__name__)
TICK_S = 0.5
CHECK_TIMEOUT_S = 1.0
#: A gateway that misses this many checks in a row is taken for gone.
MAX_MISSED_CHECKS = 2


class Upkeep:
    """Owns the count of checks each gateway missed in a row.

    Invariant: a request is aborted here only when its deadline passed, its gateway said it
    does not know it, or its gateway could not be reached ``MAX_MISSED_CHECKS`` times running
    (or at once, when NATS says nobody serves that gateway's subject).
    """

    def __init__(self, node: NodeServing) -> None:
        self.node = node
        self.missed: dict[str, int] = {}
        self._last_check = 0.0

    async def tick(self) -> None:
        node = self.node
        await node.blocks.expire()
        node.requests.forget_done(time.monotonic())
        for request_id in node.requests.overdue(time.time()):
            log.info("request %s is past its deadline; stopping it", request_id)
            await node.abort(request_id)
        now = time.monotonic()
        if now - self._last_check >= node.settings.gateway_check_s:
            self._last_check = now
            await self.check_gateways()

    async def check_gateways(self) -> None:
        checks = self.node.requests.by_gateway()
        for gone in set(self.missed) - set(checks):
            del self.missed[gone]
        await asyncio.gather(*(self._check(g, ids) for g, ids in checks.items()))

    async def _check(self, gateway_id: str, request_ids: list[str]) -> None:
        node = self.node
        ask = GatewayCheck(request_ids=request_ids[:4096])
        try:
            reply = await node.bus.request(
                subjects.gateway_checks(gateway_id), ask, GatewayCheckReply, CHECK_TIMEOUT_S
            )
        except NoResponders:
            await self._abort_all(gateway_id, request_ids, "is gone")
            return
        except BusRequestError:
            self.missed[gateway_id] = self.missed.get(gateway_id, 0) + 1
            if self.missed[gateway_id] >= MAX_MISSED_CHECKS:
                await self._abort_all(gateway_id, request_ids, "does not answer")
            return
        self.missed.pop(gateway_id, None)
        for request_id in reply.unknown:
            if request_id in ask.request_ids:
                log.info("gateway %s no longer waits for %s; stopping it", gateway_id, request_id)
                await node.abort(request_id)

    async def _abort_all(self, gateway_id: str, request_ids: list[str], why: str) -> None:
        log.warning("gateway %s %s; stopping its %d requests", gateway_id, why, len(request_ids))
        self.missed.pop(gateway_id, None)
        for request_id in request_ids:
            await self.node.abort(request_id)
