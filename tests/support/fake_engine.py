"""A fake backend on the bus: answers ``crescent.requests`` the way the scheduler, prefill and
decode nodes do together (an acknowledged submission, heartbeats, replays, chunks carrying
their producer), with deterministic tokens from the real tokenizer.

What a request gets depends on markers in its (decoded) prompt:

``[[429]]`` / ``[[503]]``  the scheduler refuses it with that code (429: retry after 2.5 s)
``[[silent]]``            accepted, then nothing at all (its node says it runs)
``[[slow]]``              a long reply, one chunk every 50 ms, until aborted
``[[shuffle]]``           the chunks of the reply in reverse order
``[[fail]]``              the first chunk, then an error chunk with code 503
``[[reply=TEXT]]``        TEXT instead of the canned reply
``[[predicted=S]]``       the submission's reply predicts a first token in S seconds
``[[late=S]]``            the reply starts only after S seconds
``[[migrate]]``           first attempt: four tokens, then its node hands it back (migrate)
``[[gap]]``               first attempt: the chunk at position 1 is lost (its node has it)
``[[ghost]]``             first attempt: placed on a node that never heartbeats (it died)

Otherwise the reply is ``REPLY`` (plus `` Choice i.`` for sibling ``i > 0``), then EOS, cut to
``max_tokens`` with finish reason "length". The first chunk holds one token, as a prefill node
sends it; the rest come in chunks of three tokens. A resumed attempt (``...-rN``) gets the
same reply from its ``output_offset`` on.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from shared import subjects
from shared.bus import Bus, NatsBus
from shared.cluster_messages import NodeStatus
from shared.messages import (
    AbortRequest,
    GenerateRequest,
    ReplayReply,
    ReplayRequest,
    SubmitReply,
    TokenChunk,
    TokenLogprob,
)
from shared.model.tokenizer import Tokenizer
from shared.stream_auth import seal_chunk

# Multibyte characters on purpose: é and ö are one token each, the moon is split over three.
REPLY = "Hello! Crescent says héllo wörld 🌙. The end."
RETRY_AFTER_S = 2.5
CHUNK_TOKENS = 3
SLOW_DELAY_S = 0.05
NODE = "fake-node"
GHOST = "fake-ghost"
BEAT_S = 0.3
_REPLY_RE = re.compile(r"\[\[reply=(.*?)\]\]", re.DOTALL)
_PREDICTED_RE = re.compile(r"\[\[predicted=([0-9.]+)\]\]")
_LATE_RE = re.compile(r"\[\[late=([0-9.]+)\]\]")
_ATTEMPT_RE = re.compile(r"-r\d+$")


#: What the fake says it timed: placement, and the nodes' phases on the first and last chunk.
PLACEMENT_S = 0.002
FIRST_PHASES = {"prefill_queue": 0.001, "prefix_fetch": 0.0, "prefill_compute": 0.003}
LAST_PHASES = {"decode_step": 0.004, "token_publish": 0.0005}


def cached_tokens(prompt_len: int) -> int:
    """What the fake reports as found in the KV cache: whole 32-token blocks, less one."""
    return max(0, (prompt_len // 32 - 1) * 32)


def fake_logprob(position: int, token_id: int, top: int) -> TokenLogprob:
    value = -0.25 * (position % 4)
    alternatives = [(token_id, value)] + [(token_id + 1 + k, value - 1 - k) for k in range(top)]
    return TokenLogprob(token_id, value, alternatives[:top])


def base_id(request_id: str) -> str:
    """The first attempt's id of a (possibly resumed) request."""
    return _ATTEMPT_RE.sub("", request_id)


