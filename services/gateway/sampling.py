"""OpenAI's sampling fields -> the ``SamplingSpec`` one sequence is generated with. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

from services.gateway import errors
from services.gateway.schemas import (
    MAX_TBT_SLO_MS,
    MAX_TTFT_SLO_MS,
    CacheControl,
    ChatCompletionRequest,
    CompletionRequest,
    KeepFor,
)
from shared.errors import InvalidRequestError
from shared.messages import SamplingSpec
from shared.model.generation_config import SamplingDefaults
from shared.sampling_params import SamplingParams

NO_DEFAULTS = SamplingDefaults()
T = TypeVar("T", int, float)


@dataclass(frozen=True, slots=True)
class TenantTerms:
    """What a tenant's settings give each of its requests: the objectives a request without
    its own takes (milliseconds; None: none) and its share weight on the nodes."""

    ttft_slo_ms: float | None = None
    tbt_slo_ms: float | None = None
    weight: float = 1.0


NO_TERMS = TenantTerms()


def sampling_spec(
    body: ChatCompletionRequest | CompletionRequest,
    max_tokens: int,
    logprobs: int | None,
    sibling: int,
    vocab_size: int,
    grammar: str = "",
    defaults: SamplingDefaults = NO_DEFAULTS,
    arrival: float = 0.0,
    tenant: TenantTerms = NO_TERMS,
) -> SamplingSpec:
    """The sequence's sampling: the body's values, else the model's ``defaults``, else
    Crescent's own. ``arrival`` (Unix time) dates the deadline of the body's ``ttft_slo_ms``,
    or else of its ``tenant``'s objective; the body's ``tbt_slo_ms`` likewise falls back to
    the tenant's."""
    # Sibling choices share a prompt; the same seed would make them identical, so each takes
    # the next seed and choice 0 stays what a request with n=1 and this seed gives.
    seed = body.seed
    if seed is not None and not 0 <= seed < 2**63:
        raise errors.invalid(f"seed must be a non-negative 63-bit integer, got {seed}", "seed")
    if seed is not None:
        seed = (seed + sibling) % 2**63
    cache = body.cache_control
    keep, keep_ttl_s = keep_of(cache)
    min_tokens = body.min_tokens or 0
    if min_tokens > max_tokens:
        raise errors.invalid(
            f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})", "min_tokens"
        )
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=_first(body.temperature, defaults.temperature, 1.0),
            top_p=_first(body.top_p, defaults.top_p, 1.0),
            top_k=_first(body.top_k, defaults.top_k, 0),
            seed=seed,
            logprobs=logprobs,
            stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=bool(body.ignore_eos),
            frequency_penalty=body.frequency_penalty or 0.0,
            presence_penalty=body.presence_penalty or 0.0,
            repetition_penalty=_first(body.repetition_penalty, defaults.repetition_penalty, 1.0),
            logit_bias=logit_bias(body.logit_bias, vocab_size),
            min_tokens=min_tokens,
            grammar=grammar,
            cache_read=not cache or cache.read is not False,
            cache_write=not cache or cache.write is not False,
            keep=keep,
            keep_ttl_s=keep_ttl_s,
            priority=0 if body.priority is None else body.priority,
            ttft_deadline=ttft_deadline(
                body.ttft_slo_ms if body.ttft_slo_ms is not None else tenant.ttft_slo_ms, arrival
            ),
            tenant_weight=tenant.weight,
            tbt_slo_s=tbt_slo_s(
                body.tbt_slo_ms if body.tbt_slo_ms is not None else tenant.tbt_slo_ms
            ),
        )
    except InvalidRequestError as exc:
        raise errors.from_invalid(exc) from exc
    bad = next((t for t in params.stop_token_ids if t >= vocab_size), None)
    if bad is not None:
        raise errors.invalid(
            f"stop_token_ids: {bad} is outside the vocabulary (0..{vocab_size - 1})",
            "stop_token_ids",
        )
    return SamplingSpec.from_params(params)


def ttft_deadline(slo_ms: float | None, arrival: float) -> float:
    """When a request arriving at ``arrival`` asks its first token by (0: no objective)."""
    seconds = _objective_s(slo_ms, MAX_TTFT_SLO_MS, "ttft_slo_ms")
    return arrival + seconds if seconds else 0.0


def tbt_slo_s(slo_ms: float | None) -> float:
    """The time between tokens asked for, in seconds (0: no objective of its own)."""
    return _objective_s(slo_ms, MAX_TBT_SLO_MS, "tbt_slo_ms")


def _objective_s(slo_ms: float | None, most_ms: float, param: str) -> float:
    """An objective given in milliseconds, in seconds (0 for None); a 400 naming ``param``
    unless it is positive and at most ``most_ms``."""
    if slo_ms is None:
        return 0.0
    if not math.isfinite(slo_ms) or not 0 < slo_ms <= most_ms:
        raise errors.invalid(
            f"{param} must be a positive number of milliseconds up to {most_ms:g}, got {slo_ms!r}",
            param,
        )
    return slo_ms / 1000


def _first(asked: T | None, default: T | None, fallback: T) -> T:
    """The request's value, else the model's default, else Crescent's."""
    if asked is not None:
        return asked
    return fallback if default is None else default


def keep_of(cache: CacheControl | None) -> tuple[str, float]:
    """``cache_control.keep`` as ``SamplingParams.keep`` and ``keep_ttl_s``: "pin", a time,
    or a drop (a time of 0)."""
    keep = cache.keep if cache is not None else None
    if keep is None:
        return "", 0.0
    if keep == "pin":
        return "pin", 0.0
    assert isinstance(keep, KeepFor)
    return ("ttl", keep.ttl_s) if keep.ttl_s > 0 else ("drop", 0.0)


def logit_bias(bias: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's map of token ids (as strings) to biases, as (id, bias) pairs."""
    pairs = []
    for key, value in (bias or {}).items():
        if not (0 < len(key) <= 10 and key.isascii() and key.isdigit()) or int(key) >= vocab_size:
            raise errors.invalid(
                f"logit_bias keys must be token ids from 0 to {vocab_size - 1}, got {key[:40]!r}",
                "logit_bias",
            )
        pairs.append((int(key), value))
    return tuple(pairs)
