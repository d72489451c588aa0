"""Typed access to a GGUF file's metadata and tensor list, for the converter's readers.

Reading a value costs a slice of the memory-mapped file (large for the vocabulary arrays), so
values are read on demand only. Every ``<architecture>.*`` key a reader consults is recorded,
so that keys no reader understood can be refused by name (``unread_keys``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shared.errors import UnsupportedModelError


def float32_value(value: float) -> float:
    """The shortest decimal that is the same float32 as ``value``.

    GGUF stores float metadata as float32, so 1e-6 comes back as 9.99999997e-07; its shortest
    float32 spelling gives back the number the model's config.json had.
    """
    return float(str(np.float32(value)))


class GgufMeta:
    """One GGUF file's metadata and tensor shapes (torch order, slowest dimension first).

    ``arch`` is ``general.architecture``; ``value`` and friends read ``<arch>.<suffix>``.
    """

    def __init__(self, reader: Any, source: Path) -> None:
        self.reader = reader
        self.source = source
        arch = self.raw("general.architecture")
        if not isinstance(arch, str):
            raise UnsupportedModelError(f"{source}: GGUF file has no general.architecture")
        self.arch = arch
        self.tensors: dict[str, tuple[int, ...]] = {
            t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors
        }
        self._read: set[str] = set()

    def raw(self, key: str, default: Any = None) -> Any:
        """The value of the full key ``key``, or ``default`` when the file has none."""
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def value(self, suffix: str, default: Any = None) -> Any:
        key = f"{self.arch}.{suffix}"
        self._read.add(key)
        return self.raw(key, default)

    def has(self, suffix: str) -> bool:
        key = f"{self.arch}.{suffix}"
        self._read.add(key)
        return key in self.reader.fields

    def int_value(self, suffix: str, default: int | None = None) -> int:
        value = self.value(suffix, default)
        if value is None:
            raise UnsupportedModelError(f"{self.source}: GGUF file has no {self.arch}.{suffix}")
        if isinstance(value, list):
            # Per-layer values (head counts, widths) exist in some architectures; none of the
            # families read here has them.
            raise UnsupportedModelError(
                f"{self.source}: per-layer {self.arch}.{suffix} is not supported"
            )
        return int(value)

    def float_value(self, suffix: str, default: float) -> float:
        value = self.optional_float(suffix)
        return default if value is None else value

    def required_float(self, suffix: str) -> float:
        value = self.optional_float(suffix)
        if value is None:
            raise UnsupportedModelError(f"{self.source}: GGUF file has no {self.arch}.{suffix}")
        return value

    def optional_float(self, suffix: str) -> float | None:
        value = self.value(suffix)
        return None if value is None else float32_value(float(value))

    def token_id(self, name: str) -> int | None:
        value = self.raw(f"tokenizer.ggml.{name}_token_id")
        return None if value is None else int(value)

    def layer_count(self) -> int:
        return self.int_value("block_count")

    def unread_keys(self) -> list[str]:
        """Keys of this architecture that no reader consulted (other namespaces, such as
        ``general.*`` and ``tokenizer.*``, never change what the model computes)."""
        prefix = f"{self.arch}."
        return sorted(k for k in self.reader.fields if k.startswith(prefix) and k not in self._read)

    def mark_read(self, *suffixes: str) -> None:
        """Records keys that are known to change nothing Crescent computes."""
        self._read.update(f"{self.arch}.{s}" for s in suffixes)

    def tensor(self, name: str) -> Any:
        """The reader's tensor called ``name``."""
        for tensor in self.reader.tensors:
            if tensor.name == name:
                return tensor
        raise UnsupportedModelError(f"{self.source}: GGUF file has no tensor {name!r}")

    def tensor_values(self, name: str) -> np.ndarray:
        """A small float tensor (rope factors) as float32 values."""
        from gguf.quants import dequantize

        tensor = self.tensor(name)
        return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).ravel()
