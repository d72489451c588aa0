"""The architecture of a decoder-only model, independent of where its weights come from.

One ``ModelConfig`` describes every family Crescent serves (Llama, Mistral, Qwen 2/3, Gemma
2/3, Phi-3, and mixtures of experts): a shared decoder whose per-family differences are
explicit fields here. Reading a Hugging Face ``config.json`` into it, and refusing what it
cannot express, is ``shared/model/hf_config.py``'s job. No torch here: the gateway reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Rope kinds whose rotation of a token depends on the sequence it belongs to, not only on its
# position (see RopeSpec.depends_on_length).
LENGTH_DEPENDENT_ROPES = ("dynamic", "longrope")


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """Rotary position embedding of one kind of layer.

    ``kind`` is transformers' ``rope_type`` ("default", "linear", "dynamic", "yarn",
    "longrope", "llama3") and the other fields are its parameters; ``rotary_dim`` is the part
    of each head that rotates (the rest passes through). ``max_positions`` is the model's
    ``max_position_embeddings``, which dynamic scaling and longrope's default factor read.
    """

    kind: str = "default"
    theta: float = 10000.0
    rotary_dim: int = 0
    max_positions: int = 2048
    factor: float = 1.0
    original_max_positions: int = 0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()

    @property
    def depends_on_length(self) -> bool:
        """Whether a token's rotation depends on its sequence's prompt length too.

        transformers recomputes these kinds per forward pass from the longest position in it:
        a prompt past the original window is rotated as a whole by its own length, a token
        generated after it by the length so far. Crescent rotates every token by
        ``max(position + 1, prompt length)``, which is exactly that for a prompt computed
        in one pass followed by one token per step, however the prompt is chunked.
        """
        return self.kind in LENGTH_DEPENDENT_ROPES

    @property
    def window(self) -> int:
        """The length past which a length-dependent kind changes the rotation."""
        if self.kind == "longrope":
            return self.original_max_positions
        return self.max_positions


@dataclass(frozen=True, slots=True)
class MoeSpec:
    """A sparse mixture-of-experts MLP: ``num_experts`` SwiGLU experts of width
    ``intermediate_size``, ``top_k`` chosen per token by a softmax router (renormalized over
    the chosen when ``norm_topk_prob``). ``sparse_layers[i]`` says whether layer ``i`` has it
    (the others have the dense MLP of ``ModelConfig.intermediate_size``)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    sparse_layers: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape and numerics of a decoder-only model.

    Invariant: ``num_heads`` is a multiple of ``num_kv_heads`` (grouped-query attention);
    per-layer tuples (``layer_windows``, ``layer_ropes``) are empty or have one entry per
    layer; ``layer_ropes`` index ``ropes``.
    """

    model_id: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    architecture: str = "LlamaForCausalLM"
    hidden_act: str = "silu"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    # Gemma 2/3: a norm on the attention's and the MLP's output before each residual add.
    sandwich_norms: bool = False
    # Gemma's norms scale by (1 + weight): the loader adds this to every norm weight it reads.
    norm_weight_offset: float = 0.0
    embedding_scale: float | None = None
    attention_scale: float | None = None  # None: head_dim ** -0.5
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    layer_windows: tuple[int | None, ...] = ()
    ropes: tuple[RopeSpec, ...] = ()
    layer_ropes: tuple[int, ...] = ()
    moe: MoeSpec | None = None
    # Phi-3: once a sequence grows past a length-dependent rope's window, every token it holds
    # is rotated anew for its length (transformers drops the cache there and recomputes).
    rope_restarts_past_window: bool = False
    # The longest context the model serves, where its rope scaling extends it beyond
    # max_position_embeddings (0: max_position_embeddings).
    max_context: int = 0

    def __post_init__(self) -> None:
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        for name in ("layer_windows", "layer_ropes"):
            values = getattr(self, name)
            if values and len(values) != self.num_layers:
                raise ValueError(f"{name} has {len(values)} entries for {self.num_layers} layers")
        if any(i >= len(self.rope_specs) for i in self.layer_ropes):
            raise ValueError("layer_ropes names a rope that is not in ropes")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token over all layers, in fp32."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * 4

    @property
    def weights_per_token(self) -> int:
        """The weights one token multiplies through (projections, MLP or its chosen experts,
        the head), about half its FLOPs: what sets a prompt's cost per token."""
        attention = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        if self.moe is not None:
            mlp = 3 * self.hidden_size * self.moe.intermediate_size * self.moe.top_k
        return self.num_layers * (attention + mlp) + self.vocab_size * self.hidden_size

    @property
    def context_length(self) -> int:
        """The most tokens (prompt and output) one sequence may hold."""
        return self.max_context or self.max_position_embeddings

    @property
    def rope_specs(self) -> tuple[RopeSpec, ...]:
        """Every rope the layers use (a plain one from ``rope_theta`` when none is given)."""
        if self.ropes:
            return self.ropes
        return (
            RopeSpec(
                theta=self.rope_theta,
                rotary_dim=self.head_dim,
                max_positions=self.max_position_embeddings,
                original_max_positions=self.max_position_embeddings,
            ),
        )

    def layer_rope(self, layer: int) -> int:
        """Which of ``rope_specs`` layer ``layer`` rotates with."""
        return self.layer_ropes[layer] if self.layer_ropes else 0

    def layer_window(self, layer: int) -> int | None:
        """How many of the latest tokens (itself included) layer ``layer`` attends to; None:
        all of them."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def rope_depends_on_length(self) -> bool:
        return any(spec.depends_on_length for spec in self.rope_specs)

    @property
    def rope_restart_length(self) -> int | None:
        """The length past which a sequence is computed anew (``rope_restarts_past_window``);
        None where nothing is."""
        if not self.rope_restarts_past_window:
            return None
        windows = [s.window for s in self.rope_specs if s.depends_on_length]
        return min(windows) if windows else None

    def rope_scope(self, prompt_length: int) -> str:
        """A name for how the prompt's tokens were rotated, "" in the usual case: KV of the
        same tokens rotated differently must never be shared, so block hashes include it."""
        scopes = [
            f"{spec.kind}:{prompt_length}"
            for spec in self.rope_specs
            if spec.depends_on_length and prompt_length > spec.window
        ]
        if not scopes:
            return ""
        # longrope switches once past its window; dynamic scaling depends on the length itself.
        if all(s.startswith("longrope:") for s in scopes):
            return "longrope:long"
        return ",".join(scopes)

    @property
    def is_plain_llama(self) -> bool:
        """Whether this is the Llama block the fused decode kernel computes: no biases, norms
        or softcaps beyond Llama's, full attention, a SwiGLU MLP and one rope over whole heads
        that depends on positions only (its tables carry any scaling)."""
        rope = self.rope_specs
        return (
            not (self.qkv_bias or self.o_bias or self.mlp_bias or self.qk_norm)
            and not self.sandwich_norms
            and self.hidden_act == "silu"
            and self.embedding_scale is None
            and self.attention_scale is None
            and self.attn_logit_softcap is None
            and self.final_logit_softcap is None
            and not any(w is not None for w in self.layer_windows)
            and self.moe is None
            and len(rope) == 1
            and rope[0].rotary_dim == self.head_dim
            and not rope[0].depends_on_length
        )

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], model_id: str) -> ModelConfig:
        """Reads a Hugging Face ``config.json`` of any supported family (``hf_config``);
        raises ``UnsupportedModelError`` naming what it does not implement."""
        from shared.model.hf_config import read_hf_config

        return read_hf_config(d, model_id)

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` a Hugging Face Llama loader accepts (plain Llama models only)."""
        if not self.is_plain_llama or self.rope_specs[0].kind != "default":
            raise ValueError(f"{self.model_id} is not a plain Llama model")
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids),
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }
