"""Typed wire messages between services (msgspec, JSON on the bus).

Every message carries ``v``, the wire version; a receiver rejects messages from a newer major
version instead of misreading them. Unknown fields are ignored, so a sender may add optional
fields without a version bump.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from shared.sampling_params import SamplingParams

WIRE_VERSION = 1


class WireMessage(msgspec.Struct, kw_only=True):
    v: int = WIRE_VERSION


class SamplingSpec(msgspec.Struct, kw_only=True):
    """The wire form of ``SamplingParams``."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    logprobs: int | None = None
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    ignore_eos: bool = False

    def to_params(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            logprobs=self.logprobs,
            stop_token_ids=tuple(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
        )

    @classmethod
    def from_params(cls, p: SamplingParams) -> SamplingSpec:
        return cls(
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            seed=p.seed,
            logprobs=p.logprobs,
            stop_token_ids=list(p.stop_token_ids),
            ignore_eos=p.ignore_eos,
        )


class GenerateRequest(WireMessage, kw_only=True):
    """One sequence to generate. The gateway turns an OpenAI request with ``n`` choices into
    ``n`` of these (ids ``<id>-0``, ``<id>-1``, ...)."""

    request_id: str
    tenant: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    cache_salt: str = ""
    arrival_ts: float = 0.0


class PullPlan(msgspec.Struct, kw_only=True):
    """Prompt blocks ``first_block .. first_block + num_blocks - 1`` are cached on ``node_id``."""

    node_id: str
    first_block: int
    num_blocks: int


class PrefillTask(WireMessage, kw_only=True):
    """scheduler -> prefill node: compute the prompt, then hand the KV to ``decode_node``.

    ``pulls`` name peers holding blocks of the prompt that this node lacks: it loads them from
    there before computing the rest. ``predicted_ttft_s`` is the scheduler's estimate.
    """

    request: GenerateRequest
    decode_node: str
    pulls: list[PullPlan] = msgspec.field(default_factory=list)
    predicted_ttft_s: float = 0.0


class PinRequest(WireMessage, kw_only=True):
    """prefill node -> peer prefill node: hold these cached blocks (a chain, first block
    first) until I have pulled them."""

    block_hashes: list[bytes]


class PinReply(WireMessage, kw_only=True):
    """The leading blocks of a ``PinRequest`` the peer still had, held under ``lease_id``
    until a ``LeaseRelease`` or the lease's expiry. Empty ``block_ids``: none of them."""

    lease_id: str
    block_ids: list[int]
    block_checksums: list[int]
    transfer_kind: str
    transfer_address: bytes


class TokenLogprob(msgspec.Struct, array_like=True):
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


class KVHandoff(WireMessage, kw_only=True):
    """prefill -> decode: the prompt is computed and its KV waits under ``lease_id``.

    ``block_ids`` are the prefill node's blocks covering the prompt's computed tokens, in
    order; ``block_checksums`` let the decode node verify every pulled block.
    """

    request: GenerateRequest
    first_token: int
    prefill_node: str
    transfer_kind: str
    transfer_address: bytes
    lease_id: str
    block_ids: list[int]
    block_checksums: list[int]
    num_cached_tokens: int = 0


class LeaseRelease(WireMessage, kw_only=True):
    """decode -> prefill: the blocks under ``lease_id`` were pulled or will never be."""

    lease_id: str


class TokenChunk(WireMessage, kw_only=True):
    """Output of one request. ``index`` is the position of ``token_ids[0]`` among the output
    tokens, so a receiver can order chunks from the prefill and the decode node.

    A chunk with ``error`` ends the request; ``error_code`` is an HTTP status (429: overloaded,
    503: no node can serve it) and ``retry_after_s`` tells a rejected client when to try again.
    """

    request_id: str
    index: int
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    error: str | None = None
    error_code: int | None = None
    retry_after_s: float | None = None


class AbortRequest(WireMessage, kw_only=True):
    request_id: str


class StepSample(msgspec.Struct, array_like=True):
    """One engine step: sequences in the batch, tokens computed, context tokens attended
    over (tokens already in the KV cache of the batch), and its wall time."""

    num_seqs: int
    num_tokens: int
    num_context_tokens: int
    seconds: float


class NodeStatus(WireMessage, kw_only=True):
    """A node's heartbeat: who it is, where to pull from it, and how loaded it is.

    ``model_id``, ``block_size`` and ``kv_dtype`` let a scheduler compute the node's block
    hashes; ``step_samples`` are the engine steps since the last beat (the data of the
    scheduler's time model); ``fetch_bandwidth`` is the measured bytes/s of this node's pulls,
    per source node.
    """

    node_id: str
    role: str
    transfer_kind: str = ""
    transfer_address: bytes = b""
    queued_tokens: int = 0
    running_seqs: int = 0
    free_blocks: int = 0
    total_blocks: int = 0
    block_size: int = 32
    draining: bool = False
    ts: float = 0.0
    kv_bytes_sent: int = 0
    kv_bytes_received: int = 0
    pid: int = 0
    model_id: str = ""
    kv_dtype: str = ""
    block_bytes: int = 0
    max_num_batched_tokens: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    step_samples: list[StepSample] = msgspec.field(default_factory=list)
    fetch_bandwidth: dict[str, float] = msgspec.field(default_factory=dict)


M = TypeVar("M", bound=WireMessage)
_encoder = msgspec.json.Encoder()


def encode(message: WireMessage) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes, kind: type[M]) -> M:
    """Parses ``data`` as ``kind``; ``msgspec.ValidationError`` / ``DecodeError`` if malformed,
    ``ValueError`` if it comes from a newer wire version."""
    message = msgspec.json.decode(data, type=kind)
    if message.v > WIRE_VERSION:
        raise ValueError(f"wire version {message.v} is newer than this node's {WIRE_VERSION}")
    return message
