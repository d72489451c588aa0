"""What the ``crescent`` commands read from the environment beyond the services' settings."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from shared.service_settings import ServiceSettings


class CliSettings(ServiceSettings):
    """The ``CRESCENT_*`` variables `crescent up` and `crescent secrets` consult before they
    start anything: each names the same thing as in the services that read it too. Invariant:
    an empty variable reads as unset."""

    data_dir: str = Field(default="", description="`crescent up`'s folder")
    s3_endpoint: str = Field(default="", description="an S3 server of the deployment")
    served_model_name: str = Field(default="", description="the name clients give the model")
    host_id: str = Field(default="", description="this machine's name")
    node_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="`crescent up`'s CPU priority of the model nodes and their scheduling group",
    )

    def up_folder(self) -> Path:
        """`crescent up`'s logs, catalogue and secrets: ``CRESCENT_DATA_DIR``, else
        ``~/.cache/crescent/up``."""
        if self.data_dir.strip():
            return Path(self.data_dir)
        return Path.home() / ".cache" / "crescent" / "up"


class BenchKeySettings(ServiceSettings):
    """The API key `crescent bench` sends by default: ``OPENAI_API_KEY``, as OpenAI's clients
    read it. Invariant: ``key()`` is None when the variable is unset."""

    model_config = SettingsConfigDict(env_prefix="")

    openai_api_key: SecretStr | None = Field(default=None, description="the default API key")

    def key(self) -> str | None:
        return None if self.openai_api_key is None else self.openai_api_key.get_secret_value()


def named_variable(name: str) -> str | None:
    """The variable a command line names (``key_env=VAR``): no settings class can declare a
    name the user picks, so it is read here, by name, and only here."""
    return os.environ.get(name)
