"""Output assembly: ordering, UTF-8 safety, stop strings, finish reasons, logprobs."""

from __future__ import annotations

import pytest

from services.gateway.output import BackendError, ChoiceAssembler, Delta
from services.gateway.requests import OutputOptions
from shared.messages import TokenChunk, TokenLogprob
from shared.model.tokenizer import Tokenizer
from tests.support.fake_engine import REPLY

PROMPT = (1, 2, 3)


def reply_ids(tokenizer: Tokenizer, text: str = REPLY) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.eos_token_id is not None
    return [*ids, tokenizer.eos_token_id]


def chunks(ids: list[int], size: int, reason: str = "stop") -> list[TokenChunk]:
    return [
        TokenChunk(
            request_id="r-0",
            index=i,
            token_ids=ids[i : i + size],
            finish_reason=reason if i + size >= len(ids) else None,
        )
        for i in range(0, len(ids), size)
    ]


def assemble(
    tokenizer: Tokenizer,
    parts: list[TokenChunk],
    options: OutputOptions | None = None,
    max_tokens: int = 1000,
) -> tuple[ChoiceAssembler, list[Delta]]:
    choice = ChoiceAssembler(tokenizer, PROMPT, max_tokens, options or OutputOptions())
    deltas = [choice.add(c) for c in parts]
    return choice, deltas


def test_one_token_at_a_time_gives_the_reply_without_broken_characters(
    tokenizer: Tokenizer,
) -> None:
    ids = reply_ids(tokenizer)
    choice, deltas = assemble(tokenizer, chunks(ids, 1))
    assert choice.text == REPLY
    assert "".join(d.text for d in deltas) == REPLY
    # The moon's four bytes come in three tokens: no delta may show a replacement character.
    assert all("\ufffd" not in d.text for d in deltas)
    assert any(d.text.endswith("🌙") for d in deltas)
    assert choice.finish_reason == "stop" and deltas[-1].finish_reason == "stop"
    assert choice.completion_tokens == len(ids)


def test_out_of_order_and_duplicate_chunks_are_put_in_order(tokenizer: Tokenizer) -> None:
    parts = chunks(reply_ids(tokenizer), 3)
    shuffled = [parts[2], parts[0], parts[-1], parts[1], parts[0], *parts[3:-1], parts[2]]
    choice, deltas = assemble(tokenizer, shuffled)
    assert choice.text == REPLY
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["stop"]


def test_finish_chunk_first_waits_for_the_missing_tokens(tokenizer: Tokenizer) -> None:
    parts = chunks(reply_ids(tokenizer), 4)
    choice, deltas = assemble(tokenizer, [parts[-1]])
    assert not choice.finished and deltas[0].text == ""
    for part in parts[:-1]:
        choice.add(part)
    assert choice.finished and choice.text == REPLY


@pytest.mark.parametrize("size", [1, 2, 5])
@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        ("llo wö", "Hello! Crescent says hé"),  # spans four tokens and a two-byte character
        ("🌙", "Hello! Crescent says héllo wörld "),  # a character split over three tokens
        ("Crescent", "Hello! "),
        ("end.", "Hello! Crescent says héllo wörld 🌙. The "),
    ],
)
def test_stop_strings_never_leak(tokenizer: Tokenizer, size: int, stop: str, expected: str) -> None:
    options = OutputOptions(stop=("nowhere", stop))
    choice, deltas = assemble(tokenizer, chunks(reply_ids(tokenizer), size), options)
    assert choice.text == expected
    assert "".join(d.text for d in deltas) == expected
    assert choice.finish_reason == "stop"
    # Tokens after the match are not output, so they are not counted either.
    assert choice.completion_tokens < len(reply_ids(tokenizer))


def test_text_held_for_a_stop_string_that_never_completes_is_released(
    tokenizer: Tokenizer,
) -> None:
    options = OutputOptions(stop=("The endless",))
    choice, deltas = assemble(tokenizer, chunks(reply_ids(tokenizer), 1), options)
    assert choice.text == REPLY
    held = [d for d in deltas if d.text == "" and not d.finish_reason]
    assert held, "some text must have been held back while it could start the stop string"


def test_include_stop_str_in_output(tokenizer: Tokenizer) -> None:
    options = OutputOptions(stop=("wörld",), include_stop_str_in_output=True)
    choice, _ = assemble(tokenizer, chunks(reply_ids(tokenizer), 2), options)
    assert choice.text == "Hello! Crescent says héllo wörld"


