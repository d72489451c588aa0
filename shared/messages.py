"""Typed wire messages of a request's path (msgspec, JSON on the bus): what the gateway sends,
what comes back, and the checks that keep a stream whole. The cluster's own messages
(heartbeats, hand-offs between nodes, pins) are in ``shared.cluster_messages``.

Every message carries ``v``, the wire version; a receiver rejects messages from a newer major
version instead of misreading them. Unknown fields are ignored, so a sender may add optional
fields without a version bump.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, TypeVar

import msgspec
from msgspec import Meta

from shared.sampling_params import (
    MAX_GRAMMAR_CHARS,
    MAX_KEEP_TTL_S,
    MAX_PRIORITY,
    MAX_TBT_SLO_S,
    MAX_TENANT_WEIGHT,
    SamplingParams,
)

WIRE_VERSION = 2

# Range limits of wire fields. A message outside them fails to decode, so a forged or absurd
# value is dropped at the edge (and logged by the bus) instead of reaching any decision.
Id = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_\-]{1,160}$")]
OptionalId = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_\-]{0,160}$")]
Count = Annotated[int, Meta(ge=0, le=1 << 40)]
#: Cached prompt tokens split by the tier they were found in (``dram``, ``nvme``, ``s3``).
CachedByTier = Annotated[
    dict[Annotated[str, Meta(pattern=r"^(dram|nvme|s3)$")], Count], Meta(max_length=3)
]
TokenId = Annotated[int, Meta(ge=0, lt=1 << 31)]
Seconds = Annotated[float, Meta(ge=0.0, le=1e7)]
#: Durations of a request's phases on one node, by phase name (``shared.phases``).
Phases = Annotated[
    dict[Annotated[str, Meta(pattern=r"^[a-z_]{1,32}$")], Seconds], Meta(max_length=16)
]
Timestamp = Annotated[float, Meta(ge=0.0, le=1e11)]
HttpStatus = Annotated[int, Meta(ge=400, le=599)]
Text = Annotated[str, Meta(max_length=4096)]
#: A per-request key or a tag made with one (``shared.stream_auth``).
StreamTag = Annotated[bytes, Meta(max_length=64)]
ShortText = Annotated[str, Meta(max_length=256)]
MAX_PROMPT_TOKENS = 1 << 20
#: ``SubmitReply.error_kind`` of a keep refused because the tenant's kept blocks would exceed
#: its quota (the gateway answers OpenAI's ``insufficient_quota``).
QUOTA = "insufficient_quota"


class WireMessage(msgspec.Struct, kw_only=True):
    v: int = WIRE_VERSION


class SamplingSpec(msgspec.Struct, kw_only=True):
    """The wire form of ``SamplingParams`` (whose checks run again when a node converts it).

    ``output_offset`` is the position of this sequence's first token in the whole completion:
    0, except for a request resumed after its first node was lost, whose seeded draws then
    continue exactly where they stopped.
    """

    max_tokens: Annotated[int, Meta(ge=1, le=MAX_PROMPT_TOKENS)]
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Meta(ge=-1, le=1 << 31)] = 0
    seed: Annotated[int, Meta(ge=0, le=(1 << 63) - 1)] | None = None
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    stop_token_ids: Annotated[list[TokenId], Meta(max_length=1024)] = msgspec.field(
        default_factory=list
    )
    ignore_eos: bool = False
    output_offset: Annotated[int, Meta(ge=0, le=MAX_PROMPT_TOKENS)] = 0
    # Rules over what was generated (``shared.model.logits_processing``); a node older than
    # these fields ignores them.
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] = 0.0
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] = 0.0
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] = 1.0
    logit_bias: Annotated[
        list[tuple[TokenId, Annotated[float, Meta(ge=-100.0, le=100.0)]]], Meta(max_length=1024)
    ] = msgspec.field(default_factory=list)
    min_tokens: Annotated[int, Meta(ge=0, le=MAX_PROMPT_TOKENS)] = 0
    grammar: Annotated[str, Meta(max_length=MAX_GRAMMAR_CHARS)] = ""
    cache_read: bool = True
    cache_write: bool = True
    # Keeping the prompt's blocks (``SamplingParams.keep``); the scheduler records it in the
    # catalogue's ledger before the request is placed.
    keep: Annotated[str, Meta(pattern=r"^(|ttl|pin|drop)$")] = ""
    keep_ttl_s: Annotated[float, Meta(ge=0.0, le=MAX_KEEP_TTL_S)] = 0.0
    # When the prompt is computed on its node (``shared.engine.prefill_order``).
    priority: Annotated[int, Meta(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] = 0
    ttft_deadline: Timestamp = 0.0
    # The tenant's share weight on the node, and the time between tokens asked of placement.
    tenant_weight: Annotated[float, Meta(gt=0.0, le=MAX_TENANT_WEIGHT)] = 1.0
    tbt_slo_s: Annotated[float, Meta(ge=0.0, le=MAX_TBT_SLO_S)] = 0.0

    def to_params(self) -> SamplingParams:
        values = msgspec.structs.asdict(self)
        values["stop_token_ids"] = tuple(self.stop_token_ids)
        values["logit_bias"] = tuple((t, b) for t, b in self.logit_bias)
        return SamplingParams(**values)

    @classmethod
    def from_params(cls, p: SamplingParams) -> SamplingSpec:
        # The two carry the same fields; only the sequence types differ.
        values = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
        values["stop_token_ids"] = list(p.stop_token_ids)
        values["logit_bias"] = list(p.logit_bias)
        return cls(**values)


class GenerateRequest(WireMessage, kw_only=True):
    """One sequence to generate. The gateway turns an OpenAI request with ``n`` choices into
    ``n`` of these (ids ``<id>-0``, ``<id>-1``, ...); a resumed one gets a new id
    (``<id>-0-r1``), its prompt extended by the tokens the client already has.

    ``gateway_id`` names the gateway whose client waits (nodes check it is still there);
    ``deadline_ts`` is the wall-clock time after which nobody waits (0: none); ``resume``
    marks the continuation of an accepted request, which admission control never refuses.
    ``traceparent`` is the W3C trace context of the span that sent it (``shared.tracing``;
    empty while tracing is off), so each service's spans of the request join one trace.
    """

    request_id: Id
    tenant: ShortText
    prompt_token_ids: Annotated[list[TokenId], Meta(min_length=1, max_length=MAX_PROMPT_TOKENS)]
    sampling: SamplingSpec
    cache_salt: ShortText = ""
    arrival_ts: Timestamp = 0.0
    gateway_id: OptionalId = ""
    deadline_ts: Timestamp = 0.0
    resume: bool = False
    traceparent: Annotated[str, Meta(max_length=128)] = ""
    # The key that tags this request's output and aborts (``shared.stream_auth``); only the
    # services the request is handed to ever see it.
    stream_key: StreamTag = b""


#: A request's timeouts (the gateway's, and ``deadline_ts`` on the nodes) are extended by
#: this many times the scheduler's predicted time to its first token: a bound sized for a
#: small model must not cut off a large one's long prompt. Predictions are calibrated, but a
#: node's first long prompt can still run past them.
PREDICTED_TTFT_MARGIN = 2.0


class SubmitReply(WireMessage, kw_only=True):
    """scheduler -> gateway: the request is with ``prefill_node`` (``accepted``), or why not:
    ``error_code`` is the HTTP status its client should see (429 with ``retry_after_s``: over
    capacity; 503: no node can serve it; 400: a value no node accepts)."""

    accepted: bool
    prefill_node: OptionalId = ""
    prefill_epoch: OptionalId = ""
    decode_node: OptionalId = ""
    error: Text = ""
    error_code: HttpStatus | None = None
    retry_after_s: Seconds | None = None
    placement_s: Seconds = 0.0  # the scheduler's time on it (``shared.phases.PLACEMENT``)
    # Its prediction of the time to the first token, calibrated by the node's measured
    # misses (``PREDICTED_TTFT_MARGIN``).
    predicted_ttft_s: Seconds = 0.0
    # What kind of refusal, where the status alone does not say (``QUOTA``).
    error_kind: Annotated[str, Meta(max_length=32)] = ""


class TokenLogprob(msgspec.Struct, array_like=True):
    token_id: TokenId
    logprob: float
    top: Annotated[list[tuple[TokenId, float]], Meta(max_length=20)]


class TokenChunk(WireMessage, kw_only=True):
    """Output of one request. ``index`` is the position of ``token_ids[0]`` in the whole
    completion (resumed requests included), so a receiver can order chunks from the prefill
    and the decode node and see a gap.

    A chunk with ``error`` ends the request; ``error_code`` is an HTTP status (429: overloaded,
    503: no node can serve it) and ``retry_after_s`` tells a rejected client when to try again.
    ``node_id``/``epoch`` name the producer. A chunk with ``owner`` set (and no tokens) says
    that node serves the request from now on; one with ``migrate`` says the producer gives the
    request up, and it should be resumed from ``index``. ``cached_by_tier`` splits
    ``num_cached_tokens`` by where the blocks came from (``dram``, ``nvme``, ``s3``).
    ``prompt_tokens_written`` and ``output_tokens_written`` count the tokens whose blocks the
    producer computed and newly cached for this request so far (full blocks only).
    """

    request_id: Id
    index: Annotated[int, Meta(ge=0, le=MAX_PROMPT_TOKENS)]
    token_ids: Annotated[list[TokenId], Meta(max_length=MAX_PROMPT_TOKENS)]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: Annotated[str, Meta(max_length=32)] | None = None
    num_prompt_tokens: Count = 0
    num_cached_tokens: Count = 0
    error: Text | None = None
    error_code: HttpStatus | None = None
    retry_after_s: Seconds | None = None
    node_id: OptionalId = ""
    epoch: OptionalId = ""
    owner: OptionalId = ""
    owner_epoch: OptionalId = ""
    migrate: bool = False
    cached_by_tier: CachedByTier = msgspec.field(default_factory=dict)
    phases: Phases = msgspec.field(default_factory=dict)  # what the sender timed of it
    prompt_tokens_written: Count = 0
    output_tokens_written: Count = 0
    mac: StreamTag = b""  # keyed by the request's stream key (``shared.stream_auth``)


class AbortRequest(WireMessage, kw_only=True):
    """Stop ``request_id`` everywhere, or only on ``only_node`` (a node that took a hand-off
    whose acknowledgement was lost, so the work went elsewhere too). ``mac``: tagged with the
    request's stream key, without which the nodes serving it ignore the abort."""

    request_id: Id
    only_node: OptionalId = ""
    mac: StreamTag = b""


