"""What a prefill or decode role may use of its node: this protocol and nothing else (a test
checks the roles' attribute reads against it)."""

from __future__ import annotations

from typing import Protocol

from shared.bus import Bus
from shared.cluster_messages import NodeStatus, TaskAck
from shared.engine.types import RequestOutput
from shared.messages import GenerateRequest, TokenChunk
from shared.node.engine_host import EngineHost
from shared.node.leases import Lease, LeaseTable
from shared.node.metrics import NodeMetrics
from shared.node.puller import BlockPuller
from shared.node.requests import RequestTable
from shared.node.settings import NodeSettings
from shared.sampling_params import SamplingParams


class NodeContext(Protocol):
    """A node as its role sees it: the request and lease tables, the engine host, the bus,
    and the operations on a request's stream that sign, record and end it."""

    settings: NodeSettings
    node_id: str
    requests: RequestTable
    leases: LeaseTable
    host: EngineHost
    bus: Bus
    metrics: NodeMetrics
    puller: BlockPuller
    transfer_address: bytes

    @property
    def block_size(self) -> int: ...

    def screen(
        self, request: GenerateRequest, waiting: int, queue: str
    ) -> TaskAck | SamplingParams: ...

    def ack(self, accepted: bool, reason: str = "", code: int | None = None) -> TaskAck: ...

    async def send(self, chunk: TokenChunk) -> None: ...

    async def fail(self, request_id: str, message: str, code: int) -> None: ...

    async def abort(self, request_id: str, reason: str = "abort") -> None: ...

    async def end_lease(self, lease: Lease) -> None: ...

    async def beat_now(self) -> None: ...


class NodeRole(Protocol):
    """What a prefill or decode service adds to the node."""

    async def on_outputs(self, outputs: list[RequestOutput]) -> None: ...

    async def on_abort(self, request_id: str) -> None:
        """Drops what the role keeps of the request (queued work); the node does the rest."""
        ...

    async def drain(self, deadline: float) -> None:
        """Finishes or hands over what the node holds, by ``deadline`` (monotonic)."""
        ...

    def describe(self, status: NodeStatus) -> None: ...
