"""``/tokenize`` and ``/detokenize`` (vLLM's shapes): the served model's tokenizer and chat
rendering, exactly as the generation routes use them. Pure."""

from __future__ import annotations

from typing import Any

from services.gateway import errors
from services.gateway.requests import RequestBuilder
from services.gateway.schemas import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)


def tokenize(
    builder: RequestBuilder, body: TokenizeCompletionRequest | TokenizeChatRequest
) -> dict[str, Any]:
    if body.model is not None:
        builder.check_model(body.model)
    tokenizer = builder.tokenizer
    if isinstance(body, TokenizeChatRequest):
        add_prompt = body.add_generation_prompt is not False
        ids = list(builder.render(body.messages, add_prompt))
    else:
        ids = tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False)
    out: dict[str, Any] = {"count": len(ids), "max_model_len": builder.max_model_len, "tokens": ids}
    if body.return_token_strs:
        out["token_strs"] = [tokenizer.id_to_token(t) for t in ids]
    return out


def detokenize(builder: RequestBuilder, body: DetokenizeRequest) -> dict[str, Any]:
    if body.model is not None:
        builder.check_model(body.model)
    vocab = builder.tokenizer.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise errors.invalid(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", "tokens")
    return {"prompt": builder.tokenizer.decode(body.tokens)}
