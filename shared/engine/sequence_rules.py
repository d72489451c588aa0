"""What a sequence's own rules decide: the logits rules it is sampled with and when a sampled
token ends it. Pure functions of the sequence, its parameters and the engine's constants."""

from __future__ import annotations

from collections.abc import Collection

from shared.engine.sequence import FinishReason, Sequence
from shared.errors import InvalidRequestError
from shared.model.grammar import Grammars
from shared.model.logits_processing import SequenceLogitsProcessor
from shared.sampling_params import SamplingParams


def finish_reason(
    seq: Sequence, token: int, eos_token_ids: Collection[int], max_model_len: int
) -> FinishReason | None:
    """Why ``token``, just appended, ends ``seq``; None when it goes on."""
    p = seq.params
    if not p.ignore_eos and token in eos_token_ids:
        return FinishReason.STOP
    if token in p.stop_token_ids:
        return FinishReason.STOP
    if seq.logits_processor is not None and seq.logits_processor.finished:
        return FinishReason.STOP  # the grammar is complete: only an end token could follow
    if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= max_model_len:
        return FinishReason.LENGTH
    return None


def logits_processor(
    prompt: list[int],
    params: SamplingParams,
    grammars: Grammars | None,
    vocab_size: int,
    eos_token_ids: frozenset[int],
) -> SequenceLogitsProcessor | None:
    """The sequence's rules, having seen the completion's tokens that end a resumed prompt;
    None when it has none (its logits are sampled as they are). ``grammars`` None: a request
    with a grammar is refused."""
    if not params.processes_logits:
        return None
    matcher = None
    if params.grammar:
        if grammars is None:
            raise InvalidRequestError("this node does not enforce grammars", "grammar")
        generated = prompt[len(prompt) - params.output_offset :] if params.output_offset else []
        matcher = grammars.matcher(params.grammar, generated)
    return SequenceLogitsProcessor(params, vocab_size, prompt, eos_token_ids, matcher)
