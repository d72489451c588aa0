"""Wire messages between the scheduler and the nodes, and between nodes: heartbeats, tasks and
their acknowledgements, KV hand-offs, leases and pins. Same rules as ``shared.messages``: every
field has a range, and a message outside it fails to decode.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from shared.messages import (
    CachedByTier,
    Count,
    GenerateRequest,
    HttpStatus,
    Id,
    OptionalId,
    Seconds,
    ShortText,
    Text,
    Timestamp,
    TokenId,
    TokenLogprob,
    WireMessage,
)

MAX_BLOCKS = 1 << 16
Tier = Annotated[str, Meta(pattern=r"^(dram|nvme|s3)$")]
Hash = Annotated[bytes, Meta(min_length=16, max_length=16)]
BlockId = Annotated[int, Meta(ge=0, lt=1 << 40)]
Checksum = Annotated[int, Meta(ge=0)]  # a uint64: msgspec bounds stop at int64
ByteCount = Annotated[int, Meta(ge=0, le=1 << 62)]
Rate = Annotated[float, Meta(ge=0.0, le=1e15)]
Address = Annotated[bytes, Meta(max_length=16384)]
#: A node's load over its role's objective (1.0: at it).
Ratio = Annotated[float, Meta(ge=0.0, le=1e6)]


#: Running sequences a heartbeat describes at most (those nearest their end).
MAX_FINISHING = 256
#: Nodes a scheduler's heartbeat gives the saturation of at most.
MAX_SATURATION_NODES = 4096
#: Requests a decode node's heartbeat names as arrived since its last one, at most.
MAX_ARRIVED = 256


class TaskAck(WireMessage, kw_only=True):
    """A node's answer to a hand-off (PrefillTask or KVHandoff): it owns the work now, or it
    refused it (``reason``; ``error_code`` set when the request itself is at fault, so trying
    another node is pointless)."""

    accepted: bool
    node_id: Id
    epoch: OptionalId = ""
    reason: Text = ""
    error_code: HttpStatus | None = None


class PullPlan(msgspec.Struct, kw_only=True):
    """Prompt blocks ``first_block .. first_block + num_blocks - 1`` are cached on ``node_id``,
    in ``tier`` (``dram`` for a node's pool; ``nvme`` or ``s3`` for a tierd)."""

    node_id: Id
    first_block: Annotated[int, Meta(ge=0, le=MAX_BLOCKS)]
    num_blocks: Annotated[int, Meta(ge=1, le=MAX_BLOCKS)]
    tier: Tier = "dram"


class PrefillTask(WireMessage, kw_only=True):
    """scheduler -> prefill node: compute the prompt, then hand the KV to the first of
    ``decode_nodes`` that accepts it (they are ranked, best first).

    ``pulls`` name peers holding blocks of the prompt that this node lacks: it loads them from
    there before computing the rest. ``predicted_ttft_s`` is the scheduler's estimate.
    """

    request: GenerateRequest
    decode_nodes: Annotated[list[Id], Meta(min_length=1, max_length=8)]
    pulls: Annotated[list[PullPlan], Meta(max_length=64)] = msgspec.field(default_factory=list)
    predicted_ttft_s: Seconds = 0.0


class PinRequest(WireMessage, kw_only=True):
    """puller -> a node caching blocks: hold these cached blocks (a chain, first block
    first) until I have pulled them. A tierd reads them up from ``tier`` into memory first."""

    block_hashes: Annotated[list[Annotated[bytes, Meta(max_length=64)]], Meta(max_length=8192)]
    tier: Tier = "dram"


class PinReply(WireMessage, kw_only=True):
    """The leading blocks of a ``PinRequest`` the peer still had, held under ``lease_id`` (a
    random token) until a ``LeaseRelease`` or the lease's expiry. Empty ``block_ids``: none.
    ``block_tiers`` (a tierd's reply) names the tier each block was read from; a pool's
    reply leaves it empty (all ``dram``)."""

    lease_id: Annotated[str, Meta(max_length=128)]
    block_ids: Annotated[list[BlockId], Meta(max_length=8192)]
    block_checksums: Annotated[list[Checksum], Meta(max_length=8192)]
    transfer_kind: ShortText
    transfer_address: Address
    block_tiers: Annotated[list[Tier], Meta(max_length=8192)] = msgspec.field(default_factory=list)


class KVHandoff(WireMessage, kw_only=True):
    """prefill -> decode: the prompt is computed and its KV waits under ``lease_id``, a random
    token made for this hand-off alone (never the request id, which is no secret).

    ``block_ids`` are the prefill node's blocks covering the prompt's computed tokens, in
    order; ``block_checksums`` let the decode node verify every pulled block. ``prepared_s``:
    the seconds the prefill node spent between the first token and sending this (the
    checksums), which the decode node adds to its own part when it times the hand-off.
    """

    request: GenerateRequest
    first_token: TokenId
    prefill_node: Id
    transfer_kind: ShortText
    transfer_address: Address
    lease_id: Annotated[str, Meta(min_length=16, max_length=128)]
    block_ids: Annotated[list[BlockId], Meta(max_length=MAX_BLOCKS)]
    block_checksums: Annotated[list[Checksum], Meta(max_length=MAX_BLOCKS)]
    num_cached_tokens: Count = 0
    cached_by_tier: CachedByTier = msgspec.field(default_factory=dict)
    first_logprob: TokenLogprob | None = None
    prepared_s: Seconds = 0.0


class LeaseRelease(WireMessage, kw_only=True):
    """puller -> the holder: the blocks under ``lease_id`` were pulled or will never be."""

    lease_id: Annotated[str, Meta(max_length=128)]


class StepSample(msgspec.Struct, array_like=True):
    """One engine step: sequences in the batch, tokens computed, context tokens attended
    over (tokens already in the KV cache of the batch), and its wall time."""

    num_seqs: Annotated[int, Meta(ge=0, le=1 << 20)]
    num_tokens: Annotated[int, Meta(ge=0, le=1 << 24)]
    num_context_tokens: Annotated[int, Meta(ge=0, le=1 << 32)]
    seconds: Seconds


class NodeStatus(WireMessage, kw_only=True):
    """A service's heartbeat: who it is, whether it takes work, where to pull from it, and how
    loaded it is. Schedulers, gateways and kvindex send one too (role and liveness only).

    ``epoch`` changes whenever the process restarts, so a peer can tell a restarted node from
    the one that held its request. ``healthy`` False: the node's engine is stuck or broken and
    it must get no work; ``draining``: it finishes or hands over what it has and takes nothing
    new. ``model_id``, ``block_size`` and ``kv_dtype`` let a scheduler compute the node's block
    hashes; ``secret_fingerprint`` lets it see that both use the same cache secret.
    ``step_samples`` are the engine steps since the last beat (the data of the scheduler's
    time model); ``fetch_bandwidth`` is the measured bytes/s of this node's pulls, per source.
    ``finishing_seqs`` (decode nodes): ``[tokens it may still generate, tokens in its KV]`` of
    the running sequences nearest their ``max_tokens``, fewest remaining first, at most 256 of
    them; the scheduler predicts from it which sequences will have left by a given time.
    ``ttft_floor_s`` and ``ttft_slo_s`` (schedulers): the shortest time to first token any
    request could get now (a one-token prompt, cached, on the best node) and the objective;
    while the floor is over the objective, a gateway refuses new requests itself.
    ``host_id`` names the machine a service runs on (a tierd serves the nodes of its host);
    ``unsunk_blocks`` (nodes): cached blocks no lower tier holds yet; ``tiers`` (a tierd):
    capacity and use per tier, and ``read_bandwidth`` its measured bytes/s per tier.
    ``ttft_samples`` (prefill nodes): ``[predicted, actual]`` seconds from a task's arrival to
    its first token, for the tasks that got one since the last beat: how far the scheduler's
    predictions are off on this node. ``local_prefill`` (decode nodes): it takes prefill
    tasks of its own (``subjects.local_tasks``); ``handoff_samples`` (decode nodes):
    ``[blocks pulled, seconds]`` of the hand-offs completed since the last beat, from the
    first token on the prefill node to the sequence running here. ``arrived`` (decode nodes):
    the ids of the requests it accepted since its last beat (hand-offs and prompts of its
    own, at most ``MAX_ARRIVED``, the newest), finished since or not: the scheduler stops
    counting them as on their way there, whatever their predicted arrival.
    ``saturation`` and ``role_saturation`` (schedulers): each live prefill and decode node's
    ratio to its role's objective (at most 4096, the most saturated), and each role's figure:
    what the scheduler's gauges ``crescent_saturation`` and ``crescent_role_saturation``
    show, for the status pages.
    """

    node_id: Id
    role: Annotated[str, Meta(pattern=r"^(gateway|scheduler|prefill|decode|tierd|kvindex)$")]
    epoch: OptionalId = ""
    healthy: bool = True
    transfer_kind: ShortText = ""
    transfer_address: Address = b""
    queued_tokens: Count = 0
    running_seqs: Annotated[int, Meta(ge=0, le=1 << 24)] = 0
    free_blocks: Annotated[int, Meta(ge=0, le=1 << 32)] = 0
    total_blocks: Annotated[int, Meta(ge=0, le=1 << 32)] = 0
    block_size: Annotated[int, Meta(ge=1, le=1024)] = 32
    draining: bool = False
    ts: Timestamp = 0.0
    kv_bytes_sent: Count = 0
    kv_bytes_received: Count = 0
    pid: Annotated[int, Meta(ge=0, le=1 << 32)] = 0
    model_id: ShortText = ""
    kv_dtype: Annotated[str, Meta(max_length=32)] = ""
    block_bytes: Annotated[int, Meta(ge=0, le=1 << 34)] = 0
    max_num_batched_tokens: Annotated[int, Meta(ge=0, le=1 << 24)] = 0
    prompt_tokens_computed: Count = 0
    prompt_tokens_cached: Count = 0
    secret_fingerprint: Annotated[str, Meta(max_length=64)] = ""
    step_samples: Annotated[list[StepSample], Meta(max_length=256)] = msgspec.field(
        default_factory=list
    )
    fetch_bandwidth: Annotated[dict[Id, Rate], Meta(max_length=1024)] = msgspec.field(
        default_factory=dict
    )
    host_id: OptionalId = ""
    unsunk_blocks: Annotated[int, Meta(ge=0, le=1 << 32)] = 0
    tiers: Annotated[dict[Tier, tuple[ByteCount, ByteCount]], Meta(max_length=3)] = msgspec.field(
        default_factory=dict
    )
    read_bandwidth: Annotated[dict[Tier, Rate], Meta(max_length=3)] = msgspec.field(
        default_factory=dict
    )
    ttft_floor_s: Seconds = 0.0
    ttft_slo_s: Seconds = 0.0
    ttft_samples: Annotated[list[tuple[Seconds, Seconds]], Meta(max_length=64)] = msgspec.field(
        default_factory=list
    )
    finishing_seqs: Annotated[
        list[tuple[Annotated[int, Meta(ge=0, le=1 << 24)], Annotated[int, Meta(ge=0, le=1 << 32)]]],
        Meta(max_length=MAX_FINISHING),
    ] = msgspec.field(default_factory=list)
    local_prefill: bool = False
    handoff_samples: Annotated[
        list[tuple[Annotated[int, Meta(ge=0, le=MAX_BLOCKS)], Seconds]], Meta(max_length=64)
    ] = msgspec.field(default_factory=list)
    arrived: Annotated[list[Id], Meta(max_length=MAX_ARRIVED)] = msgspec.field(default_factory=list)
    saturation: Annotated[dict[Id, Ratio], Meta(max_length=MAX_SATURATION_NODES)] = msgspec.field(
        default_factory=dict
    )
    role_saturation: Annotated[
        dict[Annotated[str, Meta(pattern=r"^(prefill|decode)$")], Ratio], Meta(max_length=2)
    ] = msgspec.field(default_factory=dict)


class SinkRequest(WireMessage, kw_only=True):
    """tierd -> a node on its host: offer up to ``max_blocks`` of your coldest cached blocks
    that no lower tier holds yet. A new ``epoch`` (tierd restarted) means what the node was
    told is sunk may be gone, so it offers everything again (tierd skips what it holds)."""

    max_blocks: Annotated[int, Meta(ge=1, le=4096)]
    epoch: OptionalId = ""


class SinkBlock(msgspec.Struct, kw_only=True, array_like=True):
    """One offered block: what its file header and catalogue row record. ``quota_key``
    names the tenant whose quota the block counts against (a keyed hash, never the tenant)."""

    block_id: BlockId
    block_hash: Hash
    parent_hash: Hash
    token_ids: Annotated[list[TokenId], Meta(max_length=1024)]
    checksum: Checksum
    quota_key: Annotated[bytes, Meta(max_length=16)] = b""


class SinkOffer(WireMessage, kw_only=True):
    """The node's answer: ``blocks`` held under ``lease_id`` until a ``SinkDone`` (or the
    lease's expiry), pullable from ``transfer_address``. Empty: nothing to sink."""

    lease_id: Annotated[str, Meta(max_length=128)] = ""
    blocks: Annotated[list[SinkBlock], Meta(max_length=4096)] = msgspec.field(default_factory=list)
    transfer_kind: ShortText = ""
    transfer_address: Address = b""
    model_id: ShortText = ""
    kv_dtype: Annotated[str, Meta(max_length=32)] = ""
    block_size: Annotated[int, Meta(ge=1, le=1024)] = 32
    block_bytes: Annotated[int, Meta(ge=0, le=1 << 32)] = 0


class SinkDone(WireMessage, kw_only=True):
    """tierd -> node: the lease of a ``SinkOffer`` ends; ``sunk`` are the blocks now held
    below DRAM (and registered there), which the node need not offer again."""

    lease_id: Annotated[str, Meta(max_length=128)]
    sunk: Annotated[list[Hash], Meta(max_length=4096)] = msgspec.field(default_factory=list)


class PrefetchRequest(WireMessage, kw_only=True):
    """scheduler -> tierd: a request waits for these blocks (a chain, first first) held in a
    lower tier; bring them up to ``to_tier`` meanwhile."""

    block_hashes: Annotated[list[Hash], Meta(max_length=8192)]
    to_tier: Tier = "nvme"


class CorruptBlocks(WireMessage, kw_only=True):
    """A node that read these blocks from tierd's files itself found them damaged. tierd checks
    each again before it drops anything, so a forged report costs a read, never a block."""

    block_hashes: Annotated[list[Hash], Meta(max_length=8192)]
    tier: Tier = "nvme"
