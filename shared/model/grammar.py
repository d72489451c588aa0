"""Grammar-constrained decoding, with llguidance: grammars built from JSON schemas, regular
expressions, choices and Lark text; their validation against a vocabulary; one matcher per
sequence that says which tokens may come next.

A grammar travels as llguidance's own text (what the ``*_grammar`` builders return), so the
gateway that checks it and every node that enforces it read the same thing. A matcher's state
is a function of the grammar and the tokens generated so far, and nothing else: a node that
takes a sequence over rebuilds it by feeding those tokens again.
"""

from __future__ import annotations

import ctypes
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from llguidance import LLMatcher, LLTokenizer

from shared.errors import InvalidRequestError
from shared.sampling_params import MAX_GRAMMAR_CHARS

#: JSON comes out compact with the separators ``json.dumps`` writes: no free whitespace,
#: which small models otherwise fill with endless newlines.
JSON_OPTIONS: Any = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
#: Distinct grammars whose ready matcher a node keeps to copy from.
CACHED_GRAMMARS = 64


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """The grammar of JSON values that satisfy ``schema``."""
    return str(LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS))


def any_json_object_grammar() -> str:
    """The grammar of any JSON object (OpenAI's ``json_object`` response format)."""
    return json_schema_grammar({"type": "object"})


def regex_grammar(pattern: str) -> str:
    """The grammar of strings that ``pattern`` matches in full."""
    return str(LLMatcher.grammar_from_regex(pattern))


def choice_grammar(choices: Sequence[str]) -> str:
    """The grammar of exactly one of ``choices``."""
    # A JSON string literal is also a valid Lark string literal.
    alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
    return lark_grammar(f"start: {alternatives}")


def lark_grammar(source: str) -> str:
    """A grammar written in llguidance's Lark dialect (``%json {...}`` embeds a schema)."""
    return str(LLMatcher.grammar_from_lark(source))


class GrammarMatcher:
    """One sequence's place in its grammar. Owns an llguidance matcher; invariant: it has
    consumed exactly the sequence's generated tokens, in order."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher: LLMatcher) -> None:
        self._matcher = matcher

    def fill_bitmask(self, address: int, num_bytes: int) -> None:
        """Writes the allowed next tokens, one bit each (int32 words, low bit first), to the
        ``num_bytes`` of memory at ``address``."""
        self._matcher.unsafe_compute_mask_ptr(address, num_bytes)

    def accept(self, token_id: int) -> bool:
        """Advances by one generated token; False if the grammar does not allow it."""
        return bool(self._matcher.consume_token(token_id))

    @property
    def finished(self) -> bool:
        """Nothing but an end-of-sequence token may follow: the output is complete."""
        return bool(self._matcher.is_stopped()) and not self._matcher.is_error()

    @property
    def can_end(self) -> bool:
        """The tokens so far are a complete output (more may still be allowed)."""
        return bool(self._matcher.is_accepting())

    @property
    def error(self) -> str | None:
        return str(self._matcher.get_error()) if self._matcher.is_error() else None


class Grammars:
    """Compiles and checks grammars for one vocabulary. Owns the llguidance tokenizer and a
    small cache of fresh matchers (copied, never handed out), keyed by grammar text."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]):
        self.vocab_size = vocab_size
        eos = list(eos_token_ids) or None
        self._tokenizer = LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos)
        self._fresh: OrderedDict[str, LLMatcher] = OrderedDict()

    def check(self, grammar: str, param: str = "response_format") -> None:
        """Raises ``InvalidRequestError`` naming what the library cannot enforce."""
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise InvalidRequestError(
                f"the grammar is {len(grammar)} characters; at most {MAX_GRAMMAR_CHARS} are "
                "allowed",
                param,
            )
        failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, self._tokenizer)
        if failed:
            raise InvalidRequestError(f"unsupported grammar: {_first_line(messages)}", param)

    def first_mask_error(self, grammar: str) -> str | None:
        """Compiles ``grammar`` and computes its first token mask, as a node's first step does:
        the error that leaves the matcher in, or None. Costs what that step costs (llguidance
        releases the GIL meanwhile), so a caller can time it."""
        matcher = LLMatcher(self._tokenizer, grammar, log_level=0)
        size = (self.vocab_size + 31) // 32 * 4
        mask = ctypes.create_string_buffer(size)
        if not matcher.is_error():
            matcher.unsafe_compute_mask_ptr(ctypes.addressof(mask), size)
        return _first_line([str(matcher.get_error())]) if matcher.is_error() else None

    def matcher(self, grammar: str, generated: Sequence[int] = ()) -> GrammarMatcher:
        """A matcher that has consumed ``generated``; ``InvalidRequestError`` if the grammar
        is invalid or does not allow those tokens."""
        fresh = self._fresh.get(grammar)
        if fresh is None:
            self.check(grammar, "grammar")
            fresh = LLMatcher(self._tokenizer, grammar, log_level=0)
            if fresh.is_error():
                raise InvalidRequestError(f"unsupported grammar: {fresh.get_error()}", "grammar")
            self._fresh[grammar] = fresh
            if len(self._fresh) > CACHED_GRAMMARS:
                self._fresh.popitem(last=False)
        else:
            self._fresh.move_to_end(grammar)
        matcher = GrammarMatcher(fresh.deep_copy())
        for token in generated:
            if not matcher.accept(token):
                raise InvalidRequestError(
                    "the tokens generated so far do not follow the request's grammar", "grammar"
                )
        return matcher


def _first_line(messages: Sequence[str]) -> str:
    text = str(messages[0]) if messages else "rejected by the grammar compiler"
    return text.splitlines()[0][:400] if text else "rejected by the grammar compiler"
