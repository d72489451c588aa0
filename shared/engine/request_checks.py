"""What a request must satisfy before the engine makes a sequence of it: its token ids fit
the vocabulary, and its prompt and completion fit the context and the KV pool."""

from __future__ import annotations

from shared.engine.config import EngineConfig
from shared.errors import InvalidRequestError, PromptTooLongError
from shared.sampling_params import SamplingParams


def check_request_fits(
    prompt: list[int], params: SamplingParams, vocab_size: int, config: EngineConfig
) -> None:
    """Raises the error a client is told (naming the offending field) for the first check
    the request fails; returns when it passes them all."""
    if not prompt:
        raise InvalidRequestError("the prompt is empty", "prompt")
    if any(not 0 <= t < vocab_size for t in prompt):
        raise InvalidRequestError(f"prompt token ids must be in [0, {vocab_size})", "prompt")
    if any(t >= vocab_size for t, _ in params.logit_bias):
        raise InvalidRequestError(
            f"logit_bias token ids must be in [0, {vocab_size})", "logit_bias"
        )
    if any(t >= vocab_size for t in params.stop_token_ids):
        raise InvalidRequestError(f"stop_token_ids must be in [0, {vocab_size})", "stop_token_ids")
    if params.output_offset > len(prompt):
        raise InvalidRequestError("output_offset exceeds the prompt", "output_offset")
    if len(prompt) + params.max_tokens > config.max_model_len:
        raise PromptTooLongError(len(prompt), params.max_tokens, config.max_model_len)
    blocks = -(-(len(prompt) + params.max_tokens) // config.block_size)
    if blocks > config.num_kv_blocks:
        raise InvalidRequestError(
            f"the request needs {blocks} KV blocks but this node has only {config.num_kv_blocks}",
            "max_tokens",
        )
