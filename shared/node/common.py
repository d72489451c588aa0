"""What prefill and decode nodes share: heartbeats, and the wire form of outputs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from shared import subjects
from shared.bus import Bus
from shared.cluster_messages import NodeStatus
from shared.engine.types import EngineLoad, RequestOutput
from shared.kv.hashing import scope_salt
from shared.messages import GenerateRequest, TokenChunk, TokenLogprob
from shared.model.sampler import TokenLogprobs

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FetchBandwidth:
    """Owns the measured bandwidth of this node's pulls, per source node: an exponentially
    weighted mean of bytes/s over pulls, so one slow pull moves it but does not define it."""

    weight: float = 0.3
    by_source: dict[str, float] = field(default_factory=dict)

    def record(self, source: str, num_bytes: int, seconds: float) -> None:
        if num_bytes <= 0 or seconds <= 0:
            return
        rate = num_bytes / seconds
        old = self.by_source.get(source)
        self.by_source[source] = rate if old is None else old + self.weight * (rate - old)


def to_wire_logprobs(entries: list[TokenLogprobs]) -> list[TokenLogprob] | None:
    if not entries:
        return None
    return [TokenLogprob(e.token_id, e.logprob, list(e.top)) for e in entries]


def output_chunk(out: RequestOutput, num_cached_tokens: int | None = None) -> TokenChunk:
    """The chunk a gateway receives for one step's output of one request."""
    return TokenChunk(
        request_id=out.request_id,
        index=len(out.output_token_ids) - len(out.new_token_ids),
        token_ids=list(out.new_token_ids),
        logprobs=to_wire_logprobs(out.new_logprobs),
        finish_reason=out.finish_reason.value if out.finish_reason is not None else None,
        num_prompt_tokens=out.num_prompt_tokens,
        num_cached_tokens=out.num_cached_tokens if num_cached_tokens is None else num_cached_tokens,
    )


def request_salt(secret: str, request: GenerateRequest) -> bytes:
    """The cache scope of a request: its tenant's, narrowed by its own ``cache_salt``."""
    return scope_salt(secret.encode(), request.tenant, request.cache_salt)


def error_chunk(request_id: str, message: str, code: int) -> TokenChunk:
    """Tells the gateway a request failed; ``code`` is the HTTP status its client should see."""
    return TokenChunk(request_id=request_id, index=0, token_ids=[], error=message, error_code=code)


async def heartbeat_loop(
    bus: Bus,
    interval_s: float,
    status: Callable[[], Awaitable[NodeStatus]],
) -> None:
    """Publishes the node's status every interval until cancelled; a failed beat is logged
    and the next one tried, so a bus hiccup never silences a node for good."""
    while True:
        try:
            beat = await status()
            beat.ts = time.time()
            await bus.publish(subjects.HEARTBEATS, beat)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("heartbeat failed")
        await asyncio.sleep(interval_s)


def node_status(node_id: str, role: str, load: EngineLoad, block_size: int) -> NodeStatus:
    return NodeStatus(
        node_id=node_id,
        role=role,
        queued_tokens=load.queued_tokens,
        running_seqs=load.running_seqs + load.waiting_seqs,
        free_blocks=load.free_blocks,
        total_blocks=load.total_blocks,
        block_size=block_size,
    )
