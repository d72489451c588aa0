"""A node's spans of a request, made from the phases its chunks carry (``shared.phases``):
the prefill (its queue, prefix fetch and compute), the KV hand-off and first decode step, and
the whole decode. Each hangs under the span this node opened when the request's task or
hand-off arrived (``tracing.delivery``); the prefill span becomes the parent of what follows,
so the decode node's spans hang under it. Called only while tracing is on."""

from __future__ import annotations

import time

from shared import phases, tracing
from shared.messages import TokenChunk
from shared.node.requests import NodeRequest

#: A prefill's phases in the order they happen: the pulls of its prefix, then its wait in the
#: engine's queue, then its compute up to the first token.
PREFILL_ORDER = (phases.PREFIX_FETCH, phases.PREFILL_QUEUE, phases.PREFILL_COMPUTE)
HANDOFF_ORDER = (phases.KV_HANDOFF, phases.FIRST_DECODE_STEP)


def trace_chunk(chunk: TokenChunk, holding: NodeRequest | None) -> None:
    """The spans ``chunk`` closes, for a request this node serves."""
    rid = chunk.request_id
    parent = tracing.parent_of(rid)
    if not parent:
        return
    timed = chunk.phases
    if any(p in timed for p in PREFILL_ORDER):
        attrs: dict[str, str | int | float | bool] = {
            f"crescent.cached_tokens.{tier}": n for tier, n in chunk.cached_by_tier.items()
        }
        attrs["crescent.cached_tokens"] = chunk.num_cached_tokens
        prefill = _sequence("prefill", parent, timed, PREFILL_ORDER, attrs)
        tracing.remember(rid, prefill)  # what the hand-off carries to the decode node
    if any(p in timed for p in HANDOFF_ORDER):
        _sequence("kv_transfer", parent, timed, HANDOFF_ORDER, {})
    timer = holding.timer if holding is not None else None
    if chunk.finish_reason is not None and timer is not None and timer.running_at:
        decoded = time.monotonic() - timer.running_at
        tracing.record("decode", parent, decoded, attrs={"crescent.tokens": timer.outputs})


def _sequence(
    name: str,
    parent: str,
    timed: dict[str, float],
    order: tuple[str, ...],
    attrs: dict[str, str | int | float | bool],
) -> str:
    """A span ``name`` ending now that spans ``order``'s phases, one child each, back to
    back; returns the parent span's traceparent."""
    present = [(p, timed[p]) for p in order if p in timed]
    total = sum(seconds for _, seconds in present)
    outer = tracing.record(name, parent, total, attrs=attrs)
    ago = total
    for phase, seconds in present:
        ago -= seconds
        tracing.record(phase, outer, seconds, ago_s=ago)
    return outer
