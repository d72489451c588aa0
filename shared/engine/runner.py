"""Runs one scheduled step through the model: packs the batch, forwards it, samples."""

from __future__ import annotations

import torch

from shared.engine.scheduler import SchedulerOutput
from shared.engine.sequence import Sequence
from shared.model.attention import AttentionMetadata, PrefillChunk
from shared.model.decoder import DecoderForCausalLM
from shared.model.fused_decode import MAX_FUSED_ROWS, FusedDecoder
from shared.model.kv_cache import PagedKVCache
from shared.model.sampler import SampledToken, Sampler


class ModelRunner:
    """Owns the model, its paged KV tensor and the sampler; knows nothing of scheduling.

    Synchronous and blocking by design: a service hosting it calls ``execute`` from a worker
    thread so its event loop stays free. A step of one-token rows runs as one fused call where
    the model allows it (``FusedDecoder``), any other step op by op.
    """

    def __init__(self, model: DecoderForCausalLM, cache: PagedKVCache, fused_decode: bool = True):
        self.model = model
        self.cache = cache
        self.fused = FusedDecoder.build(model) if fused_decode else None
        self.block_size = cache.layout.block_size
        self.device = cache.tensor.device
        self.sampler = Sampler(self.device)
        config = model.config
        self._rope_by_length = config.rope_depends_on_length
        self._rope_restarts = config.rope_restart_length is not None
        self._windows = sorted({w for w in config.layer_windows if w is not None})
        # Grown on demand, never shrunk: the decode group's gathered K and V of each layer.
        self._gather_space = torch.empty(0, device=self.device, dtype=cache.tensor.dtype)
        # What attention computes in (the cache may store less: CRESCENT_KV_DTYPE).
        self.compute_dtype = model.norm.weight.dtype

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput) -> list[tuple[Sequence, SampledToken]]:
        """Computes the step's tokens and samples one token for each sequence that reached the
        end of its known tokens; returns those sequences with their tokens, in batch order."""
        samplers = [c.seq for c in step.chunks if c.reaches_end]
        if self._fits_fused(step):
            logits = self._fused_logits(step)
        else:
            input_ids, positions, meta, sample_rows = self._prepare(step)
            lengths = self._rope_lengths(step) if self._rope_by_length else None
            hidden = self.model(input_ids, positions, self.cache, meta, lengths)
            if not samplers:
                return []
            logits = self.model.compute_logits(hidden[sample_rows])
        if not samplers:
            return []
        # The position in the whole completion, so that a resumed request draws what the
        # uninterrupted one would have.
        at = [s.params.output_offset + s.num_output_tokens for s in samplers]
        rules = [s.logits_processor for s in samplers]
        tokens = self.sampler.sample(logits, [s.params for s in samplers], at, rules)
        return list(zip(samplers, tokens, strict=True))

    def fuses(self, step: SchedulerOutput) -> bool:
        """Whether ``step`` runs as one fused call (else op by op, a few hundred parallel
        regions)."""
        return self._fits_fused(step)

    def _fits_fused(self, step: SchedulerOutput) -> bool:
        chunks = step.chunks
        return (
            self.fused is not None
            and 0 < len(chunks) <= MAX_FUSED_ROWS
            and all(c.num_new == 1 for c in chunks)
        )

    def _fused_logits(self, step: SchedulerOutput) -> torch.Tensor:
        """Logits of the step's sampling rows, from one fused call over every row."""
        assert self.fused is not None
        bs = self.block_size
        ids: list[int] = []
        lens: list[int] = []
        tables: list[list[int]] = []
        rows: list[int] = []
        for i, chunk in enumerate(step.chunks):
            seq, pos = chunk.seq, chunk.seq.num_computed_tokens
            ids.append(seq.token_ids[pos])
            lens.append(pos + 1)
            tables.append([b.block_id for b in seq.block_table[: pos // bs + 1]])
            if chunk.reaches_end:
                rows.append(i)
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        logits = self.fused(
            torch.tensor(ids, dtype=torch.long),
            torch.tensor(padded, dtype=torch.int32),
            torch.tensor(lens, dtype=torch.int32),
            self.cache.tensor,
        )
        return logits if len(rows) == len(step.chunks) else logits[rows]

    def _prepare(
        self, step: SchedulerOutput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        ids: list[int] = []
        pos: list[int] = []
        slot_blocks: list[int] = []
        sample_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        bs = self.block_size
        for chunk in step.chunks:
            seq, start = chunk.seq, chunk.seq.num_computed_tokens
            end = start + chunk.num_new
            row = len(ids)
            ids.extend(seq.token_ids[start:end])
            pos.extend(range(start, end))
            table = [b.block_id for b in seq.block_table[: -(-end // bs)]]
            slot_blocks.extend(table[p // bs] for p in range(start, end))
            if chunk.reaches_end:
                sample_rows.append(row + chunk.num_new - 1)
            if chunk.num_new == 1:
                decode_tables.append(table)
                decode_lens.append(end)
            else:
                chunks = self.cache.block_chunks(torch.tensor(table, dtype=torch.long))
                prefills.append(PrefillChunk(row, chunk.num_new, end, chunks.to(self.device)))
        positions = torch.tensor(pos, dtype=torch.long, device=self.device)
        blocks = torch.tensor(slot_blocks, dtype=torch.long, device=self.device)
        meta = AttentionMetadata(
            slot_rows=self.cache.rows_by_layer(self.cache.token_rows(blocks, positions % bs)),
            num_decode=len(decode_tables),
            prefills=prefills,
        )
        if decode_tables:
            meta.decode_chunks, meta.decode_mask = self._decode_chunks(decode_tables, decode_lens)
            meta.decode_window_masks = self._window_masks(meta.decode_mask, decode_lens)
            meta.decode_keys, meta.decode_values = self._gather_buffers(
                meta.decode_chunks.shape[-1]
            )
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        rows_t = torch.tensor(sample_rows, dtype=torch.long, device=self.device)
        return input_ids, positions, meta, rows_t

    def _decode_chunks(
        self, tables: list[list[int]], lens: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(t) for t in tables)
        # Padding points at block 0: any finite data will do, the mask hides it.
        padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
        span = width * self.block_size
        lens_t = torch.tensor(lens, dtype=torch.long, device=self.device)
        hidden = torch.arange(span, device=self.device).unsqueeze(0) >= lens_t.unsqueeze(1)
        # An additive mask, made once per step: given a bool mask, attention would convert it
        # in every layer.
        mask = torch.zeros(hidden.shape, dtype=self.compute_dtype, device=self.device)
        mask.masked_fill_(hidden, float("-inf"))
        chunks = self.cache.chunks_by_layer(self.cache.block_chunks(padded).to(self.device))
        return chunks, mask.view(len(tables), 1, 1, span)

    def _window_masks(self, mask: torch.Tensor, lens: list[int]) -> dict[int, torch.Tensor]:
        """The decode mask of each sliding window the layers use: the full mask that also
        hides keys older than the window (the new token is at ``len - 1``)."""
        if not self._windows:
            return {}
        span = mask.shape[-1]
        cols = torch.arange(span, device=self.device).unsqueeze(0)
        lens_t = torch.tensor(lens, dtype=torch.long, device=self.device).unsqueeze(1)
        out = {}
        for window in self._windows:
            old = (cols <= lens_t - 1 - window).view(mask.shape)
            out[window] = mask.masked_fill(old, float("-inf"))
        return out

    def _rope_lengths(self, step: SchedulerOutput) -> torch.Tensor:
        """Per token of the step, the length it is rotated for: ``max(position + 1, prompt
        length)``, the prompt being the request's own (a resumed request's prompt ends with
        tokens it generated before, which were rotated as generated tokens)."""
        lengths: list[int] = []
        for chunk in step.chunks:
            seq, start = chunk.seq, chunk.seq.num_computed_tokens
            if self._rope_restarts:
                # Every token is rotated for all the sequence holds (restarted past the window).
                lengths.extend([seq.num_tokens] * chunk.num_new)
                continue
            prompt = seq.num_prompt_tokens - seq.params.output_offset
            lengths.extend(max(p + 1, prompt) for p in range(start, start + chunk.num_new))
        return torch.tensor(lengths, dtype=torch.long, device=self.device)

    def _gather_buffers(self, num_chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
        width = self.cache.chunks.shape[1]
        need = 2 * num_chunks * width
        if self._gather_space.numel() < need:
            self._gather_space = self._gather_space.new_empty(need)
        space = self._gather_space[:need].view(2, num_chunks, width)
        return space[0], space[1]
