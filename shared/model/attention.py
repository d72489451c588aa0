"""Paged attention in plain torch: where the new K/V go, and what each query attends to.

A forward pass packs the new tokens of many sequences into one ``[T, ...]`` batch: first one
token for each decoding sequence, then the prompt chunks of the sequences being prefilled.
Linear layers run on the packed batch; attention splits it into the decode group, attended in
one padded batch, and one call per prefill chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from shared.model.kv_cache import PagedKVCache


@dataclass(slots=True)
class PrefillChunk:
    """The prompt tokens ``[start, start+num_new)`` of the packed batch for one sequence.

    ``num_context`` counts every token the chunk attends to, including itself: the tokens
    already in the cache (a reused prefix or earlier chunks) plus ``num_new``.
    """

    start: int
    num_new: int
    num_context: int
    block_table: torch.Tensor  # long [num_blocks covering num_context]


@dataclass(slots=True)
class AttentionMetadata:
    """Everything attention needs about one packed batch; built once, used by every layer."""

    slot_block_ids: torch.Tensor  # long [T]: block that receives each new token's K/V
    slot_offsets: torch.Tensor  # long [T]: position inside that block
    num_decode: int = 0
    decode_block_tables: torch.Tensor | None = None  # long [D, max_blocks]
    decode_mask: torch.Tensor | None = None  # bool [D, 1, 1, max_blocks * block_size]
    prefills: list[PrefillChunk] = field(default_factory=list)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: int,
    cache: PagedKVCache,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """Stores ``k``/``v`` of the new tokens in the cache and attends ``q`` over each context.

    Shapes: q ``[T, heads, dim]``, k and v ``[T, kv_heads, dim]``; returns ``[T, heads, dim]``.
    """
    k_cache, v_cache = cache.keys(layer), cache.values(layer)
    k_cache[meta.slot_block_ids, meta.slot_offsets] = k
    v_cache[meta.slot_block_ids, meta.slot_offsets] = v
    out = torch.empty_like(q)
    if meta.num_decode:
        out[: meta.num_decode] = _decode_attention(q[: meta.num_decode], k_cache, v_cache, meta)
    for chunk in meta.prefills:
        rows = slice(chunk.start, chunk.start + chunk.num_new)
        out[rows] = _prefill_attention(q[rows], k[rows], v[rows], k_cache, v_cache, chunk)
    return out


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """``[B, nb]`` block ids -> ``[B, kv_heads, nb * block_size, dim]`` (one copy)."""
    g = cache[block_tables]  # [B, nb, bs, kvh, d]
    b, nb, bs, kvh, d = g.shape
    return g.view(b, nb * bs, kvh, d).transpose(1, 2)


def _decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
) -> torch.Tensor:
    assert meta.decode_block_tables is not None and meta.decode_mask is not None
    keys = _gather(k_cache, meta.decode_block_tables)
    values = _gather(v_cache, meta.decode_block_tables)
    d, heads, dim = q.shape
    kv_heads = keys.shape[1]
    # A single query row per sequence: fold the query heads of a group into the row axis so
    # each KV head is read once instead of being repeated per query head.
    qg = q.view(d, kv_heads, heads // kv_heads, dim)
    out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=meta.decode_mask)
    return out.reshape(d, heads, dim)


def _prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: PrefillChunk,
) -> torch.Tensor:
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
    if chunk.num_context == chunk.num_new:
        keys = k.transpose(0, 1).unsqueeze(0)
        values = v.transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(qh, keys, values, is_causal=True, enable_gqa=True)
    else:
        table = chunk.block_table.unsqueeze(0)
        keys = _gather(k_cache, table)[:, :, : chunk.num_context]
        values = _gather(v_cache, table)[:, :, : chunk.num_context]
        mask = _causal_mask_with_prefix(chunk.num_new, chunk.num_context, q.device)
        out = F.scaled_dot_product_attention(qh, keys, values, attn_mask=mask, enable_gqa=True)
    return out.squeeze(0).transpose(0, 1)


def _causal_mask_with_prefix(num_new: int, num_context: int, device: torch.device) -> torch.Tensor:
    """Query i (absolute position num_context - num_new + i) sees keys 0..that position."""
    offset = num_context - num_new
    rows = torch.arange(num_new, device=device).unsqueeze(1) + offset
    cols = torch.arange(num_context, device=device).unsqueeze(0)
    return cols <= rows