def test_earliest_of_several_stop_strings_wins(tokenizer: Tokenizer) -> None:
    options = OutputOptions(stop=("The", "says"))
    choice, _ = assemble(tokenizer, chunks(reply_ids(tokenizer), 100), options)
    assert choice.text == "Hello! Crescent "


def test_max_tokens_gives_length(tokenizer: Tokenizer) -> None:
    choice, deltas = assemble(tokenizer, chunks(reply_ids(tokenizer), 3), max_tokens=5)
    assert choice.text == "Hello! Crescent says h"
    assert choice.finish_reason == "length" and choice.completion_tokens == 5
    assert sum(1 for d in deltas if d.finish_reason) == 1


def test_eos_as_the_last_allowed_token_is_a_stop(tokenizer: Tokenizer) -> None:
    ids = reply_ids(tokenizer)
    choice, _ = assemble(tokenizer, chunks(ids, 3), max_tokens=len(ids))
    assert choice.finish_reason == "stop"


def test_backend_length_flushes_a_partial_character(tokenizer: Tokenizer) -> None:
    ids = reply_ids(tokenizer)[:11]  # ends inside the moon
    choice, _ = assemble(tokenizer, chunks(ids, 3, reason="length"))
    assert choice.finish_reason == "length"
    assert choice.text.startswith("Hello! Crescent says héllo wörld")


def test_error_chunk_raises(tokenizer: Tokenizer) -> None:
    choice = ChoiceAssembler(tokenizer, PROMPT, 10, OutputOptions())
    error = TokenChunk(
        request_id="r-0", index=0, token_ids=[], error="busy", error_code=429, retry_after_s=2
    )
    with pytest.raises(BackendError) as info:
        choice.add(error)
    assert info.value.code == 429 and info.value.retry_after_s == 2


def test_logprobs_are_kept_in_order_with_text_offsets(tokenizer: Tokenizer) -> None:
    ids = reply_ids(tokenizer)
    parts = chunks(ids, 3)
    for part in parts:
        part.logprobs = [
            TokenLogprob(t, -0.5 * (part.index + k), [(t, -0.1)])
            for k, t in enumerate(part.token_ids)
        ]
    options = OutputOptions(logprobs=1)
    choice, _ = assemble(tokenizer, [parts[1], parts[0], *parts[2:]], options)
    assert [lp.token_id for lp in choice.logprobs] == ids
    assert [lp.logprob for lp in choice.logprobs] == [-0.5 * i for i in range(len(ids))]
    assert choice.offsets[:3] == [0, 5, 6]  # "Hello", "!", " Crescent"


def test_logprobs_are_dropped_unless_requested(tokenizer: Tokenizer) -> None:
    parts = chunks(reply_ids(tokenizer), 50)
    parts[0].logprobs = [TokenLogprob(t, -1.0, []) for t in parts[0].token_ids]
    choice, _ = assemble(tokenizer, parts)
    assert choice.logprobs == []


def test_cached_tokens_come_from_any_chunk(tokenizer: Tokenizer) -> None:
    parts = chunks(reply_ids(tokenizer), 4)
    parts[0].num_cached_tokens = 64
    choice, _ = assemble(tokenizer, parts)
    assert choice.num_cached_tokens == 64


def test_a_stop_token_ends_the_choice_without_its_text_unless_asked(tokenizer: Tokenizer) -> None:
    words = tokenizer.encode("one two three", add_special_tokens=False)
    stop = words[-1]
    options = OutputOptions(stop_token_ids=frozenset({stop}))
    choice, _ = assemble(tokenizer, chunks(words, 2), options)
    assert choice.text == tokenizer.decode(words[:-1]) and choice.finish_reason == "stop"
    assert choice.completion_tokens == len(words)
    kept = OutputOptions(stop_token_ids=frozenset({stop}), include_stop_str_in_output=True)
    choice, _ = assemble(tokenizer, chunks(words, 2), kept)
    assert choice.text == "one two three"


def test_stop_strings_count_only_from_min_tokens_on(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("a b a b a b", add_special_tokens=False)
    early = OutputOptions(stop=("b",))
    choice, _ = assemble(tokenizer, chunks(ids, 1), early)
    assert choice.text == "a "
    # The fourth token is the first whose text may hold a stop: " b" of the second pair.
    held = OutputOptions(stop=("b",), min_tokens=4)
    choice, _ = assemble(tokenizer, chunks(ids, 1), held)
    assert len(ids) == 6 and choice.text == "a b a "
