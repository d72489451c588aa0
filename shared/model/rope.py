"""Rotary position embeddings of every kind a family uses, as transformers computes them.

``inverse_frequencies`` follows transformers' initializers kind by kind (same operations in
the same order and precision, so the tables agree with its own to the last bit or nearly);
``Rotary`` turns them into cos/sin tables looked up by position, with the attention factor of
yarn and longrope folded in.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from shared.model.config import RopeSpec


def _default(spec: RopeSpec, theta: float | torch.Tensor | None = None) -> torch.Tensor:
    dim = spec.rotary_dim
    base = spec.theta if theta is None else theta
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (base**exponents)


def _llama3(spec: RopeSpec) -> torch.Tensor:
    inv_freq = _default(spec)
    old = spec.original_max_positions
    low_wavelen = old / spec.low_freq_factor
    high_wavelen = old / spec.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are slowed by the factor, short ones kept, and the band between them
    # blends the two.
    scaled = torch.where(wavelen > low_wavelen, inv_freq / spec.factor, inv_freq)
    smooth = (old / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor)
    blended = (1 - smooth) * scaled / spec.factor + smooth * scaled
    middle = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(middle, blended, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(spec: RopeSpec) -> float:
    if spec.attention_factor is not None:
        return spec.attention_factor
    if spec.mscale and spec.mscale_all_dim:
        return _yarn_mscale(spec.factor, spec.mscale) / _yarn_mscale(
            spec.factor, spec.mscale_all_dim
        )
    return _yarn_mscale(spec.factor)


def _yarn(spec: RopeSpec) -> torch.Tensor:
    dim, base = spec.rotary_dim, spec.theta

    def correction_dim(rotations: float) -> float:
        ratio = spec.original_max_positions / (rotations * 2 * math.pi)
        return (dim * math.log(ratio)) / (2 * math.log(base))

    low, high = correction_dim(spec.beta_fast), correction_dim(spec.beta_slow)
    if spec.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp needs a width
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (spec.factor * pos_freqs)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep


def longrope_attention_factor(spec: RopeSpec) -> float:
    if spec.attention_factor is not None:
        return spec.attention_factor
    if spec.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(spec.factor) / math.log(spec.original_max_positions))


def _longrope(spec: RopeSpec, long: bool) -> torch.Tensor:
    dim = spec.rotary_dim
    factors = torch.tensor(spec.long_factor if long else spec.short_factor, dtype=torch.float32)
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (factors * spec.theta**shape)


def dynamic_inverse_frequencies(spec: RopeSpec, lengths: torch.Tensor) -> torch.Tensor:
    """Dynamic NTK's inverse frequencies for sequences of ``lengths`` tokens, ``[N, dim/2]``:
    the base grows with the length once it passes ``max_positions``."""
    max_pos = spec.max_positions
    lengths = torch.maximum(lengths, torch.tensor(max_pos, dtype=lengths.dtype))
    dim = spec.rotary_dim
    base = spec.theta * ((spec.factor * lengths / max_pos) - (spec.factor - 1)) ** (dim / (dim - 2))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (base.unsqueeze(1) ** exponents)


def inverse_frequencies(spec: RopeSpec, long: bool = False) -> tuple[torch.Tensor, float]:
    """The inverse frequencies ``[rotary_dim / 2]`` of a spec and the factor its cos and sin
    are scaled by; ``long`` picks longrope's long factors."""
    if spec.kind in ("default", "dynamic"):
        return _default(spec), 1.0
    if spec.kind == "linear":
        return _default(spec) / spec.factor, 1.0
    if spec.kind == "llama3":
        return _llama3(spec), 1.0
    if spec.kind == "yarn":
        return _yarn(spec), yarn_attention_factor(spec)
    if spec.kind == "longrope":
        return _longrope(spec, long), longrope_attention_factor(spec)
    raise ValueError(f"unknown rope kind {spec.kind!r}")


def _tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin (first half negated) of ``positions x inv_freq``."""
    freqs = positions.float().unsqueeze(-1) * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos() * scale, angles.sin() * scale
    sin[..., : inv_freq.shape[-1]].neg_()
    return cos, sin


class Rotary(nn.Module):
    """Owns the cos/sin tables of one ``RopeSpec`` for positions ``[0, max_positions)``.

    ``sin`` is stored with its first half negated: rotating then takes one swap of the two
    halves of ``x`` instead of slicing, negating and concatenating them, with bit-identical
    results. Longrope keeps a second pair of tables for its long factors; dynamic scaling
    computes the rows of tokens past its window when they are asked for.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    long_cos: torch.Tensor
    long_sin: torch.Tensor

    def __init__(self, spec: RopeSpec, max_positions: int) -> None:
        super().__init__()
        self.spec = spec
        # Computed on the CPU even inside a meta-device context: the tables need real values,
        # and tracing these ops on meta would import torch._dynamo (over a second of a start).
        with torch.device("cpu"):
            positions = torch.arange(max_positions, dtype=torch.float32)
            inv_freq, scale = inverse_frequencies(spec)
            cos, sin = _tables(positions, inv_freq, scale)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)
            if spec.kind == "longrope":
                long_freq, _ = inverse_frequencies(spec, long=True)
                long_cos, long_sin = _tables(positions, long_freq, scale)
                self.register_buffer("long_cos", long_cos, persistent=False)
                self.register_buffer("long_sin", long_sin, persistent=False)

    def tables(
        self, positions: torch.Tensor, lengths: torch.Tensor | None, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin of each token, ``[T, 1, rotary_dim]``. ``lengths`` are the
        lengths each token is rotated for (``RopeSpec.depends_on_length``), needed only by
        kinds that depend on them."""
        cos, sin = self.cos[positions], self.sin[positions]
        spec = self.spec
        if spec.depends_on_length and lengths is not None:
            past = lengths > spec.window
            if bool(past.any()):
                rows = past.nonzero().squeeze(1)
                if spec.kind == "longrope":
                    cos[rows] = self.long_cos[positions[rows]]
                    sin[rows] = self.long_sin[positions[rows]]
                else:
                    inv_freq = dynamic_inverse_frequencies(spec, lengths[rows].to(cos.device))
                    cos[rows], sin[rows] = _tables(positions[rows], inv_freq, 1.0)
        return cos.unsqueeze(1).to(dtype), sin.unsqueeze(1).to(dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotates the first ``rotary_dim`` of each head of ``x`` (``[T, heads, head_dim]``)
        by the tables of ``tables``: ``x * cos + rotate_half(x) * sin``; the rest passes."""
        t, heads, dim = x.shape
        rotary = cos.shape[-1]
        if rotary == dim:
            swapped = x.view(t, heads, 2, dim // 2).flip(2).view(t, heads, dim)
            return x * cos + swapped * sin
        part = x[..., :rotary]
        swapped = part.reshape(t, heads, 2, rotary // 2).flip(2).reshape(t, heads, rotary)
        return torch.cat((part * cos + swapped * sin, x[..., rotary:]), dim=-1)
