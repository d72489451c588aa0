"""The rotary embedding of a GGUF model, in transformers' ``rope_parameters`` terms.

llama.cpp's converter keeps some rope kinds as metadata (``rope.scaling.type`` linear and yarn)
and others as tensors: Llama 3's scaling becomes ``rope_freqs`` (one divisor per rotated
frequency) and Phi-3's longrope becomes ``rope_factors_short`` / ``rope_factors_long``. Each is
turned back into the transformers parameters it was written from; what cannot be expressed
there is refused by name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from shared.errors import UnsupportedModelError
from shared.model.gguf_meta import GgufMeta, float32_value

SCALING_TYPES = ("none", "linear", "yarn", "longrope")
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# llama.cpp's converter fills in these when a Llama 3 config leaves them out.
_LLAMA3_DEFAULTS = (1.0, 4.0, 8192)


def read_rope(
    meta: GgufMeta, head_dim: int, max_positions: int, partial: bool = False
) -> dict[str, Any]:
    """The ``rope_parameters`` of a single-rope model (of full-attention layers for Gemma 3).

    ``partial``: whether the family rotates only part of each head (Phi-3); elsewhere
    ``rope.dimension_count`` must be the head size, as llama.cpp requires for Llama.
    """
    # llama.cpp's default base when the file names none (Gemma 2's converter writes none).
    theta = meta.float_value("rope.freq_base", 10000.0)
    params: dict[str, Any] = {"rope_theta": theta}
    rotary = meta.int_value("rope.dimension_count", head_dim)
    if rotary != head_dim:
        if not partial:
            raise UnsupportedModelError(
                f"{meta.source}: {meta.arch}.rope.dimension_count={rotary} is not the head size "
                f"{head_dim}; {meta.arch} rotates whole heads"
            )
        params["partial_rotary_factor"] = rotary / head_dim
    # Inert unless the kind reads it (yarn and longrope do, below); llama.cpp likewise.
    meta.mark_read("rope.scaling.finetuned", "rope.scaling.original_context_length")
    kind = meta.value("rope.scaling.type")
    if kind is not None and kind not in SCALING_TYPES:
        raise UnsupportedModelError(
            f"{meta.source}: {meta.arch}.rope.scaling.type={kind!r} is not supported; "
            f"supported: {', '.join(SCALING_TYPES)}"
        )
    if "rope_freqs.weight" in meta.tensors:
        if meta.arch != "llama" or kind not in (None, "none"):
            raise UnsupportedModelError(
                f"{meta.source}: a rope_freqs tensor is only supported for llama (Llama 3 rope "
                f"scaling), not {meta.arch} with rope scaling {kind!r}"
            )
        freqs = meta.tensor_values("rope_freqs.weight")
        if len(freqs) != rotary // 2:
            raise UnsupportedModelError(
                f"{meta.source}: rope_freqs has {len(freqs)} entries for {rotary} rotary dims"
            )
        llama3 = llama3_from_rope_freqs(freqs, theta, rotary, max_positions)
        if llama3 is None:
            raise UnsupportedModelError(
                f"{meta.source}: rope_freqs is not Llama 3 rope scaling of any (factor, "
                "low/high frequency factors, original context) Crescent can find"
            )
        return params | llama3
    if "rope_factors_long.weight" in meta.tensors or kind == "longrope":
        if not partial or kind not in (None, "longrope"):
            raise UnsupportedModelError(
                f"{meta.source}: longrope factors are only supported for phi3, not {meta.arch}"
            )
        return params | _longrope(meta, rotary, max_positions)
    unexpected = [
        key
        for key in ("rope.scaling.attn_factor", "rope.scaling.alpha")
        if meta.has(key) and meta.optional_float(key) not in (0.0, 1.0)
    ]
    if unexpected:
        raise UnsupportedModelError(f"{meta.source}: {meta.arch}.{unexpected[0]} is not supported")
    factor = meta.optional_float("rope.scaling.factor") or meta.optional_float("rope.scale_linear")
    if kind == "yarn":
        return params | _yarn(meta, factor, max_positions)
    if kind in (None, "none", "linear") and factor in (None, 0.0, 1.0):
        # llama.cpp reads a missing factor (or type "none") as no scaling at all.
        return params | {"rope_type": "default"}
    if kind == "none":
        raise UnsupportedModelError(
            f"{meta.source}: {meta.arch}.rope.scaling.factor={factor} with scaling type 'none'"
        )
    # A factor without a type is linear scaling: llama.cpp's default type.
    return params | {"rope_type": "linear", "factor": factor}


def _yarn(meta: GgufMeta, factor: float | None, max_positions: int) -> dict[str, Any]:
    if not factor:
        raise UnsupportedModelError(f"{meta.source}: yarn rope scaling without a factor")
    for key, neutral in (
        ("rope.scaling.yarn_ext_factor", 1.0),
        ("rope.scaling.yarn_log_multiplier", 0.0),
    ):
        value = meta.optional_float(key)
        if value is not None and value != neutral:
            # transformers' yarn has neither an extrapolation mix nor a log multiplier knob.
            raise UnsupportedModelError(
                f"{meta.source}: {meta.arch}.{key}={value} is not supported"
            )
    params: dict[str, Any] = {
        "rope_type": "yarn",
        "factor": factor,
        # llama.cpp takes the training context when the original one is not given.
        "original_max_position_embeddings": meta.int_value(
            "rope.scaling.original_context_length", max_positions
        ),
    }
    for key, name in (
        ("rope.scaling.yarn_attn_factor", "attention_factor"),
        ("rope.scaling.yarn_beta_fast", "beta_fast"),
        ("rope.scaling.yarn_beta_slow", "beta_slow"),
    ):
        value = meta.optional_float(key)
        if value is not None:
            params[name] = value
    return params


def _longrope(meta: GgufMeta, rotary: int, max_positions: int) -> dict[str, Any]:
    names = ("rope_factors_short.weight", "rope_factors_long.weight")
    missing = [n for n in names if n not in meta.tensors]
    if missing:
        raise UnsupportedModelError(f"{meta.source}: longrope without a {missing[0]} tensor")
    short, long = (meta.tensor_values(n) for n in names)
    if len(short) != rotary // 2 or len(long) != rotary // 2:
        raise UnsupportedModelError(
            f"{meta.source}: longrope factors must have {rotary // 2} entries (rotary dims / 2)"
        )
    original = meta.int_value("rope.scaling.original_context_length", max_positions)
    params: dict[str, Any] = {
        "rope_type": "longrope",
        "short_factor": [float32_value(f) for f in short],
        "long_factor": [float32_value(f) for f in long],
        "original_max_position_embeddings": original,
    }
    attn = meta.optional_float("rope.scaling.attn_factor")
    # The converter writes the factor transformers derives by default; only another value
    # needs saying (transformers would otherwise derive the same one).
    scale = max_positions / original
    derived = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    if attn is not None and not math.isclose(attn, derived, rel_tol=1e-6):
        params["attention_factor"] = attn
    return params


def llama3_from_rope_freqs(
    freqs: np.ndarray, theta: float, dim: int, max_positions: int
) -> dict[str, Any] | None:
    """Llama 3's scaling parameters from the per-frequency divisors llama.cpp stores (None
    when no parameters reproduce them).

    The converter computes, for each rotated frequency with wavelength ``w``: 1 when
    ``w < original / high_freq_factor``, ``factor`` when ``w > original / low_freq_factor``,
    and ``1 / ((1 - s) / factor + s)`` with ``s = (original / w - low) / (high - low)`` in
    between. ``factor`` is the largest divisor; two smoothed frequencies give the band's
    bounds, which fix (original, low, high) up to a common scale: low is taken as 1, as in
    every Llama 3 release. With fewer smoothed frequencies, the converter's own defaults (and
    the training context as the original one) are tried. Whatever is chosen must reproduce
    every divisor.
    """
    inv_freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    wavelen = 2 * math.pi / inv_freq
    divisors = freqs.astype(np.float64)
    factor = float32_value(float(divisors.max()))
    if factor <= 1.0:
        return {"rope_type": "default"}
    smooth = [(w, d) for w, d in zip(wavelen, divisors, strict=True) if 1.0 < d < factor]
    candidates: list[tuple[float, float, float]] = []
    if len(smooth) >= 2:
        # s = a / w - b with a = original / (high - low) and b = low / (high - low).
        s = [(1 / d - 1 / factor) / (1 - 1 / factor) for _, d in smooth]
        u = [1 / w for w, _ in smooth]
        a = (s[-1] - s[0]) / (u[-1] - u[0])
        b = a * u[0] - s[0]
        if a > 0 and b > 0:
            candidates.append((1.0, round(1.0 + 1.0 / b, 4), round(a / b)))
    low, high, original = _LLAMA3_DEFAULTS
    if len(smooth) == 1:
        ((w, d),) = smooth
        s1 = (1 / d - 1 / factor) / (1 - 1 / factor)
        candidates.append((low, high, round(w * (s1 * (high - low) + low))))
    candidates += [(low, high, original), (low, high, max_positions)]
    for lo, hi, orig in candidates:
        if _llama3_matches(divisors, wavelen, factor, lo, hi, orig):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": lo,
                "high_freq_factor": hi,
                "original_max_position_embeddings": int(orig),
            }
    return None


def _llama3_matches(
    divisors: np.ndarray,
    wavelen: np.ndarray,
    factor: float,
    low: float,
    high: float,
    original: float,
) -> bool:
    if not (0 < low < high and original > 0):
        return False
    expected = []
    for w in wavelen:
        if w < original / high:
            expected.append(1.0)
        elif w > original / low:
            expected.append(factor)
        else:
            s = (original / w - low) / (high - low)
            expected.append(1 / ((1 - s) / factor + s))
    return bool(np.allclose(divisors, expected, rtol=1e-5, atol=0.0))
