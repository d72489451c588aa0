"""The phases of one request's life, named once for every service that times them.

Each service times the phases it runs with its own monotonic clock (no two hosts' clocks are
compared) and sends the durations on with the request's output: the prefill node on its first
token, the decode node on its first token and its last. The gateway adds its own, works out
what no node could see (the hops between them), and shows the whole as a histogram per phase
and in a debug view of one request. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

# The gateway's.
PARSE = "parse"  # the HTTP body read, validated, templated and tokenized
SUBMIT = "submit"  # the scheduler's request/reply: placement, the prefill node's ack, the hops
# The scheduler's.
PLACEMENT = "placement"  # the lookup in cachemeta and the choice of nodes
# The prefill node's.
PREFILL_QUEUE = "prefill_queue"  # from the task's arrival to its first step, less the fetch
PREFIX_FETCH = "prefix_fetch"  # pulling the cached prefix it lacked (a pool's or a tier's)
PREFILL_COMPUTE = "prefill_compute"  # from the first step on it to its first token
# The decode node's.
KV_HANDOFF = "kv_handoff"  # from the hand-off's arrival to its KV in the pool (room, pull)
FIRST_DECODE_STEP = "first_decode_step"  # from the KV in the pool to the second token
DECODE_STEP = "decode_step"  # mean time between this request's tokens on the node
ENGINE_STEP = "engine_step"  # of that, the mean engine step (the rest: the node's own work)
TOKEN_PUBLISH = "token_publish"  # mean time to publish one token chunk on the bus
# Worked out by the gateway.
HOPS = "first_token_hops"  # time to first token that no phase above accounts for
INTER_TOKEN = "inter_token"  # mean time between tokens as the gateway received them
SSE_WRITE = "sse_write"  # mean time to hand one event to the HTTP server

NODE_PHASES = (
    PREFILL_QUEUE,
    PREFIX_FETCH,
    PREFILL_COMPUTE,
    KV_HANDOFF,
    FIRST_DECODE_STEP,
    DECODE_STEP,
    ENGINE_STEP,
    TOKEN_PUBLISH,
)
#: Phases a node sends as means over the request's tokens so far: the latest figure stands.
PER_TOKEN_PHASES = frozenset({DECODE_STEP, ENGINE_STEP, TOKEN_PUBLISH})
#: The phases that add up to the time to first token, in order (``HOPS`` is the rest).
FIRST_TOKEN_PHASES = (PARSE, PLACEMENT, PREFILL_QUEUE, PREFIX_FETCH, PREFILL_COMPUTE)
ALL_PHASES = (
    PARSE,
    SUBMIT,
    PLACEMENT,
    *NODE_PHASES,
    HOPS,
    INTER_TOKEN,
    SSE_WRITE,
)


def first_token_hops(phases: Mapping[str, float], ttft_s: float) -> float:
    """The part of ``ttft_s`` (from the HTTP request's arrival) the timed phases leave over:
    the bus hops, the gateway's handling of the first chunk, and the waits between them. The
    queue and compute phases of the prefill node overlap nothing else, so they subtract."""
    timed = sum(phases.get(p, 0.0) for p in FIRST_TOKEN_PHASES)
    return max(ttft_s - timed, 0.0)


def prefill_phases(arrived: float, fetch_s: float, admitted: float, now: float) -> dict[str, float]:
    """What a prefill node timed of a request, from when its task arrived, how long its pulls
    took, when the engine first stepped it and when its first token came."""
    return {
        PREFILL_QUEUE: max(admitted - arrived - fetch_s, 0.0),
        PREFIX_FETCH: fetch_s,
        PREFILL_COMPUTE: max(now - admitted, 0.0),
    }
