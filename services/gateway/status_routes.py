"""The gateway's status page: ``GET /status`` (the cluster as JSON, ``status.StatusBoard``) and
``GET /dashboard`` (a static page that polls it; no build step). Like ``/metrics``, both are
for operators and need no API key: keep the gateway's port off the public internet or block
these paths at the proxy."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse

from services.gateway.metrics import GatewayMetrics
from services.gateway.status import StatusBoard
from shared.cluster_messages import NodeStatus

PAGE = Path(__file__).with_name("static") / "dashboard.html"


class StatusFeed:
    """Owns the board and feeds it every heartbeat on the bus (``on_heartbeat``)."""

    def __init__(self, board: StatusBoard, clock: Callable[[], float] = time.monotonic) -> None:
        self.board = board
        self.clock = clock

    async def on_heartbeat(self, subject: str, status: NodeStatus) -> None:
        self.board.beat(status, self.clock())


def add_status_routes(
    app: FastAPI,
    board: StatusBoard,
    metrics: GatewayMetrics,
    gateway: Callable[[], dict[str, Any]],
) -> None:
    """Registers ``/status`` and ``/dashboard``; ``gateway`` describes this gateway."""
    page = PAGE.read_text()

    @app.get("/status", include_in_schema=False)
    async def status() -> JSONResponse:
        snapshot = board.snapshot(time.monotonic(), time.time(), metrics.recent, gateway())
        return JSONResponse(snapshot, headers={"Cache-Control": "no-store"})

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(page)
