"""The process-wide switches every service reads: development mode and prompt logging."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from pydantic import Field, TypeAdapter, ValidationError, ValidationInfo, field_validator

from shared.service_settings import ServiceSettings

_BOOL: TypeAdapter[bool] = TypeAdapter(bool)


class ProcessFlags(ServiceSettings):
    """``CRESCENT_DEV_MODE`` and ``CRESCENT_LOG_PROMPTS``, as any process reads them.

    Invariant: each is a bool parsed as pydantic parses one (true/false, 1/0, yes/no, on/off);
    an absent or blank variable is false, anything else is refused by name.
    """

    dev_mode: bool = Field(default=False, description="development mode")
    log_prompts: bool = Field(default=False, description="logs may show prompts and completions")

    @field_validator("dev_mode", "log_prompts", mode="before")
    @classmethod
    def _flag(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        raw = value.strip()
        if not raw:
            return False
        try:
            return _BOOL.validate_python(raw)
        except ValidationError:
            name = f"CRESCENT_{(info.field_name or '').upper()}"
            raise ValueError(f"{name} must be true or false, got {raw!r}") from None

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The flags of ``environ`` (default: this process's); ValueError names a malformed one
        in a single line, as a settings error of a service would quote it."""
        try:
            return cls.from_environ(environ)
        except ValidationError as exc:
            reasons = [
                str(error.get("ctx", {}).get("error", error["msg"])) for error in exc.errors()
            ]
            raise ValueError("; ".join(reasons)) from None