@dataclass
class FakeEngine:
    """Serves GenerateRequests from the bus and records what it saw.

    Owns its bus connection, the requests received, the AbortRequests heard and the chunks it
    produced per request (its ledger, for replays).
    """

    tokenizer: Tokenizer
    requests: list[GenerateRequest] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    sent: dict[str, list[TokenChunk]] = field(default_factory=dict)
    bus: Bus | None = None
    epoch: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _beaten: asyncio.Event = field(default_factory=asyncio.Event)  # its first beats are out

    async def start(self, nats_url: str) -> None:
        self.bus = bus = await NatsBus.connect(nats_url, "fake-engine")
        await bus.serve(
            subjects.REQUESTS, GenerateRequest, self._on_request, queue=subjects.SCHEDULER_QUEUE
        )
        await bus.subscribe(subjects.ABORTS, AbortRequest, self._on_abort)
        await bus.serve(subjects.replays(NODE), ReplayRequest, self._on_replay)
        self._spawn(self._beat())
        await asyncio.wait_for(self._beaten.wait(), 20)
        await bus.flush()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.bus is not None:
            await self.bus.close()

    def request(self, request_id: str) -> GenerateRequest | None:
        return next((r for r in self.requests if r.request_id == request_id), None)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _beat(self) -> None:
        assert self.bus is not None
        while True:
            for role, node in (("scheduler", "fake-scheduler"), ("prefill", NODE)):
                status = NodeStatus(node_id=node, role=role, epoch=self.epoch)
                await self.bus.publish(subjects.heartbeats(role, node), status)
            status = NodeStatus(node_id="fake-decode", role="decode", epoch=self.epoch)
            await self.bus.publish(subjects.heartbeats("decode", "fake-decode"), status)
            self._beaten.set()
            await asyncio.sleep(BEAT_S)  # the heartbeat period

    async def _on_abort(self, message: AbortRequest) -> None:
        self.aborts.append(message.request_id)

    async def _on_request(self, request: GenerateRequest) -> SubmitReply:
        self.requests.append(request)
        prompt = self.tokenizer.decode(request.prompt_token_ids, skip_special_tokens=False)
        for code in (429, 503):
            if f"[[{code}]]" in prompt:
                retry = RETRY_AFTER_S if code == 429 else None
                error = f"fake engine says {code}"
                return SubmitReply(
                    accepted=False, error=error, error_code=code, retry_after_s=retry
                )
        first = request.request_id == base_id(request.request_id)
        node = GHOST if first and "[[ghost]]" in prompt else NODE
        self._spawn(self._serve(request, prompt, node, first))
        predicted = _PREDICTED_RE.search(prompt)
        return SubmitReply(
            accepted=True,
            prefill_node=node,
            prefill_epoch=self.epoch,
            placement_s=PLACEMENT_S,
            predicted_ttft_s=float(predicted.group(1)) if predicted else 0.0,
        )

    async def _on_replay(self, ask: ReplayRequest) -> ReplayReply:
        chunks = self.sent.get(ask.request_id)
        if chunks is None:
            return ReplayReply(known=False)
        tokens: dict[int, int] = {}
        for chunk in chunks:
            for i, token in enumerate(chunk.token_ids):
                tokens[chunk.index + i] = token
        positions = [p for p in sorted(tokens) if p >= ask.from_index]
        end = next((c.finish_reason for c in chunks if c.finish_reason), None)
        return ReplayReply(
            known=True,
            running=end is None,
            index=positions[0] if positions else ask.from_index,
            token_ids=[tokens[p] for p in positions],
            finish_reason=end,
        )

    async def _serve(self, request: GenerateRequest, prompt: str, node: str, first: bool) -> None:
        assert self.bus is not None
        rid = request.request_id
        subject = subjects.tokens(rid)
        self.sent[rid] = []
        if "[[silent]]" in prompt:
            return
        chunks = self._chunks(request, prompt)
        if "[[shuffle]]" in prompt:
            chunks.reverse()
        if "[[fail]]" in prompt:
            lost = TokenChunk(
                request_id=rid, index=0, token_ids=[], error="the decode node was lost",
                error_code=503,
            )  # fmt: skip
            chunks = [chunks[0], lost]
        if first and "[[migrate]]" in prompt:
            kept = [c for c in chunks if c.index < 4]
            chunks = [*kept, TokenChunk(request_id=rid, index=4, token_ids=[], migrate=True)]
        if first and "[[ghost]]" in prompt:
            chunks = chunks[:1]
        lose = first and "[[gap]]" in prompt
        slow = "[[slow]]" in prompt
        late = _LATE_RE.search(prompt)
        if late:
            await asyncio.sleep(float(late.group(1)))  # a model slow to its first token
        for chunk in chunks:
            if rid in self.aborts:
                return
            chunk.node_id, chunk.epoch = node, self.epoch
            seal_chunk(chunk, request.stream_key)
            self.sent[rid].append(chunk)
            if not (lose and chunk.index == 1):
                await self.bus.publish(subject, chunk)
            if slow:
                await asyncio.sleep(SLOW_DELAY_S)  # a slow model's pace between tokens

    def _reply_ids(self, request: GenerateRequest, prompt: str) -> tuple[list[int], str]:
        custom = _REPLY_RE.search(prompt)
        text = custom.group(1) if custom else REPLY
        sibling = int(base_id(request.request_id).rsplit("-", 1)[-1])
        if sibling and not custom:
            text += f" Choice {sibling}."
        if "[[slow]]" in prompt:
            text = " ".join([text] * 40)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        eos = self.tokenizer.eos_token_id
        ids = [*ids, eos] if eos is not None else ids
        limit = request.sampling.output_offset + request.sampling.max_tokens
        if len(ids) > limit:
            return ids[:limit], "length"
        return ids, "stop"

    def _chunks(self, request: GenerateRequest, prompt: str) -> list[TokenChunk]:
        ids, reason = self._reply_ids(request, prompt)
        start = request.sampling.output_offset
        bounds = sorted({start, *range(start + 1, len(ids), CHUNK_TOKENS), len(ids)})
        chunks = [self._chunk(request, ids, a, b, reason) for a, b in pairwise(bounds) if a < b]
        if chunks:
            chunks[0].phases = dict(FIRST_PHASES)
            chunks[-1].phases = chunks[-1].phases | LAST_PHASES
        return chunks

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
