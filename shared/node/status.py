"""What a node's heartbeat says of its engine, pool and transfers: filled from one load
snapshot of the engine thread, so the figures of one beat belong together."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.cluster_messages import NodeStatus, StepSample
from shared.engine.types import StepTiming

if TYPE_CHECKING:
    from shared.node.direct import DirectReader
    from shared.node.engine_host import EngineHost, LoadSnapshot
    from shared.node.puller import BlockPuller
    from shared.transfer.base import TransferServer


def fill_status(
    status: NodeStatus,
    snap: LoadSnapshot,
    engine: EngineHost,
    puller: BlockPuller,
    server: TransferServer,
    direct: DirectReader | None,
) -> None:
    """Writes the engine's load and speed, and the node's transfer figures, into ``status``."""
    load, stats = snap.load, snap.stats
    status.queued_tokens = load.queued_tokens
    status.running_seqs = load.running_seqs + load.waiting_seqs
    status.free_blocks = load.free_blocks
    status.total_blocks = load.total_blocks
    status.model_id = engine.model_id
    status.kv_dtype = engine.config.kv_dtype
    status.block_bytes = engine.block_bytes
    status.max_num_batched_tokens = engine.config.max_num_batched_tokens
    status.step_samples = [_sample(t) for t in snap.timings]
    status.prompt_tokens_computed = stats.prompt_tokens_computed
    status.prompt_tokens_cached = stats.prompt_tokens_cached + stats.prompt_tokens_imported
    measured = dict(puller.bandwidth.by_source)
    status.fetch_bandwidth = measured if direct is None else direct.merged(measured)
    status.kv_bytes_sent = server.bytes_sent
    status.kv_bytes_received = puller.bytes_received
    status.finishing_seqs = snap.finishing
    status.unsunk_blocks = snap.unsunk_blocks


def _sample(t: StepTiming) -> StepSample:
    return StepSample(t.num_seqs, t.num_tokens, t.num_context_tokens, t.seconds)
