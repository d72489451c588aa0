"""OpenAI's response shapes: ``chat.completion`` / ``text_completion`` objects, their stream
chunks, usage and logprobs. Pure: dicts in, dicts out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from services.gateway.output import ChoiceAssembler, Delta
from services.gateway.requests import PreparedRequest
from services.gateway.tool_calls import (
    CallArguments,
    CallStart,
    Content,
    Event,
    ToolCallParser,
    parse_all,
)
from shared.errors import InvalidRequestError
from shared.messages import TokenLogprob
from shared.model.tokenizer import Tokenizer

# JSON has no -inf; OpenAI reports impossible tokens with this floor instead.
LOGPROB_FLOOR = -9999.0


#: The tiers ``cached_tokens_by_tier`` always names, fastest first.
TIERS = ("dram", "nvme", "s3")


def usage(request: PreparedRequest, choices: Sequence[ChoiceAssembler]) -> dict[str, Any]:
    """Prompt tokens count once per prompt (not per choice), as OpenAI counts them.

    ``cached_tokens_by_tier`` (a Crescent extension beside OpenAI's ``cached_tokens``) says
    where the cached tokens were found: a pool, NVMe or S3; its values add up to
    ``cached_tokens``. ``cache_write_tokens`` (OpenAI's in the prompt's details, Crescent's
    in the completion's) counts the prompt and completion tokens the request newly cached,
    full blocks only, over all its choices (a prompt two choices computed on two nodes is
    written twice); ``cache_written_tokens``, its earlier name, repeats it for one release.
    """
    prompt_tokens = sum(len(p) for p in request.prompts)
    cached = 0
    by_tier = dict.fromkeys(TIERS, 0)
    seen: set[int] = set()
    for spec, choice in zip(request.choices, choices, strict=True):
        if spec.prompt_index not in seen:
            seen.add(spec.prompt_index)
            tokens = min(choice.num_cached_tokens, len(request.prompts[spec.prompt_index]))
            cached += tokens
            _split(tokens, choice.cached_by_tier, by_tier)
    completion_tokens = sum(c.completion_tokens for c in choices)
    prompt_written = sum(c.tokens_written[0] for c in choices)
    output_written = sum(c.tokens_written[1] for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": cached,
            "cached_tokens_by_tier": by_tier,
            **_written(prompt_written),
        },
        "completion_tokens_details": _written(output_written),
    }


def _written(tokens: int) -> dict[str, int]:
    # cache_written_tokens: the name before OpenAI's, kept for one release.
    return {"cache_write_tokens": tokens, "cache_written_tokens": tokens}


def _split(tokens: int, reported: dict[str, int], into: dict[str, int]) -> None:
    """Adds ``tokens`` to ``into`` as the node split them; what it did not place (an older
    node, a clipped count) counts as DRAM, so the split always adds up."""
    left = tokens
    for tier in ("s3", "nvme"):
        share = min(left, max(reported.get(tier, 0), 0))
        into[tier] += share
        left -= share
    into["dram"] += left


def _value(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOGPROB_FLOOR


class Shapes:
    """Builds the JSON objects of one API request (chat or completions).

    Owns the request's id, creation time and model name, so that every object of one response
    carries the same ones.
    """

    def __init__(self, request: PreparedRequest, tokenizer: Tokenizer) -> None:
        self.request = request
        self.tokenizer = tokenizer
        self.chat = request.kind == "chat"
        self._top = request.options.logprobs or 0
        # One per choice when the answers are read for tool calls, fed as they stream.
        syntax = request.tool_syntax
        self._parsers = (
            [ToolCallParser(syntax) for _ in request.choices] if request.parse_tool_calls else []
        )

    def _envelope(self, object_: str) -> dict[str, Any]:
        r = self.request
        return {
            "id": r.id,
            "object": object_,
            "created": r.created,
            "model": r.model,
            "system_fingerprint": None,
        }

    def response(self, choices: Sequence[ChoiceAssembler]) -> dict[str, Any]:
        """The whole non-streaming response."""
        body = self._envelope("chat.completion" if self.chat else "text_completion")
        body["choices"] = [self._final_choice(i, c) for i, c in enumerate(choices)]
        body["usage"] = usage(self.request, choices)
        return body

    def _final_choice(self, index: int, choice: ChoiceAssembler) -> dict[str, Any]:
        logprobs = None
        if self.request.options.logprobs is not None:
            logprobs = self.logprobs(choice.logprobs, choice.offsets)
        out: dict[str, Any] = {"index": index}
        finish = choice.finish_reason
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": choice.text, "refusal": None}
            if self._parsers:
                content, calls = parse_all(choice.text, self.request.tool_syntax)
                if calls:
                    message["content"] = content
                    message["tool_calls"] = [_call(i, n, a) for i, n, a in calls]
                    finish = _calls_finish(finish)
            out["message"] = message
        else:
            out["text"] = choice.text
        out["logprobs"] = logprobs
        out["finish_reason"] = finish
        return out

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = choices
        if self.request.include_usage:
            body["usage"] = None
        return body

    def role_chunks(self) -> list[dict[str, Any]]:
        """Chat streams open with the assistant's role, one chunk per choice."""
        if not self.chat:
            return []
        opening = {"role": "assistant", "content": ""}
        return [
            self.chunk(
                [{"index": c.index, "delta": opening, "logprobs": None, "finish_reason": None}]
            )
            for c in self.request.choices
        ]

    def delta_chunks(self, index: int, delta: Delta) -> list[dict[str, Any]]:
        """Stream chunks for one delta: its text (with logprobs), then the finish if any."""
        if self._parsers:
            return self._tool_chunks(index, delta)
        chunks = []
        if delta.text or delta.logprobs:
            logprobs = None
            if self.request.options.logprobs is not None:
                logprobs = self.logprobs(delta.logprobs, delta.offsets)
            chunks.append(self.chunk([self._stream_choice(index, delta.text, logprobs, None)]))
        if delta.finish_reason is not None:
            finish = self._stream_choice(index, None, None, delta.finish_reason)
            chunks.append(self.chunk([finish]))
        return chunks

    def _tool_chunks(self, index: int, delta: Delta) -> list[dict[str, Any]]:
        """Like ``delta_chunks``, with the text read for tool calls: content goes out as
        content, calls as OpenAI streams them (a first delta with id and name, then pieces of
        the arguments)."""
        parser = self._parsers[index]
        events = parser.feed(delta.text)
        if delta.finish_reason is not None:
            events += parser.finish()
        logprobs = None
        if self.request.options.logprobs is not None and delta.logprobs:
            logprobs = self.logprobs(delta.logprobs, delta.offsets)
        chunks = []
        for event in events or ([Content("")] if logprobs else []):
            choice = {"index": index, "delta": _event_delta(event)}
            choice |= {"logprobs": logprobs, "finish_reason": None}
            logprobs = None
            chunks.append(self.chunk([choice]))
        if delta.finish_reason is not None:
            reason = _calls_finish(delta.finish_reason) if parser.calls else delta.finish_reason
            chunks.append(self.chunk([self._stream_choice(index, None, None, reason)]))
        return chunks

    def _stream_choice(
        self, index: int, text: str | None, logprobs: Any, finish: str | None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"index": index}
        if self.chat:
            out["delta"] = {} if text is None else {"content": text}
        else:
            out["text"] = text or ""
        out["logprobs"] = logprobs
        out["finish_reason"] = finish
        return out

    def usage_chunk(self, choices: Sequence[ChoiceAssembler]) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = []
        body["usage"] = usage(self.request, choices)
        return body

    def logprobs(self, items: Sequence[TokenLogprob], offsets: Sequence[int]) -> dict[str, Any]:
        if self.chat:
            return {"content": [self._chat_entry(lp) for lp in items], "refusal": None}
        return {
            "tokens": [self.token_text(lp.token_id) for lp in items],
            "token_logprobs": [_value(lp.logprob) for lp in items],
            "top_logprobs": [
                {self.token_text(t): _value(v) for t, v in lp.top[: self._top]} for lp in items
            ],
            "text_offset": list(offsets),
        }

    def _chat_entry(self, lp: TokenLogprob) -> dict[str, Any]:
        entry = self._token_entry(lp.token_id, lp.logprob)
        entry["top_logprobs"] = [self._token_entry(t, v) for t, v in lp.top[: self._top]]
        return entry

    def _token_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self.token_bytes(token_id)
        return {
            "token": raw.decode("utf-8", errors="replace"),
            "logprob": _value(logprob),
            "bytes": list(raw),
        }

    def token_bytes(self, token_id: int) -> bytes:
        try:
            return self.tokenizer.token_bytes(token_id)
        except (InvalidRequestError, KeyError):
            # A backend that sends an id outside the vocabulary must not break the response.
            return f"<unk:{token_id}>".encode()

    def token_text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")


def _event_delta(event: Event) -> dict[str, Any]:
    if isinstance(event, CallStart):
        function = {"name": event.name, "arguments": ""}
        call = {"index": event.index, "id": event.id, "type": "function", "function": function}
        return {"tool_calls": [call]}
    if isinstance(event, CallArguments):
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]}
    return {"content": event.text}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _calls_finish(reason: str | None) -> str | None:
    """A choice that made calls finishes with ``tool_calls``, unless it was cut short."""
    return "tool_calls" if reason == "stop" else reason
