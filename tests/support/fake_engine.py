"""A fake backend on the bus: answers ``crescent.requests`` the way scheduler, prefill and
decode nodes do together, with deterministic tokens from the real tokenizer.

What a request gets depends on markers in its (decoded) prompt:

``[[429]]`` / ``[[503]]``  an error chunk with that code (429 says retry after 2.5 s)
``[[silent]]``            no answer at all
``[[slow]]``              a long reply, one chunk every 50 ms, until aborted
``[[shuffle]]``           the chunks of the reply in reverse order
``[[fail]]``              the first chunk, then an error chunk with code 503
``[[reply=TEXT]]``        TEXT instead of the canned reply

Otherwise the reply is ``REPLY`` (plus `` Choice i.`` for sibling ``i > 0``), then EOS, cut to
``max_tokens`` with finish reason "length". The first chunk holds one token, as a prefill node
sends it; the rest come in chunks of three tokens.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from itertools import pairwise

from shared import subjects
from shared.bus import Bus
from shared.messages import AbortRequest, GenerateRequest, TokenChunk, TokenLogprob
from shared.model.tokenizer import Tokenizer

# Multibyte characters on purpose: é and ö are one token each, the moon is split over three.
REPLY = "Hello! Crescent says héllo wörld 🌙. The end."
RETRY_AFTER_S = 2.5
CHUNK_TOKENS = 3
SLOW_DELAY_S = 0.05
_REPLY_RE = re.compile(r"\[\[reply=(.*?)\]\]", re.DOTALL)


def cached_tokens(prompt_len: int) -> int:
    """What the fake reports as found in the KV cache: whole 32-token blocks, less one."""
    return max(0, (prompt_len // 32 - 1) * 32)


def fake_logprob(position: int, token_id: int, top: int) -> TokenLogprob:
    value = -0.25 * (position % 4)
    alternatives = [(token_id, value)] + [(token_id + 1 + k, value - 1 - k) for k in range(top)]
    return TokenLogprob(token_id, value, alternatives[:top])


def _error(request_id: str, code: int, message: str, retry_after_s: float | None) -> TokenChunk:
    return TokenChunk(
        request_id=request_id,
        index=0,
        token_ids=[],
        error=message,
        error_code=code,
        retry_after_s=retry_after_s,
    )


@dataclass
class FakeEngine:
    """Serves GenerateRequests from the bus and records what it saw.

    Owns its bus connection, the requests received and the AbortRequests heard.
    """

    tokenizer: Tokenizer
    requests: list[GenerateRequest] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    bus: Bus | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self, nats_url: str) -> None:
        self.bus = await Bus.connect(nats_url, "fake-engine")
        await self.bus.subscribe(
            subjects.REQUESTS, GenerateRequest, self._on_request, queue=subjects.SCHEDULER_QUEUE
        )
        await self.bus.subscribe(subjects.ABORTS, AbortRequest, self._on_abort)
        await self.bus.flush()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.bus is not None:
            await self.bus.close()

    def request(self, request_id: str) -> GenerateRequest | None:
        return next((r for r in self.requests if r.request_id == request_id), None)

    async def _on_abort(self, message: AbortRequest) -> None:
        self.aborts.append(message.request_id)

    async def _on_request(self, request: GenerateRequest) -> None:
        self.requests.append(request)
        task = asyncio.get_running_loop().create_task(self._serve(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, request: GenerateRequest) -> None:
        assert self.bus is not None
        prompt = self.tokenizer.decode(request.prompt_token_ids, skip_special_tokens=False)
        subject = subjects.tokens(request.request_id)
        for code in (429, 503):
            if f"[[{code}]]" in prompt:
                retry = RETRY_AFTER_S if code == 429 else None
                error = _error(request.request_id, code, f"fake engine says {code}", retry)
                await self.bus.publish(subject, error)
                return
        if "[[silent]]" in prompt:
            return
        chunks = self._chunks(request, prompt)
        if "[[shuffle]]" in prompt:
            chunks.reverse()
        if "[[fail]]" in prompt:
            lost = _error(request.request_id, 503, "the decode node was lost", None)
            chunks = [chunks[0], lost]
        slow = "[[slow]]" in prompt
        for chunk in chunks:
            if request.request_id in self.aborts:
                return
            await self.bus.publish(subject, chunk)
            if slow:
                await asyncio.sleep(SLOW_DELAY_S)

    def _reply_ids(self, request: GenerateRequest, prompt: str) -> tuple[list[int], str]:
        custom = _REPLY_RE.search(prompt)
        text = custom.group(1) if custom else REPLY
        sibling = int(request.request_id.rsplit("-", 1)[-1])
        if sibling and not custom:
            text += f" Choice {sibling}."
        if "[[slow]]" in prompt:
            text = " ".join([text] * 40)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        eos = self.tokenizer.eos_token_id
        ids = [*ids, eos] if eos is not None else ids
        max_tokens = request.sampling.max_tokens
        if len(ids) > max_tokens:
            return ids[:max_tokens], "length"
        return ids, "stop"

    def _chunks(self, request: GenerateRequest, prompt: str) -> list[TokenChunk]:
        ids, reason = self._reply_ids(request, prompt)
        bounds = sorted({0, *range(1, len(ids), CHUNK_TOKENS), len(ids)})
        return [self._chunk(request, ids, start, end, reason) for start, end in pairwise(bounds)]

    @staticmethod
    def _chunk(
        request: GenerateRequest, ids: list[int], start: int, end: int, reason: str
    ) -> TokenChunk:
        top = request.sampling.logprobs
        logprobs = None
        if top is not None:
            logprobs = [fake_logprob(p, ids[p], top) for p in range(start, end)]
        prompt_len = len(request.prompt_token_ids)
        return TokenChunk(
            request_id=request.request_id,
            index=start,
            token_ids=ids[start:end],
            logprobs=logprobs,
            finish_reason=reason if end == len(ids) else None,
            num_prompt_tokens=prompt_len,
            num_cached_tokens=cached_tokens(prompt_len),
        )
