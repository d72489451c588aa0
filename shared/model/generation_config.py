"""The sampling defaults a model's authors recommend, read as vLLM's ``--generation-config
auto`` reads them: ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty`` and
``max_new_tokens`` (the default ``max_tokens``) of the folder's ``generation_config.json``.
A GGUF file carries them as ``general.sampling.*``; its converted folder gets the same file.
``do_sample`` is not read (vLLM does not either). Pure: JSON in, values out.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.errors import InvalidRequestError
from shared.sampling_params import SamplingParams

if TYPE_CHECKING:
    from shared.model.gguf_meta import GgufMeta

log = logging.getLogger(__name__)

GENERATION_CONFIG = "generation_config.json"
#: generation_config.json keys -> the request fields whose default they are.
KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
#: Keys vLLM applies that Crescent's sampler does not implement: named in the log, not used.
UNSUPPORTED = ("min_p",)
#: llama.cpp's ``general.sampling.*`` keys -> generation_config.json keys.
GGUF_KEYS = {
    "temp": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "penalty_repeat": "repetition_penalty",
}
MODES = ("auto", "none")


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """What a request gets for each sampling field it leaves out; ``None``: Crescent's own
    (temperature 1, top_p 1, no top_k, no repetition penalty, and for ``max_tokens`` the rest
    of the context, 16 on ``/v1/completions``). ``source`` says where the values came from."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    source: str = ""

    def values(self) -> dict[str, float | int]:
        """The fields that replace Crescent's defaults."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "source" and getattr(self, f.name) is not None
        }

    def describe(self) -> str:
        """One line for the start-up log."""
        values = self.values()
        own = "temperature 1, top_p 1, max_tokens the rest of the context"
        if not values:
            return f"Crescent's ({own}): the model's generation config sets none"
        shown = ", ".join(f"{k}={v:g}" for k, v in values.items())
        return f"{shown} from {self.source}; Crescent's for the others"


def read_generation_config(folder: Path) -> dict[str, Any]:
    """The folder's ``generation_config.json`` as a dict; empty when it has none."""
    path = folder / GENERATION_CONFIG
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("%s is not read: %s", path, exc)
        return {}
    return raw if isinstance(raw, dict) else {}


def sampling_defaults(
    folder: Path, mode: str = "auto", overrides: Mapping[str, Any] | None = None
) -> SamplingDefaults:
    """The defaults of the model in ``folder``: its generation config's (``mode`` "auto") or
    none ("none"), then ``overrides`` (generation_config.json keys) over them. A value of
    the model's that Crescent cannot use is skipped with a warning; a bad override raises
    ``ValueError``."""
    if mode not in MODES:
        raise ValueError(f"generation config must be one of {MODES}, got {mode!r}")
    found = read_generation_config(folder) if mode == "auto" else {}
    values = usable(found, f"{folder / GENERATION_CONFIG}", strict=False)
    source = "the model's generation_config.json" if values else ""
    if overrides:
        values |= usable(dict(overrides), "the generation config override", strict=True)
        source = f"{source} and the override" if source else "the generation config override"
    return SamplingDefaults(**values, source=source)


def usable(config: dict[str, Any], where: str, strict: bool) -> dict[str, Any]:
    """The keys of ``config`` Crescent applies, as request fields, each checked as a request's
    value would be. ``strict``: a key or value it cannot apply raises ``ValueError`` (else it
    is skipped with a warning)."""
    values: dict[str, Any] = {}
    for key, value in config.items():
        if key in UNSUPPORTED and value is not None:
            log.warning("%s: %s=%r is not applied (Crescent has no %s)", where, key, value, key)
        field = KEYS.get(key)
        if field is None or value is None:
            if strict and key not in UNSUPPORTED:
                raise ValueError(f"{where}: {key!r} is not one of {sorted(KEYS)}")
            continue
        try:
            SamplingParams(**{field: value})
        except (InvalidRequestError, TypeError) as exc:
            if strict:
                raise ValueError(f"{where}: {key}: {exc}") from None
            log.warning("%s: %s=%r is not applied: %s", where, key, value, exc)
            continue
        values[field] = value
    return values


def from_gguf(meta: GgufMeta) -> dict[str, Any]:
    """The generation_config.json keys of a GGUF file's ``general.sampling.*`` metadata."""
    from shared.model.gguf_meta import float32_value  # numpy: only the converter needs it

    config: dict[str, Any] = {}
    for gguf_key, key in GGUF_KEYS.items():
        value = meta.raw(f"general.sampling.{gguf_key}")
        if value is None:
            continue
        config[key] = int(value) if key == "top_k" else float32_value(float(value))
    return config
