"""tierd fixtures: a real S3 server (``weed mini``) per test module, and a fresh bucket prefix
per test so tests sharing a server never see each other's objects."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from services.tierd.s3 import S3Config
from tests.support.s3 import WeedS3

BUCKET = "tierd-tests"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeedS3]:
    """One server for the module; a test that stops it must bring it back (``start_again``)."""
    server = WeedS3.start(tmp_path_factory.mktemp("weed"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_s3_config(s3_server: WeedS3) -> Callable[..., S3Config]:
    """Builds a config of the module's server under a fresh prefix; keywords override."""

    def make(**overrides: Any) -> S3Config:
        config = S3Config(
            endpoint=s3_server.endpoint,
            bucket=BUCKET,
            prefix=f"t-{secrets.token_hex(4)}/blocks",
            access_key=s3_server.access_key,
            secret_key=s3_server.secret_key,
        )
        return dataclasses.replace(config, **overrides)

    return make


@pytest.fixture
def s3_config(make_s3_config: Callable[..., S3Config]) -> S3Config:
    return make_s3_config()
