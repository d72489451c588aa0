"""Paged attention in plain torch: where the new K/V go, and what each query attends to.

A forward pass packs the new tokens of many sequences into one ``[T, ...]`` batch: first one
token for each decoding sequence, then the prompt chunks of the sequences being prefilled.
Linear layers run on the packed batch; attention splits it into the decode group, attended in
one padded batch, and one call per prefill chunk.

New K/V are written as rows of ``PagedKVCache.rows`` (one token's heads of one layer's K or V);
contexts are read as chunks of ``PagedKVCache.chunks`` (one block's tokens of one layer's K or
V, contiguous). The runner computes layer 0's K row and chunk ids once per step; layer ``l``'s
are those plus a constant, so each layer writes and reads with one indexed copy each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from shared.model.kv_cache import PagedKVCache, stores_bytes, to_stored


@dataclass(slots=True)
class PrefillChunk:
    """The prompt tokens ``[start, start+num_new)`` of the packed batch for one sequence.

    ``num_context`` counts every token the chunk attends to, including itself: the tokens
    already in the cache (a reused prefix or earlier chunks) plus ``num_new``.
    ``context_chunks`` are the layer-0 K chunks of the blocks holding them, in order.
    """

    start: int
    num_new: int
    num_context: int
    context_chunks: torch.Tensor  # long [num_blocks]


@dataclass(frozen=True, slots=True)
class LayerAttention:
    """How one layer attends: ``scale`` multiplies the scores, ``softcap`` (Gemma 2) bounds
    them with ``tanh(s / cap) * cap`` before the mask, ``window`` keeps only the latest
    ``window`` keys of each query (itself included); None for the usual (``scale``:
    ``head_dim ** -0.5``)."""

    scale: float | None = None
    softcap: float | None = None
    window: int | None = None


@dataclass(slots=True)
class AttentionMetadata:
    """Everything attention needs about one packed batch; built once, used by every layer."""

    slot_rows: torch.Tensor  # long [layers, 2, T]: the K and V row of each new token
    num_decode: int = 0
    decode_chunks: torch.Tensor | None = None  # long [layers, 2, D * nb]: context, padded
    decode_mask: torch.Tensor | None = None  # float [D, 1, 1, S]: 0 to attend, -inf to skip
    # The same for layers that attend within a sliding window, by window size.
    decode_window_masks: dict[int, torch.Tensor] = field(default_factory=dict)
    # Reused destinations for the decode group's gathered K and V ([D * nb, chunk] each), so
    # the 2 x layers gathers of a step allocate (and page-fault) nothing.
    decode_keys: torch.Tensor | None = None
    decode_values: torch.Tensor | None = None
    prefills: list[PrefillChunk] = field(default_factory=list)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: int,
    cache: PagedKVCache,
    meta: AttentionMetadata,
    how: LayerAttention,
) -> torch.Tensor:
    """Stores ``k``/``v`` of the new tokens in the cache and attends ``q`` over each context.

    Shapes: q ``[T, heads, dim]``, k and v ``[T, kv_heads, dim]``; returns ``[T, heads, dim]``.
    """
    t, kv_heads, dim = k.shape
    stored = cache.rows.dtype
    if stored != k.dtype:
        # Every query sees K and V as the cache holds them, the new tokens' too, so a prompt
        # computes the same whether its prefix was cached, chunked or computed with it.
        k_stored, v_stored = to_stored(k, stored), to_stored(v, stored)
        k, v = k_stored.to(k.dtype), v_stored.to(v.dtype)
    else:
        k_stored, v_stored = k, v
    rows, k_rows, v_rows = cache.rows, k_stored.reshape(t, -1), v_stored.reshape(t, -1)
    if stores_bytes(stored):
        rows, k_rows, v_rows = (x.view(torch.uint8) for x in (rows, k_rows, v_rows))
    rows.index_copy_(0, meta.slot_rows[layer, 0], k_rows)
    rows.index_copy_(0, meta.slot_rows[layer, 1], v_rows)
    k_chunk, v_chunk = cache.layer_chunk_offsets(layer)

    def gather(
        chunk_ids: torch.Tensor, batch: int, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``batch * nb`` chunk ids -> ``[batch, kv_heads, nb * block_size, dim]``, one copy
        (and one more, into q's dtype, where the cache stores another)."""
        if out is None:
            g = cache.chunks.index_select(0, chunk_ids)
        else:
            g = torch.index_select(cache.chunks, 0, chunk_ids, out=out)
        return g.to(q.dtype).view(batch, -1, kv_heads, dim).transpose(1, 2)

    if meta.num_decode:
        assert meta.decode_chunks is not None and meta.decode_mask is not None
        d = meta.num_decode
        keys = gather(meta.decode_chunks[layer, 0], d, meta.decode_keys)
        values = gather(meta.decode_chunks[layer, 1], d, meta.decode_values)
        mask = meta.decode_mask if how.window is None else meta.decode_window_masks[how.window]
        decoded = _decode_attention(q[:d], keys, values, mask, how)
        if not meta.prefills:
            return decoded  # a pure decode step: no need to assemble the output
    out = torch.empty_like(q)
    if meta.num_decode:
        out[: meta.num_decode] = decoded
    for chunk in meta.prefills:
        span = slice(chunk.start, chunk.start + chunk.num_new)
        if chunk.num_context == chunk.num_new and how.window is None and how.softcap is None:
            out[span] = _causal_attention(q[span], k[span], v[span], how.scale)
        elif chunk.num_context == chunk.num_new:
            keys, values = (x[span].transpose(0, 1).unsqueeze(0) for x in (k, v))
            out[span] = _attention_after_prefix(q[span], keys, values, chunk, how)
        else:
            ids = chunk.context_chunks
            keys = gather(ids + k_chunk, 1)[:, :, : chunk.num_context]
            values = gather(ids + v_chunk, 1)[:, :, : chunk.num_context]
            out[span] = _attention_after_prefix(q[span], keys, values, chunk, how)
    return out


