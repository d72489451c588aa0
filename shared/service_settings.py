"""The one base of every settings class, and the one place a process's environment is handed
on to a child process."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Self

from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict


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
        same names and rules as the process's; nothing else is consulted."""
        if environ is None:
            return cls()
        # The pydantic plugin of mypy does not know this documented argument of BaseSettings.
        return cls(_build_sources=((_GivenEnvironment(cls, environ),), {}))  # type: ignore[call-arg]


class _GivenEnvironment(EnvSettingsSource):
    """The environment source of a settings class over a given mapping, not ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        # The base constructor loads the variables, so the mapping must be in place first.
        self._given = dict(environ)
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        if self.case_sensitive:
            return dict(self._given)
        return {name.lower(): value for name, value in self._given.items()}


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of this process's environment with ``extra`` set, for a child process: a child
    inherits everything (PATH, secrets' file names, its own settings), so it is copied whole."""
    return dict(os.environ) | dict(extra or {})
