"""Byte layout of a KV-cache block, shared by every component that allocates or moves blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.model.config import ModelConfig

# Element sizes of the dtypes a KV cache may be stored in (fp8_e4m3: torch's float8_e4m3fn).
_ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8_e4m3": 1}


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Bytes layout of one KV block.

    Owns the geometry of a block: ``(num_layers, 2 [K, V], block_size, num_kv_heads, head_dim)``.
    Token-major inside a layer so that a run of blocks gathers into ``[tokens, heads, dim]``
    without copies.

    Invariant: every dimension is a positive int and ``dtype`` is one of the known KV dtypes.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, name)
            # bool is an int subclass, but a True-sized dimension is always a caller bug.
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"KVLayout.{name} must be a positive int, got {value!r}")
        if self.dtype not in _ITEMSIZE:
            known = ", ".join(sorted(_ITEMSIZE))
            raise ValueError(f"KVLayout.dtype {self.dtype!r} is not one of: {known}")

    @property
    def itemsize(self) -> int:
        """Bytes of one element."""
        return _ITEMSIZE[self.dtype]

    @property
    def bytes_per_token(self) -> int:
        """Bytes of K and V for one token across all layers."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.itemsize

    @property
    def block_bytes(self) -> int:
        """Bytes of one block."""
        return self.bytes_per_token * self.block_size

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one block: ``(num_layers, 2, block_size, num_kv_heads, head_dim)``."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @classmethod
    def for_model(cls, config: ModelConfig, block_size: int, dtype: str) -> KVLayout:
        """The layout of a block of ``block_size`` tokens for ``config`` stored as ``dtype``."""
        return cls(
            num_layers=config.num_layers,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            block_size=block_size,
            dtype=dtype,
        )


def num_blocks_for_bytes(layout: KVLayout, nbytes: int) -> int:
    """How many whole blocks of ``layout`` fit in ``nbytes`` (0 for a non-positive budget)."""
    if nbytes <= 0:
        return 0
    return nbytes // layout.block_bytes
