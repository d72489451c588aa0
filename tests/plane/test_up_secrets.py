"""What `crescent up` generates for its stack: NATS users, the cache secret, the cachemeta
token — private files, reused or fresh as they should be, and working against real servers."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import nats
import nats.errors
import pytest

from crescent import up, up_secrets
from crescent.nats_config import RELAY, TOOLS
from crescent.processes import stop_all
from shared import subjects
from shared.rpc.client import CacheMetaClient, CacheMetaError
from shared.secrets import read_secret_file
from tests.support.loop import BackgroundLoop, shared_loop


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_cache_secret_is_made_once_per_data_dir_and_kept_private(tmp_path: Path) -> None:
    directory = up_secrets.secrets_dir(tmp_path)
    first: dict[str, str] = {}
    up_secrets.apply_defaults(first, directory)
    assert first["CRESCENT_DEV_MODE"] == "true"
    secret = first["CRESCENT_CACHE_SECRET"]
    assert len(secret) >= 32 and secret == read_secret_file(directory / "cache.secret")
    assert mode(directory) == 0o700 and mode(directory / "cache.secret") == 0o600
    again: dict[str, str] = {}
    up_secrets.apply_defaults(again, up_secrets.secrets_dir(tmp_path))
    assert again["CRESCENT_CACHE_SECRET"] == secret
    other: dict[str, str] = {}
    up_secrets.apply_defaults(other, up_secrets.secrets_dir(tmp_path / "elsewhere"))
    assert other["CRESCENT_CACHE_SECRET"] != secret


def test_given_settings_win(tmp_path: Path) -> None:
    env = {"CRESCENT_CACHE_SECRET": "operator-secret", "CRESCENT_DEV_MODE": "false"}
    up_secrets.apply_defaults(env, up_secrets.secrets_dir(tmp_path))
    assert env == {"CRESCENT_CACHE_SECRET": "operator-secret", "CRESCENT_DEV_MODE": "false"}
    assert not (tmp_path / "secrets" / "cache.secret").exists()
    assert up_secrets.cachemeta_token({"CRESCENT_CACHEMETA_TOKEN": "t"}, tmp_path) == {}


def test_a_fresh_cachemeta_token_per_run(tmp_path: Path) -> None:
    directory = up_secrets.secrets_dir(tmp_path)
    first = up_secrets.cachemeta_token({}, directory)
    token = read_secret_file(Path(first["CRESCENT_CACHEMETA_TOKEN_FILE"]))
    assert mode(Path(first["CRESCENT_CACHEMETA_TOKEN_FILE"])) == 0o600
    second = up_secrets.cachemeta_token({}, directory)
    assert read_secret_file(Path(second["CRESCENT_CACHEMETA_TOKEN_FILE"])) != token


def test_the_embedded_nats_takes_only_its_users(tmp_path: Path) -> None:
    env = dict(os.environ) | {"CRESCENT_NATS_PASSWORD": "inherited", "CRESCENT_NATS_USER": "x"}
    env["CRESCENT_HOST_ID"] = "h1"
    nodes = up_secrets.stack_nodes(env, schedulers=1, prefill=2, decode=1)
    child, url, auth = up._start_nats(tmp_path, env, nodes)
    try:
        identities = up_secrets.nats_identities(env, auth)
        assert "CRESCENT_NATS_PASSWORD" not in env and "CRESCENT_NATS_USER" not in env
        assert set(identities) == {
            "gateway-0", "scheduler-0", "prefill-0", "prefill-1", "decode-0", "tierd-h1",
            "kvindex",
        }  # fmt: skip
        for user, identity in identities.items():
            path = Path(identity["CRESCENT_NATS_PASSWORD_FILE"])
            assert identity["CRESCENT_NATS_USER"] == user and mode(path) == 0o600
        assert mode(auth.config) == 0o600 and mode(auth.password_files[RELAY]) == 0o600

        async def scenario() -> None:
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await nats.connect(url, allow_reconnect=False, connect_timeout=2)
            watcher = await nats.connect(url, **auth.connect_options(TOOLS))
            await watcher.subscribe(subjects.HEARTBEATS_ALL)
            await watcher.flush()
            await watcher.close()
            # No child is the relays' user: it is there for a relay an operator runs.
            relay = await nats.connect(url, **auth.connect_options(RELAY))
            await relay.close()

        asyncio.run(scenario())
    finally:
        stop_all([child])
    passwords = [read_secret_file(path) for path in auth.password_files.values()]
    log = child.log_path.read_text()
    assert "Server is ready" in log
    assert not any(password in log for password in passwords)


@pytest.fixture(scope="module")
def bg_loop() -> BackgroundLoop:
    return shared_loop()


def test_the_embedded_cachemeta_answers_only_with_the_token(
    tmp_path: Path, bg_loop: BackgroundLoop
) -> None:
    env = dict(os.environ) | {"CRESCENT_DEV_MODE": "false"}
    token_env = up_secrets.cachemeta_token(env, up_secrets.secrets_dir(tmp_path))
    child, target = up._start_cachemeta(tmp_path, env | token_env)
    token = read_secret_file(Path(token_env["CRESCENT_CACHEMETA_TOKEN_FILE"]))
    trusted = CacheMetaClient(target, timeout_s=5, token=token)
    stranger = CacheMetaClient(target, timeout_s=5)
    try:
        assert bg_loop.run(trusted.stats()).num_blocks == 0
        with pytest.raises(CacheMetaError, match="missing or wrong cachemeta token"):
            bg_loop.run(stranger.stats())
    finally:
        bg_loop.run(trusted.close())
        bg_loop.run(stranger.close())
        stop_all([child])
    assert token not in child.log_path.read_text()
