"""OpenAI request bodies -> ``GenerateRequest``s: checks every value, renders chats, tokenizes
and fits the completion into the context. Pure: no HTTP, no bus."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from services.gateway import errors, tool_syntax, tools
from services.gateway.grammar_guard import GrammarGuard
from services.gateway.sampling import NO_DEFAULTS, NO_TERMS, TenantTerms, sampling_spec
from services.gateway.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, Tool
from services.gateway.structured import requested_grammar
from services.gateway.validation import (
    CHAT_UNSUPPORTED,
    COMPLETION_UNSUPPORTED,
    reject_unsupported,
    stop_strings,
)
from shared.errors import PromptTooLongError
from shared.messages import GenerateRequest
from shared.model.generation_config import SamplingDefaults
from shared.model.grammar import Grammars
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import MAX_TOP_LOGPROBS
from shared.stream_auth import new_stream_key

PromptInput = str | list[str] | list[int] | list[list[int]]
#: OpenAI's (and vLLM's) default for the legacy completions endpoint.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MAX_CACHE_SALT_LENGTH = 256
#: Prompts times n: one API request never fans out into more sequences than this.
MAX_SEQUENCES = 256


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """How every choice's text is cut and reported (shared by all choices of a request)."""

    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    min_tokens: int = 0  # stop strings count only from this many tokens on
    stop_token_ids: frozenset[int] = frozenset()  # their text is left out unless included
    # Special tokens output as their text: the tool syntax's markers, which its reader needs.
    kept_tokens: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Choice:
    """One sequence to generate: choice ``index`` of the response, for prompt ``prompt_index``."""

    index: int
    prompt_index: int
    request: GenerateRequest


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A validated API request, ready to publish.

    Invariant: ``choices`` are in index order, ``choices[i].request.request_id`` is
    ``f"{id}-{i}"``, and every request's prompt plus ``max_tokens`` fits the context.
    """

    id: str
    kind: str
    model: str
    created: int
    prompts: tuple[tuple[int, ...], ...]
    choices: tuple[Choice, ...]
    options: OutputOptions
    stream: bool
    include_usage: bool
    parse_tool_calls: bool = False  # the answer is read for calls, in ``tool_syntax``
    tool_syntax: tool_syntax.ToolSyntax = tool_syntax.CRESCENT


@dataclass(frozen=True, slots=True)
class _Common:
    n: int
    stop: tuple[str, ...]
    cache_salt: str
    stream: bool
    include_usage: bool


class RequestBuilder:
    """Validates OpenAI bodies and turns them into ``PreparedRequest``s for one served model.

    Owns the tokenizer, the served name, the limits, the tool syntax (``tool_parser``: a
    name, or ``auto``: the template's) and the model's sampling ``defaults``. Invariant: it
    never returns a request that would exceed ``max_model_len`` or carry out-of-range
    sampling values.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        model_name: str,
        max_model_len: int,
        max_n: int,
        tool_parser: str = "auto",
        defaults: SamplingDefaults = NO_DEFAULTS,
        grammar_timeout_s: float | None = None,
        tenant_terms: Mapping[str, TenantTerms] | None = None,
    ):
        self.tokenizer = tokenizer
        self.tenant_terms = dict(tenant_terms or {})
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.max_n = max_n
        self.defaults = defaults
        self.grammar_timeout_s = grammar_timeout_s
        self.tool_syntax = tool_syntax.resolve(tool_parser, tokenizer.chat_template)
        self.tool_markers = tools.special_markers(self.tool_syntax, tokenizer)

    @cached_property
    def grammars(self) -> Grammars:
        """Checks structured-output grammars against the served vocabulary."""
        eos = [] if self.tokenizer.eos_token_id is None else [self.tokenizer.eos_token_id]
        return Grammars(self.tokenizer.backend_json(), self.tokenizer.vocab_size, eos)

    @cached_property
    def guard(self) -> GrammarGuard | None:
        """Bounds a requested grammar's compile time (``grammar_timeout_s``; None: unbounded)."""
        timeout_s = self.grammar_timeout_s
        return None if timeout_s is None else GrammarGuard(self.grammars, timeout_s)

    def chat(self, body: ChatCompletionRequest, tenant: str) -> PreparedRequest:
        self.check_model(body.model)
        reject_unsupported(body, CHAT_UNSUPPORTED)
        common = self._common(body)
        logprobs = self._chat_logprobs(body.logprobs, body.top_logprobs)
        choice, syntax = body.tool_choice, self.tool_syntax
        plan = tools.plan(body.tools, choice, body.parallel_tool_calls, syntax, self.tool_markers)
        grammar = self._grammar(body)
        if plan.grammar and self.guard is not None:
            self.guard.check(plan.grammar, "tools")
            self.guard.check_schemas([t.function.parameters for t in body.tools or ()], "tools")
        if plan.grammar and grammar:
            raise errors.invalid(
                "A required tool call cannot be combined with a structured output",
                "tool_choice",
            )
        prompt = self.render(body.messages, True, body.tools if plan.parse_calls else None)
        requested = body.max_completion_tokens
        param = "max_completion_tokens"
        if requested is None:
            requested, param = body.max_tokens, "max_tokens"
        default = self.defaults.max_tokens
        max_tokens = self._max_tokens(requested, default, len(prompt), param, "messages")
        sized = [(prompt, max_tokens)]
        prepared = self._prepare(
            "chatcmpl", "chat", body, tenant, common, sized, logprobs, plan.grammar or grammar
        )
        options = dataclasses.replace(prepared.options, kept_tokens=plan.kept_tokens)
        return dataclasses.replace(
            prepared, parse_tool_calls=plan.parse_calls, tool_syntax=syntax, options=options
        )

    def _grammar(self, body: ChatCompletionRequest | CompletionRequest) -> str:
        asked = requested_grammar(body, self.grammars, self.guard)
        return "" if asked is None else asked[0]

    def completion(self, body: CompletionRequest, tenant: str) -> PreparedRequest:
        self.check_model(body.model)
        reject_unsupported(body, COMPLETION_UNSUPPORTED)
        common = self._common(body)
        logprobs = body.logprobs
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise errors.invalid(
                f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {logprobs}", "logprobs"
            )
        prompts = self._prompts(body.prompt)
        if len(prompts) * common.n > MAX_SEQUENCES:
            raise errors.invalid(
                f"{len(prompts)} prompts with n={common.n} exceed {MAX_SEQUENCES} sequences", "n"
            )
        default = self.defaults.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
        sized = [(p, self._max_tokens(body.max_tokens, default, len(p), "max_tokens", "prompt"))
                 for p in prompts]  # fmt: skip
        grammar = self._grammar(body)
        return self._prepare("cmpl", "completion", body, tenant, common, sized, logprobs, grammar)

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise errors.model_not_found(name)

    def _common(self, body: ChatCompletionRequest | CompletionRequest) -> _Common:
        n = 1 if body.n is None else body.n
        if not 1 <= n <= self.max_n:
            raise errors.invalid(f"n must be between 1 and {self.max_n}, got {n}", "n")
        stream = bool(body.stream)
        if body.stream_options is not None and not stream:
            raise errors.invalid("stream_options is only allowed when stream is true", "stream")
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        salt = body.cache_salt
        if salt is not None and not 0 < len(salt) <= MAX_CACHE_SALT_LENGTH:
            raise errors.invalid(
                f"cache_salt must be 1 to {MAX_CACHE_SALT_LENGTH} characters", "cache_salt"
            )
        return _Common(n, stop_strings(body.stop), salt or "", stream, include_usage)

    @staticmethod
    def _chat_logprobs(logprobs: bool | None, top: int | None) -> int | None:
        if top is not None and not logprobs:
            raise errors.invalid("top_logprobs requires logprobs to be true", "top_logprobs")
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            raise errors.invalid(
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}",
                "top_logprobs",
            )
        return (top or 0) if logprobs else None

    def render(
        self,
        messages: list[ChatMessage],
        add_generation_prompt: bool = True,
        tool_list: list[Tool] | None = None,
    ) -> tuple[int, ...]:
        """Token ids of the chat as its template renders it, tools included (``tools.render``)."""
        syntax = self.tool_syntax
        return tools.render(self.tokenizer, messages, add_generation_prompt, tool_list, syntax)

    def _prompts(self, prompt: PromptInput) -> list[tuple[int, ...]]:
        items: list[str | list[int]]
        if isinstance(prompt, str):
            items = [prompt]
        elif prompt and all(isinstance(x, int) for x in prompt):
            items = [[x for x in prompt if isinstance(x, int)]]
        else:
            items = [x for x in prompt if not isinstance(x, int)]
        if not items:
            raise errors.invalid("prompt must not be empty", "prompt")
        return [self._prompt_ids(item) for item in items]

    def _prompt_ids(self, item: str | list[int]) -> tuple[int, ...]:
        ids = self.tokenizer.encode(item) if isinstance(item, str) else item
        if not ids:
            raise errors.invalid("prompt must not be empty", "prompt")
        bad = next((t for t in ids if not 0 <= t < self.tokenizer.vocab_size), None)
        if bad is not None:
            raise errors.invalid(
                f"token id {bad} is outside the vocabulary (0..{self.tokenizer.vocab_size - 1})",
                "prompt",
            )
        return tuple(ids)

    def _max_tokens(
        self, requested: int | None, default: int | None, prompt_len: int, param: str, what: str
    ) -> int:
        """The completion budget; without one it is ``default`` or else the rest of the context."""
        if requested is not None and requested < 1:
            raise errors.invalid(f"{param} must be at least 1, got {requested}", param)
        if requested is not None and requested > self.max_model_len:
            raise errors.invalid(
                f"{param} must be at most {self.max_model_len} (the model's context length), "
                f"got {requested}",
                param,
            )
        room = self.max_model_len - prompt_len
        wanted = requested if requested is not None else min(default or room, room)
        if wanted < 1 or prompt_len + wanted > self.max_model_len:
            exc = PromptTooLongError(prompt_len, max(wanted, 1), self.max_model_len)
            raise errors.invalid(str(exc), what)
        return wanted

    def _prepare(
        self,
        prefix: str,
        kind: str,
        body: ChatCompletionRequest | CompletionRequest,
        tenant: str,
        common: _Common,
        prompts: list[tuple[tuple[int, ...], int]],
        logprobs: int | None,
        grammar: str,
    ) -> PreparedRequest:
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        now = time.time()
        vocab, defaults = self.tokenizer.vocab_size, self.defaults
        terms = self.tenant_terms.get(tenant, NO_TERMS)
        choices = []
        for p, (prompt, max_tokens) in enumerate(prompts):
            for j in range(common.n):
                sampling = sampling_spec(
                    body, max_tokens, logprobs, j, vocab, grammar, defaults, now, terms
                )
                request = GenerateRequest(
                    request_id=f"{request_id}-{p * common.n + j}",
                    tenant=tenant,
                    prompt_token_ids=list(prompt),
                    sampling=sampling,
                    cache_salt=common.cache_salt,
                    arrival_ts=now,
                    stream_key=new_stream_key(),
                )
                choices.append(Choice(p * common.n + j, p, request))
        options = OutputOptions(
            common.stop,
            bool(body.include_stop_str_in_output),
            logprobs,
            body.min_tokens or 0,
            frozenset(body.stop_token_ids or ()),
        )
        return PreparedRequest(
            id=request_id,
            kind=kind,
            model=self.model_name,
            created=int(now),
            prompts=tuple(p for p, _ in prompts),
            choices=tuple(choices),
            options=options,
            stream=common.stream,
            include_usage=common.include_usage,
        )
