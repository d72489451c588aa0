"""The architecture of a Llama-family decoder, independent of where its weights come from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape and numerics of a Llama-family model.

    Invariant: ``num_heads * head_dim`` is the attention width and ``num_heads`` is a
    multiple of ``num_kv_heads`` (grouped-query attention).
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

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token over all layers, in fp32."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * 4

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], model_id: str) -> ModelConfig:
        """Reads a Hugging Face ``config.json`` of a Llama-family model."""
        num_heads = int(d["num_attention_heads"])
        hidden = int(d["hidden_size"])
        rope = d.get("rope_parameters") or {}
        theta = d.get("rope_theta") or rope.get("rope_theta") or 10000.0
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            model_id=model_id,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
            head_dim=int(d.get("head_dim") or hidden // num_heads),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            rope_theta=float(theta),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` a Hugging Face Llama loader accepts for this model."""
        d = asdict(self)
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": d["vocab_size"],
            "hidden_size": d["hidden_size"],
            "intermediate_size": d["intermediate_size"],
            "num_hidden_layers": d["num_layers"],
            "num_attention_heads": d["num_heads"],
            "num_key_value_heads": d["num_kv_heads"],
            "head_dim": d["head_dim"],
            "max_position_embeddings": d["max_position_embeddings"],
            "rope_theta": d["rope_theta"],
            "rms_norm_eps": d["rms_norm_eps"],
            "tie_word_embeddings": d["tie_word_embeddings"],
            "bos_token_id": d["bos_token_id"],
            "eos_token_id": list(d["eos_token_ids"]),
            "hidden_act": "silu",
            "torch_dtype": "float32",
        }
