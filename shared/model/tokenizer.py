"""Text <-> token ids and chat templates, from a model folder, without importing transformers.

Startup must stay well under a second here, so the folder's ``tokenizer.json`` is read with the
``tokenizers`` library and the chat template is rendered with jinja2 the way transformers does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _BackendTokenizer

from shared.errors import InvalidRequestError, ModelNotFoundError

_BYTE_TOKEN_RE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of the byte-level BPE alphabet, where every byte is shown as a printable char."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in printable}
    shift = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shift)] = b
            shift += 1
    return table


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json stores special tokens either as strings or as AddedToken dicts.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _uses_byte_level(node: Any) -> bool:
    if isinstance(node, dict):
        if node.get("type") == "ByteLevel":
            return True
        return any(_uses_byte_level(child) for child in node.get("decoders") or [])
    return False


def _read_chat_template(path: Path, tok_config: dict[str, Any]) -> str | None:
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = tok_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


class _GenerationTag(Extension):
    """Accepts ``{% generation %}...{% endgeneration %}`` blocks and renders their body as is."""

    tags = {"generation"}  # noqa: RUF012 - jinja2 reads this class attribute

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja2's own tojson escapes HTML characters, which chat templates must not do.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compiles a chat template in the sandboxed environment chat templates are written for."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Checks the chat messages and returns copies without ``None`` values (templates test keys)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list", param="messages")
    cleaned = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError(f"messages[{i}] must be an object", param="messages")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise InvalidRequestError(
                    f"messages[{i}].{key} must be a string", param=f"messages[{i}].{key}"
                )
        cleaned.append({k: v for k, v in message.items() if v is not None})
    return cleaned


class Tokenizer:
    """Encodes, decodes and renders chats for one model, from its folder's tokenizer files.

    Owns the ``tokenizers`` backend, the compiled chat template and the special-token table.
    Invariant: results equal those of the transformers tokenizer saved in the same folder.
    """

    def __init__(
        self, backend: _BackendTokenizer, tok_config: dict[str, Any], chat_template: str | None
    ) -> None:
        self._backend = backend
        spec = json.loads(backend.to_str())
        self._byte_level = _uses_byte_level(spec.get("decoder"))
        added = spec.get("added_tokens") or []
        self._added: dict[int, str] = {int(t["id"]): str(t["content"]) for t in added}
        self.special_ids: frozenset[int] = frozenset(
            int(t["id"]) for t in added if t.get("special")
        )
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self._special_tokens = {
            name: text for name in _SPECIAL_NAMES if (text := _token_text(tok_config.get(name)))
        }
        self.bos_token_id: int | None = self._id_of(self._special_tokens.get("bos_token"))
        self.eos_token_id: int | None = self._id_of(self._special_tokens.get("eos_token"))
        self._clean_up = bool(tok_config.get("clean_up_tokenization_spaces", False))
        self._is_bpe = spec.get("model", {}).get("type") == "BPE"
        self.chat_template = chat_template
        self._template = compile_chat_template(chat_template) if chat_template else None

    @classmethod
    def from_dir(cls, path: Path) -> Tokenizer:
        """Loads ``tokenizer.json``, ``tokenizer_config.json`` and the chat template of a folder."""
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelNotFoundError(f"{path} has no tokenizer.json")
        config_file = path / "tokenizer_config.json"
        tok_config: dict[str, Any] = {}
        if config_file.is_file():
            tok_config = json.loads(config_file.read_text(encoding="utf-8"))
        backend = _BackendTokenizer.from_file(str(tok_file))
        return cls(backend, tok_config, _read_chat_template(path, tok_config))

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens written in the text become their ids."""
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``; incomplete UTF-8 sequences become U+FFFD."""
        text: str = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        # Space clean-up corrupts BPE output, so transformers only honours it for other models.
        if self._clean_up and not self._is_bpe:
            text = _clean_up_spaces(text)
        return text

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text the chat template makes of ``messages``; ``tools`` reach the template
        as given (OpenAI function dicts), as transformers' ``apply_chat_template`` passes them."""
        if self._template is None:
            raise InvalidRequestError("This model has no chat template", param="messages")
        cleaned = validate_messages(messages)
        try:
            return self._template.render(
                messages=cleaned,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._special_tokens,
            )
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(
                f"Chat template rejected the messages: {exc}", param="messages"
            ) from exc

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of the rendered chat; the template itself writes any BOS it wants."""
        return self.encode(self.render_chat(messages, add_generation_prompt, tools), False)

    def backend_json(self) -> str:
        """The whole tokenizer as ``tokenizer.json`` text (what grammar matchers load)."""
        return str(self._backend.to_str())

    def vocab_by_id(self) -> list[str]:
        """Every raw vocabulary string, indexed by token id."""
        vocab = self._backend.get_vocab(with_added_tokens=True)
        table = [""] * self.vocab_size
        for token, token_id in vocab.items():
            if 0 <= token_id < self.vocab_size:
                table[token_id] = token
        return table

    def id_to_token(self, token_id: int) -> str:
        """The raw vocabulary string of ``token_id`` (byte-level alphabet for BPE models)."""
        token = self._backend.id_to_token(token_id)
        if token is None:
            raise InvalidRequestError(f"token id {token_id} is out of range")
        return str(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for; may be part of a multibyte character."""
        token = self.id_to_token(token_id)
        if token_id in self._added:
            return token.encode("utf-8")
        if self._byte_level:
            table = _unicode_to_byte()
            return bytes(table[ch] for ch in token)
        byte_match = _BYTE_TOKEN_RE.match(token)
        if byte_match is not None:
            return bytes([int(byte_match.group(1), 16)])
        return token.replace("\u2581", " ").encode("utf-8")


def _clean_up_spaces(text: str) -> str:
    for before, after in (
        (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
        (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
    ):  # fmt: skip
        text = text.replace(before, after)
    return text


class IncrementalDetokenizer:
    """Turns a growing list of generated ids into text deltas, never half a UTF-8 character.

    Owns a short window of ids: ``[prefix, read)`` was already turned into text and is decoded
    again only as context, ``[read, end)`` is pending. Invariant: ``text`` plus what ``flush``
    returns equals ``decode`` of all pushed ids (for byte-level tokenizers also with a prompt).
    """

    _CONTEXT_IDS = 6

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = self._context(prompt_ids)
        self._prefix = 0
        self._read = len(self._ids)
        self.text = ""

    def _context(self, prompt_ids: Sequence[int] | None) -> list[int]:
        # Prompt context makes tokenizers that strip a leading space render the first token as
        # it appears after the prompt; a prompt ending mid-character would corrupt it, so skip.
        context = list(prompt_ids or [])[-self._CONTEXT_IDS :]
        if context and self._decode(context).endswith("\ufffd"):
            return []
        return context

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def push(self, token_ids: Sequence[int]) -> str:
        """Adds generated ids and returns the text that became final (maybe "")."""
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Returns whatever is still pending, U+FFFD included if the ids end mid-character."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) and not final:
            return ""
        if new_text.endswith("\ufffd") and not final:
            return ""
        delta = new_text[len(prefix_text) :]
        # The ids just emitted become the context window for the next decode.
        del self._ids[: self._read]
        self._prefix, self._read = 0, len(self._ids)
        self.text += delta
        return delta
