"""The one base of every settings class, and the one place a process's environment is handed
on to a child process."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Self

from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    """What every settings class shares: how it reads the environment.

    Owns the policy: variables are ``CRESCENT_<FIELD>`` (a subclass that reads another
    family, as ``OTEL_*``, sets its own ``env_prefix``), names match in any case, variables
    no field names are ignored (every class reads the same environment), a value is never
    echoed in an error (it may be a secret), and no ``.env`` file is read: deployments hand
    secrets over as files the settings name. Invariant: an instance is read once, from the
    environment of the moment, and validated whole.
    """

    model_config = SettingsConfigDict(
        env_prefix="CRESCENT_",
        extra="ignore",
        hide_input_in_errors=True,
        env_file=None,
        case_sensitive=False,
    )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The settings ``environ`` gives (this process's environment when None), read by the
        same names as the process's; other variables of the process are not consulted."""
        if environ is None:
            return cls()
        prefix = str(cls.model_config.get("env_prefix", "")).lower()
        given = {name.lower(): value for name, value in environ.items()}
        values: dict[str, Any] = {
            field: given[prefix + field] for field in cls.model_fields if prefix + field in given
        }
        return cls.model_validate(values)


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of this process's environment with ``extra`` set, for a child process: a child
    inherits everything (PATH, secrets' file names, its own settings), so it is copied whole."""
    return dict(os.environ) | dict(extra or {})