def _decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    how: LayerAttention,
) -> torch.Tensor:
    d, heads, dim = q.shape
    kv_heads = keys.shape[1]
    # A single query row per sequence: fold the query heads of a group into the row axis so
    # each KV head is read once instead of being repeated per query head.
    qg = q.view(d, kv_heads, heads // kv_heads, dim)
    if how.softcap is None:
        out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask, scale=how.scale)
    else:
        out = _capped_attention(qg, keys, values, mask, how)
    return out.reshape(d, heads, dim)


def _capped_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    how: LayerAttention,
) -> torch.Tensor:
    """Attention with soft-capped scores, which no fused kernel takes: ``q`` is
    ``[B, kv_heads, rows, dim]`` against ``keys``/``values`` of ``[B, kv_heads, S, dim]``;
    ``mask`` is additive (float) or a bool keep-mask, broadcast over the scores."""
    assert how.softcap is not None
    scale = how.scale if how.scale is not None else q.shape[-1] ** -0.5
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / how.softcap) * how.softcap
    # A bool mask keeps where True; a float mask is added (0 or -inf).
    is_keep = mask.dtype == torch.bool
    scores = scores.masked_fill(~mask, float("-inf")) if is_keep else scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, values)


def _causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """A chunk with no cached context attends over its own fresh K/V."""
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True, scale=scale)
    return out.squeeze(0).transpose(0, 1)


def _attention_after_prefix(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    chunk: PrefillChunk,
    how: LayerAttention,
) -> torch.Tensor:
    """``q`` ``[n, heads, dim]`` over ``keys``/``values`` ``[1, kv_heads, S, dim]``."""
    mask = _causal_mask_with_prefix(chunk.num_new, chunk.num_context, q.device, how.window)
    if how.softcap is None:
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
        out = F.scaled_dot_product_attention(
            qh, keys, values, attn_mask=mask, enable_gqa=True, scale=how.scale
        )
        return out.squeeze(0).transpose(0, 1)
    n, heads, dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    # Each KV head against the rows of its group's query heads, [1, kv, group * n, dim].
    qg = q.transpose(0, 1).reshape(1, kv_heads, group * n, dim)
    out = _capped_attention(qg, keys, values, mask.repeat(group, 1), how)
    return out.reshape(heads, n, dim).transpose(0, 1)


def _causal_mask_with_prefix(
    num_new: int, num_context: int, device: torch.device, window: int | None = None
) -> torch.Tensor:
    """Query i (absolute position num_context - num_new + i) sees keys 0..that position, or
    only the latest ``window`` of them."""
    offset = num_context - num_new
    rows = torch.arange(num_new, device=device).unsqueeze(1) + offset
    cols = torch.arange(num_context, device=device).unsqueeze(0)
    if window is None:
        return cols <= rows
    return (cols <= rows) & (cols > rows - window)
