"""The figures of a run, from its request records: pure functions, no clock, no I/O.

Latencies are reported in milliseconds as mean, p50, p90 and p99 (percentiles by linear
interpolation between closest ranks, numpy's default) over the requests that completed.
TPOT of a request is ``(e2e - ttft) / (output_tokens - 1)``; a one-token answer has none.
ITL pools every inter-token gap of every request. Throughputs divide by the run's wall time.
A request is *good* when it completed, its TTFT is within the TTFT SLO and its TPOT (if it
has one) within the TPOT SLO; goodput is good requests per second, SLO attainment their share
of all requests sent. DistServe's other measure scales both objectives together: a request's
*required scale* is the smallest factor it meets them at (``max(TTFT / TTFT SLO, TPOT / TPOT
SLO)``, infinite when it failed), and the tightest scale held at an attainment (90%) is the
smallest factor at which that share of the requests sent meet the scaled objectives.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from crescent.bench.records import RequestRecord

TIERS = ("dram", "nvme", "s3")
LATENCIES = ("ttft", "tpot", "itl", "e2e")
QUANTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0))
#: The attainment the tightest objective scale is reported at (DistServe's 90%).
ATTAINMENT_TARGET = 0.9

Summary = dict[str, float | int | None]


@dataclass(frozen=True, slots=True)
class Slo:
    """The service-level objectives a good request meets, in milliseconds."""

    ttft_ms: float
    tpot_ms: float


def tpot_s(record: RequestRecord) -> float | None:
    if not record.ok or record.output_tokens < 2 or record.ttft_s is None or record.e2e_s is None:
        return None
    return (record.e2e_s - record.ttft_s) / (record.output_tokens - 1)


def is_good(record: RequestRecord, slo: Slo) -> bool:
    if not record.ok or record.ttft_s is None or record.ttft_s * 1000 > slo.ttft_ms:
        return False
    tpot = tpot_s(record)
    return tpot is None or tpot * 1000 <= slo.tpot_ms


def required_scale(record: RequestRecord, slo: Slo) -> float:
    """The smallest factor both objectives can be multiplied by with ``record`` still meeting
    them (``is_good`` at that scale); infinite for a request that failed."""
    if not record.ok or record.ttft_s is None:
        return math.inf
    scale = record.ttft_s * 1000 / slo.ttft_ms
    tpot = tpot_s(record)
    return scale if tpot is None else max(scale, tpot * 1000 / slo.tpot_ms)


def needed_scales(records: Sequence[RequestRecord], slo: Slo) -> list[float]:
    """Each request's ``required_scale``, sorted."""
    return sorted(required_scale(r, slo) for r in records)


def attainment_at(scales: Sequence[float], scale: float) -> float:
    """The share of requests (given by their required scales) that meet the objectives
    multiplied by ``scale``."""
    return sum(s <= scale for s in scales) / len(scales) if scales else math.nan


def tightest_scale(
    records: Sequence[RequestRecord], slo: Slo, attainment: float = ATTAINMENT_TARGET
) -> float | None:
    """The smallest factor on both objectives at which at least ``attainment`` of the
    requests sent meet them (infinite when more than the rest failed; None for none sent)."""
    return scale_held(needed_scales(records, slo), attainment)


def scale_held(needed: Sequence[float], attainment: float = ATTAINMENT_TARGET) -> float | None:
    """Of requests whose required scales are ``needed`` (sorted), the smallest scale at which
    ``attainment`` of them meet the objectives; None for no requests."""
    if not needed:
        return None
    return needed[max(math.ceil(attainment * len(needed)) - 1, 0)]


def latency_stats(name: str, values_s: Sequence[float]) -> Summary:
    """``{name}_mean_ms``, ``{name}_p50_ms`` … of ``values_s``; None for no values."""
    if not values_s:
        return {f"{name}_{stat}_ms": None for stat in ("mean", *(q for q, _ in QUANTILES))}
    ms = np.asarray(values_s, dtype=float) * 1000
    out: Summary = {f"{name}_mean_ms": float(ms.mean())}
    for label, q in QUANTILES:
        out[f"{name}_{label}_ms"] = float(np.percentile(ms, q))
    return out


def latencies_s(records: Iterable[RequestRecord]) -> dict[str, list[float]]:
    """The values each latency figure is computed over, in seconds."""
    done = [r for r in records if r.ok]
    tpots = [t for t in map(tpot_s, done) if t is not None]
    return {
        "ttft": [r.ttft_s for r in done if r.ttft_s is not None],
        "tpot": tpots,
        "itl": [gap for r in done for gap in r.itl_s],
        "e2e": [r.e2e_s for r in done if r.e2e_s is not None],
    }


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: Slo) -> Summary:
    """Every figure of one run; ``duration_s`` is its wall time (for several rounds, the sum
    of their wall times)."""
    done = [r for r in records if r.ok]
    good = sum(is_good(r, slo) for r in records)
    output = sum(r.output_tokens for r in done)
    per_s = 1 / duration_s if duration_s > 0 else math.nan
    out: Summary = {
        "requests": len(records),
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration_s": duration_s,
        "request_throughput": len(done) * per_s,
        "output_throughput": output * per_s,
        "goodput": good * per_s,
        "slo_attainment": good / len(records) if records else None,
        "tightest_scale_p90": tightest_scale(records, slo),
        "prompt_tokens": sum(_prompt_tokens(r) for r in done),
        "output_tokens": output,
    }
    for name, values in latencies_s(records).items():
        out |= latency_stats(name, values)
    return out | cached_ratios(done)


def cached_ratios(done: Sequence[RequestRecord]) -> Summary:
    """Cached prompt tokens over prompt tokens, over the requests whose server reported them
    (None where none did); by tier over those that reported tiers."""
    reported = [r for r in done if r.cached_tokens is not None]
    out: Summary = {"cached_ratio": _ratio((r.cached_tokens or 0 for r in reported), reported)}
    tiered = [r for r in done if r.cached_by_tier is not None]
    for tier in TIERS:
        cached = ((r.cached_by_tier or {}).get(tier, 0) for r in tiered)
        out[f"cached_ratio_{tier}"] = _ratio(cached, tiered)
    return out


def _ratio(cached: Iterable[int], records: Sequence[RequestRecord]) -> float | None:
    prompt = sum(_prompt_tokens(r) for r in records)
    return sum(cached) / prompt if records and prompt else None


def _prompt_tokens(record: RequestRecord) -> int:
    return record.prompt_tokens if record.prompt_tokens is not None else record.prompt_len


def ratios(a: Mapping[str, float | int | None], b: Mapping[str, float | int | None]) -> Summary:
    """``b / a`` for every figure both have (None where either is missing or ``a`` is 0)."""
    out: Summary = {}
    for key, base in a.items():
        other = b.get(key)
        if base is None or other is None or base == 0:
            out[key] = None
        else:
            out[key] = other / base
    return out


def ratios_to_first(summaries: Mapping[str, Summary]) -> dict[str, Summary]:
    """``{"B/A": ratios(A, B), ...}`` for every target after the first, A (empty for one)."""
    names = list(summaries)
    if not names:
        return {}
    base = summaries[names[0]]
    return {f"{n}/{names[0]}": ratios(base, summaries[n]) for n in names[1:]}
