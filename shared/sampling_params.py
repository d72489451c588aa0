"""How one request wants its tokens chosen; plain data, shared by the API layer and the engine."""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.errors import InvalidRequestError

MAX_TOP_LOGPROBS = 20
# A smaller positive temperature is greedy in all but name and overflows the scaled logits;
# vLLM clamps to the same floor.
MIN_TEMPERATURE = 0.01
MAX_TEMPERATURE = 2.0
# The wire's bound; any value from the vocabulary size up keeps every token.
MAX_TOP_K = 1 << 31
#: OpenAI's range for frequency_penalty, presence_penalty (each) and for a logit_bias value.
MAX_PENALTY = 2.0
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_REPETITION_PENALTY = 10.0
MAX_STOP_TOKEN_IDS = 1024
#: Longest grammar text a request may carry (a schema of a few hundred properties fits).
MAX_GRAMMAR_CHARS = 256 * 1024
#: What a request may ask of its prompt's cached blocks (``keep``): nothing, to keep them for
#: ``keep_ttl_s``, to pin them until dropped, or to drop a keep.
KEEP_MODES = ("", "ttl", "pin", "drop")
#: The longest time a prefix may be kept for (30 days); a pin has no end.
MAX_KEEP_TTL_S = 30 * 86_400.0
#: vLLM's ``priority`` is any integer; the wire carries 32 bits of it.
MAX_PRIORITY = (1 << 31) - 1
#: The largest share weight a tenant may be given (``tenant_weight``).
MAX_TENANT_WEIGHT = 1000.0
#: The longest time between tokens a request may ask for (``tbt_slo_s``).
MAX_TBT_SLO_S = 3600.0


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling and stopping rules of one sequence.

    ``temperature == 0`` means greedy. ``top_k <= 0`` and ``top_p == 1`` disable those filters.
    ``logprobs`` is the number of most likely alternatives to report per token (``None``: no
    logprobs at all; ``0``: only the chosen token's). ``seed`` makes sampling reproducible.
    ``output_offset`` is the position in the whole completion of the first token this sequence
    generates: non-zero only for a request resumed on another node after its first was lost
    (whose prompt then ends with the completion's first ``output_offset`` tokens).

    The rules that depend on what was generated (``shared.model.logits_processing``):
    ``frequency_penalty`` and ``presence_penalty`` (OpenAI's, over the completion's tokens),
    ``repetition_penalty`` (the multiplicative one of Hugging Face and vLLM, over prompt and
    completion; 1 disables it), ``logit_bias`` (pairs of token id and the value added to its
    logit), ``min_tokens`` (no end-of-sequence or stop token before that many tokens) and
    ``grammar`` (llguidance grammar text every token must follow; "" for none).

    How it uses the KV cache: ``cache_read`` and ``cache_write``, and ``keep`` (one of
    ``KEEP_MODES``) with ``keep_ttl_s``: the prompt's full blocks are kept on the node that
    computes the prompt, for ``keep_ttl_s`` seconds (``ttl``) or until dropped (``pin``), or
    released there (``drop``).

    When its prompt is computed (``shared.engine.prefill_order``): ``priority`` as vLLM takes
    it (a lower value sooner), and ``ttft_deadline``, the Unix time its first token is due
    (0: none; then it is due a fixed time after it reached the engine); ``tenant_weight``,
    its tenant's share of the node's prompt computation against other tenants'
    (``shared.engine.tenant_share``).

    What it asks of the scheduler: ``tbt_slo_s``, the longest time between tokens it accepts
    (0: the scheduler's own objective), which placement predicts and refuses with 429 when no
    decode node can hold it.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    logprobs: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    output_offset: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    grammar: str = ""
    cache_read: bool = True  # False: compute the whole prompt, reusing no cached block
    cache_write: bool = True  # False: the blocks it computes are not offered to the cache
    keep: str = ""
    keep_ttl_s: float = 0.0
    priority: int = 0
    ttft_deadline: float = 0.0
    tenant_weight: float = 1.0
    tbt_slo_s: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def processes_logits(self) -> bool:
        """Whether any rule depends on the tokens generated so far (or biases the logits)."""
        return bool(
            self.frequency_penalty
            or self.presence_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
            or self.grammar
        )

    def validate(self) -> None:
        _check_int(self.max_tokens, "max_tokens", 1, None, "at least 1")
        _check_float(self.temperature, "temperature")
        t = self.temperature
        if t != 0.0 and not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE:
            raise InvalidRequestError(
                f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and "
                f"{MAX_TEMPERATURE:g}, got {t!r}",
                "temperature",
            )
        _check_float(self.top_p, "top_p")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        _check_int(self.top_k, "top_k", -1, MAX_TOP_K, f"-1, 0 or between 1 and {MAX_TOP_K}")
        if self.seed is not None:
            _check_int(self.seed, "seed", 0, 2**63 - 1, "a non-negative 63-bit integer")
        _check_int(self.output_offset, "output_offset", 0, None, "a non-negative integer")
        if self.logprobs is not None:
            _check_int(self.logprobs, "logprobs", 0, MAX_TOP_LOGPROBS, f"0 to {MAX_TOP_LOGPROBS}")
        _check_int(self.priority, "priority", -MAX_PRIORITY, MAX_PRIORITY, "a 32-bit integer")
        _check_float(self.ttft_deadline, "ttft_deadline")
        if self.ttft_deadline < 0:
            raise InvalidRequestError("ttft_deadline must be a Unix time or 0", "ttft_deadline")
        _check_float(self.tenant_weight, "tenant_weight")
        if not 0 < self.tenant_weight <= MAX_TENANT_WEIGHT:
            raise InvalidRequestError(
                f"tenant_weight must be in (0, {MAX_TENANT_WEIGHT:g}], got {self.tenant_weight!r}",
                "tenant_weight",
            )
        _check_float(self.tbt_slo_s, "tbt_slo_s")
        if not 0 <= self.tbt_slo_s <= MAX_TBT_SLO_S:
            raise InvalidRequestError(
                f"tbt_slo_s must be 0 or up to {MAX_TBT_SLO_S:g} s, got {self.tbt_slo_s!r}",
                "tbt_slo_s",
            )
        self._validate_processing()

    def _validate_processing(self) -> None:
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _check_float(value, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise InvalidRequestError(
                    f"{name} must be between -{MAX_PENALTY:g} and {MAX_PENALTY:g}, got {value!r}",
                    name,
                )
        r = self.repetition_penalty
        _check_float(r, "repetition_penalty")
        if not 0.0 < r <= MAX_REPETITION_PENALTY:
            raise InvalidRequestError(
                f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}], got {r!r}",
                "repetition_penalty",
            )
        if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise InvalidRequestError(
                f"logit_bias may hold at most {MAX_LOGIT_BIAS_ENTRIES} tokens", "logit_bias"
            )
        for token_id, bias in self.logit_bias:
            _check_int(token_id, "logit_bias", 0, MAX_TOP_K - 1, "keyed by token ids")
            _check_float(bias, "logit_bias")
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise InvalidRequestError(
                    f"logit_bias values must be between -{MAX_LOGIT_BIAS:g} and "
                    f"{MAX_LOGIT_BIAS:g}, got {bias!r}",
                    "logit_bias",
                )
        # Not bounded by max_tokens here: a prefill node runs a copy limited to one token.
        _check_int(self.min_tokens, "min_tokens", 0, MAX_TOP_K, "a non-negative integer")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidRequestError(
                f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids", "stop_token_ids"
            )
        for token_id in self.stop_token_ids:
            _check_int(token_id, "stop_token_ids", 0, MAX_TOP_K - 1, "token ids")
        if not isinstance(self.grammar, str) or len(self.grammar) > MAX_GRAMMAR_CHARS:
            raise InvalidRequestError(
                f"grammar must be text of at most {MAX_GRAMMAR_CHARS} characters", "grammar"
            )
        self._validate_keep()

    def _validate_keep(self) -> None:
        param = "cache_control.keep"
        if self.keep not in KEEP_MODES:
            raise InvalidRequestError(
                f"keep must be one of {KEEP_MODES[1:]}, got {self.keep!r}", param
            )
        _check_float(self.keep_ttl_s, "keep_ttl_s")
        if self.keep == "ttl" and not 0.0 < self.keep_ttl_s <= MAX_KEEP_TTL_S:
            raise InvalidRequestError(
                f"keep.ttl_s must be above 0 and at most {MAX_KEEP_TTL_S:g} (0 drops a keep), "
                f"got {self.keep_ttl_s!r}",
                param,
            )
        if self.keep in ("ttl", "pin") and not self.cache_write:
            raise InvalidRequestError(
                "keeping a prefix needs the cache: it cannot be combined with write false", param
            )


def _check_int(value: object, name: str, lo: int, hi: int | None, what: str) -> None:
    # bool is an int subclass in Python, but True is no count.
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        raise InvalidRequestError(f"{name} must be {what}, got {value!r}", name)


def _check_float(value: object, name: str) -> None:
    # NaN passes every range check (each comparison is false), so finiteness comes first.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be a finite number, got {value!r}", name)