class ReplayRequest(WireMessage, kw_only=True):
    """gateway -> node: send me ``request_id``'s output from ``from_index`` on."""

    request_id: Id
    from_index: Annotated[int, Meta(ge=0, le=MAX_PROMPT_TOKENS)]


class ReplayReply(WireMessage, kw_only=True):
    """The node's record of a request: ``known`` False when it never had it or forgot it;
    ``running`` while it still produces tokens. ``token_ids`` start at ``index``. ``owner``
    names the node it handed the request to, if it did (a prefill node's answer after the
    decode node took the KV). A request neither running, finished, failed nor handed over
    was stopped there: it must be resumed elsewhere."""

    known: bool
    running: bool = False
    index: Annotated[int, Meta(ge=0, le=MAX_PROMPT_TOKENS)] = 0
    token_ids: Annotated[list[TokenId], Meta(max_length=MAX_PROMPT_TOKENS)] = msgspec.field(
        default_factory=list
    )
    logprobs: list[TokenLogprob] | None = None
    finish_reason: Annotated[str, Meta(max_length=32)] | None = None
    num_cached_tokens: Count = 0
    cached_by_tier: CachedByTier = msgspec.field(default_factory=dict)
    error: Text | None = None
    error_code: HttpStatus | None = None
    owner: OptionalId = ""
    owner_epoch: OptionalId = ""


class GatewayCheck(WireMessage, kw_only=True):
    """node -> gateway: are these requests of yours still wanted?"""

    request_ids: Annotated[list[Id], Meta(max_length=4096)]


class GatewayCheckReply(WireMessage, kw_only=True):
    """The ids of a ``GatewayCheck`` the gateway no longer waits for."""

    unknown: Annotated[list[Id], Meta(max_length=4096)]


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
