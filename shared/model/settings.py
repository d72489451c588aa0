"""What the model package reads from the environment, and the one variable it sets."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from shared.service_settings import ServiceSettings


class CacheDirSettings(ServiceSettings):
    """``CRESCENT_CACHE_DIR`` alone, for the places that need the cache folder without a whole
    service's settings. Invariant: ``folder()`` is absolute when the variable is (``~`` is
    expanded), and ``~/.cache/crescent`` when it is unset or empty."""

    cache_dir: str = Field(default="", description="Converted weights")

    def folder(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir).expanduser()
        return Path.home() / ".cache" / "crescent"


class CompilerSettings(ServiceSettings):
    """The C++ compiler the CPU kernels are built with: ``CXX``, as build tools read it.
    Invariant: ``compiler()`` names a command, ``g++`` when ``CXX`` is unset or blank."""

    model_config = SettingsConfigDict(env_prefix="")

    cxx: str = Field(default="", description="the C++ compiler command")

    def compiler(self) -> str:
        return self.cxx.strip() or "g++"


def keep_hub_offline() -> None:
    """Tells the Hugging Face libraries of this process not to reach the hub (unless the
    environment already says otherwise): a conversion reads local files only."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
