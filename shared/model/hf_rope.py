"""Reads the rotary embedding of a Hugging Face config: ``rope_parameters`` as transformers 5
writes it (one dict, or one per layer type), or the older ``rope_theta`` + ``rope_scaling``."""

from __future__ import annotations

from typing import Any

from shared.errors import UnsupportedModelError
from shared.model.config import RopeSpec

_BASE_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
_KIND_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
    "longrope": {"factor", "original_max_position_embeddings", "attention_factor"}
    | {"short_factor", "long_factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}
# Old names of the same kinds.
_ALIASES = {"su": "longrope"}
_LAYER_TYPES = ("full_attention", "sliding_attention")


def _kind(params: dict[str, Any]) -> str:
    kind = params.get("rope_type") or params.get("type") or "default"
    kind = _ALIASES.get(kind, kind)
    if kind not in _KIND_KEYS:
        raise UnsupportedModelError(
            f"rope type {kind!r} is not supported; supported: {', '.join(sorted(_KIND_KEYS))}"
        )
    return str(kind)


def _spec(params: dict[str, Any], theta: float, head_dim: int, max_pos: int) -> RopeSpec:
    kind = _kind(params)
    # original_max_position_embeddings is harmless on kinds that ignore it (transformers
    # copies it into every kind's parameters when it standardizes a config).
    unknown = sorted(
        set(params) - _BASE_KEYS - _KIND_KEYS[kind] - {"original_max_position_embeddings"}
    )
    if unknown:
        raise UnsupportedModelError(f"rope parameter {unknown[0]!r} of {kind!r} is not supported")
    partial = float(params.get("partial_rotary_factor") or 1.0)
    original = int(params.get("original_max_position_embeddings") or max_pos)
    factor = params.get("factor")
    if factor is None:
        # yarn and longrope infer it from how far max_position_embeddings was stretched.
        factor = max_pos / original if kind in ("yarn", "longrope") else 1.0
    spec = RopeSpec(
        kind=kind,
        theta=float(params.get("rope_theta") or theta),
        rotary_dim=int(head_dim * partial),
        max_positions=max_pos,
        factor=float(factor),
        original_max_positions=original,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        truncate=bool(params.get("truncate", True)),
        mscale=float(params.get("mscale") or 0.0),
        mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
        attention_factor=(
            None if params.get("attention_factor") is None else float(params["attention_factor"])
        ),
        short_factor=tuple(float(f) for f in params.get("short_factor") or ()),
        long_factor=tuple(float(f) for f in params.get("long_factor") or ()),
    )
    half = spec.rotary_dim // 2
    if kind == "longrope" and (len(spec.short_factor) != half or len(spec.long_factor) != half):
        raise UnsupportedModelError(f"longrope factors must have {half} entries (rotary dim / 2)")
    return spec


def _context(spec: RopeSpec) -> int:
    """How far a kind stretches the context beyond max_position_embeddings."""
    if spec.kind == "yarn":
        return max(spec.max_positions, int(spec.original_max_positions * spec.factor))
    if spec.kind == "dynamic":
        return int(spec.max_positions * spec.factor)
    return spec.max_positions


def read_ropes(
    d: dict[str, Any], base: dict[str, Any], layer_types: list[str] | None
) -> dict[str, Any]:
    """``rope_theta``, ``ropes``, ``layer_ropes`` and ``max_context`` of a config; with
    ``layer_types``, full and sliding layers may each have their own rope."""
    head_dim, max_pos = base["head_dim"], base["max_position_embeddings"]
    theta = float(d.get("rope_theta") or 10000.0)
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    shared = {k: v for k, v in d.items() if k in ("partial_rotary_factor",)}
    if "original_max_position_embeddings" in d:
        shared["original_max_position_embeddings"] = d["original_max_position_embeddings"]
    if layer_types is None:
        if set(params) & set(_LAYER_TYPES):
            raise UnsupportedModelError("per-layer-type rope parameters are not supported here")
        spec = _spec(shared | params, theta, head_dim, max_pos)
        return {"rope_theta": spec.theta, "ropes": (spec,), "max_context": _context(spec)}
    per_type = _per_layer_type(d, params, theta)
    specs = tuple(_spec(shared | per_type[t], theta, head_dim, max_pos) for t in _LAYER_TYPES)
    return {
        "rope_theta": specs[0].theta,
        "ropes": specs,
        "layer_ropes": tuple(_LAYER_TYPES.index(t) for t in layer_types),
        "max_context": min(_context(s) for s in specs),
    }


def _per_layer_type(
    d: dict[str, Any], params: dict[str, Any], theta: float
) -> dict[str, dict[str, Any]]:
    if set(params) & set(_LAYER_TYPES):
        missing = [t for t in _LAYER_TYPES if t not in params]
        if missing:
            raise UnsupportedModelError(f"rope_parameters has no {missing[0]!r} entry")
        return {t: dict(params[t]) for t in _LAYER_TYPES}
    # Older Gemma 3 configs: rope_scaling applies to full layers only, and sliding layers
    # rotate with their own base.
    local = float(d.get("rope_local_base_freq") or 10000.0)
    return {
        "full_attention": {"rope_theta": theta, **params},
        "sliding_attention": {"rope_type": "default", "rope_theta": local},
    }
