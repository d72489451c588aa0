"""The wire form of a node's output: token chunks, error chunks, cache scopes."""

from __future__ import annotations

from shared.engine.types import RequestOutput
from shared.kv.hashing import scope_salt
from shared.messages import GenerateRequest, TokenChunk, TokenLogprob
from shared.model.sampler import TokenLogprobs


def to_wire_logprobs(entries: list[TokenLogprobs]) -> list[TokenLogprob] | None:
    if not entries:
        return None
    return [TokenLogprob(e.token_id, e.logprob, list(e.top)) for e in entries]


def output_chunk(out: RequestOutput, offset: int, num_cached_tokens: int) -> TokenChunk:
    """The chunk a gateway receives for one step's output of one request; ``offset`` is the
    completion position of the sequence's first output (non-zero for a resumed request)."""
    return TokenChunk(
        request_id=out.request_id,
        index=offset + len(out.output_token_ids) - len(out.new_token_ids),
        token_ids=list(out.new_token_ids),
        logprobs=to_wire_logprobs(out.new_logprobs),
        finish_reason=out.finish_reason.value if out.finish_reason is not None else None,
        num_prompt_tokens=out.num_prompt_tokens,
        num_cached_tokens=num_cached_tokens,
        prompt_tokens_written=out.num_prompt_tokens_written,
        output_tokens_written=out.num_output_tokens_written,
    )


def request_salt(secret: str, request: GenerateRequest) -> bytes:
    """The cache scope of a request: its tenant's, narrowed by its own ``cache_salt``."""
    return scope_salt(secret.encode(), request.tenant, request.cache_salt)


def error_chunk(request_id: str, message: str, code: int, index: int = 0) -> TokenChunk:
    """Tells the gateway a request failed; ``code`` is the HTTP status its client should see."""
    return TokenChunk(
        request_id=request_id, index=index, token_ids=[], error=message, error_code=code
    )
