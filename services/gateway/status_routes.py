"""What the gateway's status routes serve (``main`` registers them): ``GET /status``, the
cluster as JSON (``status.StatusBoard``), and ``GET /dashboard``, a static page that polls it
(no build step). Like ``/metrics``, both are for operators and need no API key: keep the
gateway's port off the public internet or block these paths at the proxy."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.gateway.metrics import GatewayMetrics
from services.gateway.status import StatusBoard
from shared.cluster_messages import NodeStatus

PAGE = Path(__file__).with_name("static") / "dashboard.html"


class StatusFeed:
    """Owns the board, feeds it every heartbeat on the bus (``on_heartbeat``), and makes the
    status document of the moment from it, the metrics' recent requests and ``gateway`` (a
    description of this gateway)."""

    def __init__(
        self,
        board: StatusBoard,
        metrics: GatewayMetrics,
        gateway: Callable[[], dict[str, Any]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.board = board
        self.metrics = metrics
        self.gateway = gateway
        self.clock = clock
        self.page = PAGE.read_text()

    async def on_heartbeat(self, subject: str, status: NodeStatus) -> None:
        self.board.beat(status, self.clock())

    def document(self) -> dict[str, Any]:
        return self.board.snapshot(self.clock(), time.time(), self.metrics.recent, self.gateway())
