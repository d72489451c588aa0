"""The transformers-free tokenizer against the transformers tokenizer of the same GGUF."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from shared.errors import InvalidRequestError
from shared.model.files import ModelFiles
from shared.model.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = [
    "",
    "Hello, world!",
    "hello world",
    " leading space",
    "trailing space ",
    "multiple   spaces    here",
    "tabs\tand\nnewlines\n\n\nend",
    "\n",
    "    indented code",
    "def f(x: int) -> int:\n    return x ** 2  # square\n",
    'print("quotes \' and \\" escapes")',
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "The café served naïve crème brûlée.",
    "Ελληνικά και русский текст",
    "日本語のテキストと中文字符",
    "한국어 문장입니다",
    "emoji 😀🎉👍🏽 and family 👨‍👩‍👧",
    "🤖",
    "Mixed: abc 123 ٣٤٥ עברית",
    "<|im_start|>user\nhi<|im_end|>",
    "text with <|endoftext|> inside",
    "<|im_start|><|im_end|>",
    "not special: <|im_start",
    "numbers 3.14159 2,718 1e-10 0xFF",
    "URL https://example.com/path?q=1&r=2#frag",
    "ALL CAPS AND MiXeD cAsE",
    "a" * 200,
    "\u00a0non-breaking\u2009thin\u200bzero-width",
    "math: ∑ x² ≤ ∞ ± √2",
    "\\n literal backslash-n",
]

CHATS: list[tuple[list[dict[str, Any]], bool]] = [
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}], True),
    ([{"role": "user", "content": "What is 2+2?"}], True),
    ([{"role": "user", "content": "What is 2+2?"}], False),
    (
        [
            {"role": "system", "content": "You answer in French."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Bonjour !"},
            {"role": "user", "content": "How are you? 😀 日本"},
        ],
        True,
    ),
    (
        [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi there", "name": None},
        ],
        False,
    ),
]

STREAM_TEXTS = [
    "Hello 👋🏽 world 🤖!",
    "日本語のテキスト、中文字符。",
    "café 😀 naïve 👨‍👩‍👧 end",
    "plain ascii text only",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_equals_transformers(tokenizer: Tokenizer, hf_tokenizer: Any, text: str) -> None:
    assert tokenizer.encode(text) == hf_tokenizer(text).input_ids
    plain = hf_tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.encode(text, add_special_tokens=False) == plain


@pytest.mark.parametrize("text", TEXTS)
def test_decode_equals_transformers(tokenizer: Tokenizer, hf_tokenizer: Any, text: str) -> None:
    ids = [1, *tokenizer.encode(text), 2, 0]
    for skip in (True, False):
        assert tokenizer.decode(ids, skip) == hf_tokenizer.decode(ids, skip_special_tokens=skip)


def test_decode_of_broken_utf8_equals_transformers(tokenizer: Tokenizer, hf_tokenizer: Any) -> None:
    ids = tokenizer.encode("🤖🤖", add_special_tokens=False)
    for cut in range(len(ids) + 1):
        assert tokenizer.decode(ids[:cut]) == hf_tokenizer.decode(ids[:cut])
        assert tokenizer.decode(ids[cut:]) == hf_tokenizer.decode(ids[cut:])


@pytest.mark.parametrize(("messages", "add_generation_prompt"), CHATS)
def test_chat_template_equals_transformers(
    tokenizer: Tokenizer,
    hf_tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
) -> None:
    text = hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert tokenizer.render_chat(messages, add_generation_prompt) == text
    ids = hf_tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
    )
    assert tokenizer.apply_chat_template(messages, add_generation_prompt) == list(ids)


def test_special_token_attributes(tokenizer: Tokenizer, hf_tokenizer: Any) -> None:
    assert tokenizer.vocab_size == len(hf_tokenizer) == 49152
    assert tokenizer.bos_token_id == hf_tokenizer.bos_token_id == 1
    assert tokenizer.eos_token_id == hf_tokenizer.eos_token_id == 2
    assert set(hf_tokenizer.all_special_ids) <= tokenizer.special_ids


def test_id_to_token_equals_transformers(tokenizer: Tokenizer, hf_tokenizer: Any) -> None:
    ids = [0, 1, 2, 17, 905, 28120, 49151, *tokenizer.encode("日本 😀 café")]
    assert [tokenizer.id_to_token(i) for i in ids] == hf_tokenizer.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("text", ["Hello world", "café 😀 日本語", " x\ty\n", "<|im_start|>a"])
def test_token_bytes_concatenate_to_utf8(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_multibyte_chars_are_split_across_tokens(tokenizer: Tokenizer) -> None:
    # Without such splits the streaming tests below would prove nothing.
    for text in STREAM_TEXTS[:2]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert any("\ufffd" in tokenizer.decode([i]) for i in ids)


def _stream(tokenizer: Tokenizer, chunks: list[list[int]], **kwargs: Any) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, **kwargs)
    deltas = [detok.push(chunk) for chunk in chunks]
    deltas.append(detok.flush())
    assert detok.text == "".join(deltas)
    return deltas


@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_token_by_token_stream_equals_decode(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = _stream(tokenizer, [[i] for i in ids])
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_stream_split_at_every_position(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    for cut in range(len(ids) + 1):
        for end in range(cut, len(ids) + 1):
            chunks = [ids[:cut], ids[cut:end], ids[end:]]
            assert "".join(_stream(tokenizer, chunks)) == tokenizer.decode(ids)


@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_stream_ending_mid_character_flushes_replacement(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    for cut in range(len(ids) + 1):
        prefix = ids[:cut]
        assert "".join(_stream(tokenizer, [[i] for i in prefix])) == tokenizer.decode(prefix)


@pytest.mark.parametrize("skip", [True, False])
def test_stream_with_prompt_and_special_tokens(tokenizer: Tokenizer, skip: bool) -> None:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say hi 😀"}])
    ids = [*tokenizer.encode("Hi 😀 日本", add_special_tokens=False), 2, 1, 17]
    deltas = _stream(tokenizer, [[i] for i in ids], prompt_ids=prompt, skip_special_tokens=skip)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_stream_after_prompt_ending_mid_character(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("🤖 robot", add_special_tokens=False)
    prompt, generated = ids[:1], ids[1:]
    deltas = _stream(tokenizer, [[i] for i in generated], prompt_ids=prompt)
    assert "".join(deltas) == tokenizer.decode(generated)


@pytest.mark.parametrize(
    "messages",
    [
        "hello",
        [],
        ["hello"],
        [{"content": "no role"}],
        [{"role": "user"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": None}],
        [{"role": 1, "content": "x"}],
        {"role": "user", "content": "not a list"},
    ],
)
def test_invalid_messages_raise(tokenizer: Tokenizer, messages: Any) -> None:
    with pytest.raises(InvalidRequestError):
        tokenizer.render_chat(messages)
    with pytest.raises(InvalidRequestError):
        tokenizer.apply_chat_template(messages)


def _folder_with_template(model_files: ModelFiles, folder: Path, template: str) -> Tokenizer:
    folder.mkdir()
    shutil.copy(model_files.path / "tokenizer.json", folder / "tokenizer.json")
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return Tokenizer.from_dir(folder)


def test_template_helpers(model_files: ModelFiles, tmp_path: Path) -> None:
    template = (
        "{{ bos_token }}{{ messages | tojson }}"
        "{% generation %}[{{ messages[0].content }}]{% endgeneration %}"
        "{% if strftime_now('%Y') | length != 4 %}{{ raise_exception('bad year') }}{% endif %}"
    )
    tok = _folder_with_template(model_files, tmp_path / "t", template)
    text = tok.render_chat([{"role": "user", "content": "<b>é</b>"}])
    assert text == '<|im_start|>[{"role": "user", "content": "<b>é</b>"}][<b>é</b>]'


def test_template_exception_is_invalid_request(model_files: ModelFiles, tmp_path: Path) -> None:
    template = (
        "{% if messages[0].role != 'system' %}{{ raise_exception('need system') }}{% endif %}"
    )
    tok = _folder_with_template(model_files, tmp_path / "t", template)
    with pytest.raises(InvalidRequestError, match="need system"):
        tok.render_chat([{"role": "user", "content": "hi"}])


def test_template_cannot_escape_sandbox(model_files: ModelFiles, tmp_path: Path) -> None:
    template = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    tok = _folder_with_template(model_files, tmp_path / "t", template)
    with pytest.raises(InvalidRequestError):
        tok.render_chat([{"role": "user", "content": "hi"}])
