"""One choice's output: TokenChunks in any order -> text deltas, cut at stop strings. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.gateway.requests import OutputOptions
from shared.messages import TokenChunk, TokenLogprob
from shared.model.tokenizer import IncrementalDetokenizer, Tokenizer


class BackendError(Exception):
    """A TokenChunk carried an error: the request is over, and the client must hear why."""

    def __init__(self, code: int | None, message: str | None, retry_after_s: float | None):
        super().__init__(message or "backend error")
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class Delta:
    """What one chunk added to a choice: text that is final, the logprobs of the tokens just
    consumed (with each token's offset in the text), and the finish reason once it is known."""

    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    def __bool__(self) -> bool:
        return bool(self.text or self.logprobs or self.finish_reason)


class ChoiceAssembler:
    """Assembles one choice from its TokenChunks.

    Owns a reorder buffer keyed by output position, the incremental detokenizer and the text
    held back because it may be the start of a stop string. Invariants: tokens are consumed
    strictly in ``index`` order, each once; emitted text never contains half a UTF-8 character
    nor any part of a matched stop string (unless asked to include it); nothing is consumed
    after the choice finished.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: tuple[int, ...],
        max_tokens: int,
        options: OutputOptions,
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._max_tokens = max_tokens
        self._options = options
        self._pending: dict[int, tuple[int, TokenLogprob | None]] = {}
        self._end: tuple[int, str] | None = None  # (position after the last token, reason)
        self._held = ""
        self.next_index = 0
        self.token_ids: list[int] = []  # every token consumed, in order
        self.text = ""
        self.logprobs: list[TokenLogprob] = []
        self.offsets: list[int] = []
        self.finish_reason: str | None = None
        self.num_prompt_tokens = len(prompt_ids)
        self.num_cached_tokens = 0
        self.cached_by_tier: dict[str, int] = {}
        # Per producing node, the (prompt, output) tokens it newly cached: each node's chunks
        # carry its running count, so the largest one is its total.
        self._written: dict[str, tuple[int, int]] = {}

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def completion_tokens(self) -> int:
        return self.next_index

    @property
    def tokens_written(self) -> tuple[int, int]:
        """Prompt and output tokens the nodes that computed this choice newly cached."""
        counts = self._written.values()
        return sum(p for p, _ in counts), sum(o for _, o in counts)

    @property
    def has_gap(self) -> bool:
        """Tokens or a finish arrived for positions past one still missing."""
        return bool(self._pending) or (self._end is not None and self._end[0] > self.next_index)

    def add(self, chunk: TokenChunk) -> Delta:
        """Takes one chunk; returns what became final. Raises ``BackendError`` on an error."""
        if chunk.error is not None or chunk.error_code is not None:
            raise BackendError(chunk.error_code, chunk.error, chunk.retry_after_s)
        delta = Delta()
        if self.finished:
            return delta
        if chunk.num_cached_tokens > self.num_cached_tokens or (
            chunk.cached_by_tier and not self.cached_by_tier
        ):
            self.cached_by_tier = dict(chunk.cached_by_tier)
        self.num_cached_tokens = max(self.num_cached_tokens, chunk.num_cached_tokens)
        if chunk.prompt_tokens_written or chunk.output_tokens_written:
            seen = self._written.get(chunk.node_id, (0, 0))
            self._written[chunk.node_id] = (
                max(seen[0], chunk.prompt_tokens_written),
                max(seen[1], chunk.output_tokens_written),
            )
        self._buffer(chunk)
        while not self.finished and self.next_index in self._pending:
            token_id, logprob = self._pending.pop(self.next_index)
            self._consume(token_id, logprob, delta)
        self._check_end(delta)
        return delta

    def _buffer(self, chunk: TokenChunk) -> None:
        logprobs = chunk.logprobs or []
        for offset, token_id in enumerate(chunk.token_ids):
            position = chunk.index + offset
            if position >= self.next_index and position not in self._pending:
                lp = logprobs[offset] if offset < len(logprobs) else None
                self._pending[position] = (token_id, lp)
        if chunk.finish_reason is not None and self._end is None:
            self._end = (max(chunk.index, 0) + len(chunk.token_ids), chunk.finish_reason)

    def _consume(self, token_id: int, logprob: TokenLogprob | None, delta: Delta) -> None:
        self.next_index += 1
        self.token_ids.append(token_id)
        if logprob is not None and self._options.logprobs is not None:
            offset = len(self.text) + len(self._held)
            delta.logprobs.append(logprob)
            delta.offsets.append(offset)
            self.logprobs.append(logprob)
            self.offsets.append(offset)
        options = self._options
        if token_id in options.stop_token_ids and not options.include_stop_str_in_output:
            self._check_end(delta)  # a stop token ends the choice; its text is not output
            return
        kept = options.kept_tokens.get(token_id)
        if kept is not None:
            # A tool syntax's marker: the detokenizer drops special tokens, its reader needs it.
            self._scan(self._detok.flush() + kept, delta)
        else:
            self._scan(self._detok.push([token_id]), delta)
        self._check_end(delta)

    def _check_end(self, delta: Delta) -> None:
        # The backend's own reason wins: an EOS that is also the last allowed token is a stop.
        if self.finished:
            return
        if self._end is not None and self.next_index >= self._end[0]:
            self._finish(self._end[1], delta)
        elif self.next_index >= self._max_tokens:
            self._finish("length", delta)

    def _scan(self, piece: str, delta: Delta) -> None:
        """Emits ``piece`` except what may start a stop string; finishes on a full match."""
        text = self._held + piece
        # Before min_tokens a stop string ends nothing (the engine holds back stop tokens too).
        stops = self._options.stop if self.next_index >= self._options.min_tokens else ()
        match = min(((text.find(s), s) for s in stops if s in text), default=None)
        if match is not None:
            at, stop = match
            end = at + len(stop) if self._options.include_stop_str_in_output else at
            self._held = ""
            self._emit(text[:end], delta)
            self.finish_reason = delta.finish_reason = "stop"
            return
        keep = _longest_stop_prefix(text, stops)
        self._held = text[len(text) - keep :]
        self._emit(text[: len(text) - keep], delta)

    def _finish(self, reason: str, delta: Delta) -> None:
        # No token follows, so text held back for a stop string that never came is output.
        self._scan(self._detok.flush(), delta)
        if self.finished:
            return
        self._emit(self._held, delta)
        self._held = ""
        self.finish_reason = delta.finish_reason = reason

    def _emit(self, text: str, delta: Delta) -> None:
        delta.text += text
        self.text += text


def _longest_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that a stop string starts with (not whole)."""
    best = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:size]):
                best = size
                break
    return best
