"""Secrets in settings: the production rules, files, fingerprints, and errors that never
contain a secret."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from crescent.secret_files import new_secret
from services.scheduler.config import SchedulerSettings
from shared.nats_auth import NatsAuthSettings
from shared.node.settings import NodeSettings
from shared.secrets import (
    DEV_CACHE_SECRET,
    CacheMetaTokenSettings,
    check_db_url,
    check_password,
    dev_mode,
    is_placeholder,
    log_prompts,
    loggable,
    read_secret_file,
    secret_fingerprint,
)

PASSWORD = "pw-7f3a9c1e5b2d4f60"
SECRET = "a-long-production-cache-secret-0123"


@pytest.fixture
def production(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_DEV_MODE", "false")
    for name in ("CACHE_SECRET", "NATS_USER", "NATS_PASSWORD", "NATS_PASSWORD_FILE"):
        monkeypatch.delenv(f"CRESCENT_{name}", raising=False)


def error_text(info: pytest.ExceptionInfo[ValidationError]) -> str:
    return f"{info.value}\n{info.value.json()}\n{info.value.errors()!r}"


@pytest.mark.parametrize("settings", [NodeSettings, SchedulerSettings])
@pytest.mark.usefixtures("production")
def test_the_development_cache_secret_is_refused_in_production(
    settings: type[NodeSettings | SchedulerSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValidationError, match="public development value"):
        settings()
    monkeypatch.setenv("CRESCENT_CACHE_SECRET", DEV_CACHE_SECRET)
    with pytest.raises(ValidationError, match="public development value"):
        settings()
    monkeypatch.setenv("CRESCENT_CACHE_SECRET", SECRET)
    assert settings().cache_secret == SECRET


@pytest.mark.parametrize("settings", [NodeSettings, SchedulerSettings])
@pytest.mark.usefixtures("production")
def test_a_short_cache_secret_is_refused_without_echoing_it(
    settings: type[NodeSettings | SchedulerSettings],
) -> None:
    with pytest.raises(ValidationError, match="too short") as info:
        settings(cache_secret="hunter2")
    assert "hunter2" not in error_text(info)


@pytest.mark.parametrize("settings", [NodeSettings, SchedulerSettings])
def test_development_mode_takes_the_default(
    settings: type[NodeSettings | SchedulerSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRESCENT_DEV_MODE", "true")
    monkeypatch.delenv("CRESCENT_CACHE_SECRET", raising=False)
    assert settings().cache_secret == DEV_CACHE_SECRET
    assert settings(cache_secret="short").cache_secret == "short"


@pytest.mark.parametrize(("raw", "expected"), [("", False), ("false", False), ("1", True)])
def test_dev_mode_parses_like_a_bool(raw: str, expected: bool) -> None:
    assert dev_mode({"CRESCENT_DEV_MODE": raw}) is expected
    assert dev_mode({}) is False
    with pytest.raises(ValueError, match="true or false"):
        dev_mode({"CRESCENT_DEV_MODE": "maybe"})


def test_the_fingerprint_tells_secrets_apart_and_reveals_neither() -> None:
    first = secret_fingerprint(SECRET)
    assert first == secret_fingerprint(SECRET) and len(first) == 16
    assert first != secret_fingerprint(SECRET + "x")
    assert first != secret_fingerprint(DEV_CACHE_SECRET)
    assert SECRET not in first and first not in SECRET.encode().hex()


def test_secret_files_are_read_without_their_newline(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(PASSWORD + "\n")
    assert read_secret_file(path) == PASSWORD
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_secret_file(path)
    with pytest.raises(ValueError, match=r"cannot read the secret file .*missing"):
        read_secret_file(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"^cannot read the token: FileNotFoundError$"):
        read_secret_file(tmp_path / "missing", "the token")


@pytest.mark.usefixtures("production")
def test_nats_credentials_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert NatsAuthSettings().connect_options() == {}
    monkeypatch.setenv("CRESCENT_NATS_USER", "prefill")
    monkeypatch.setenv("CRESCENT_NATS_PASSWORD", PASSWORD)
    settings = NatsAuthSettings()
    assert settings.connect_options() == {
        "user": "prefill",
        "password": PASSWORD,
        "inbox_prefix": "_INBOX.prefill",
    }
    assert PASSWORD not in repr(settings) and PASSWORD not in str(settings.model_dump())
    monkeypatch.delenv("CRESCENT_NATS_PASSWORD")
    path = tmp_path / "nats.password"
    path.write_text(PASSWORD + "\n")
    monkeypatch.setenv("CRESCENT_NATS_PASSWORD_FILE", str(path))
    assert NatsAuthSettings().connect_options()["password"] == PASSWORD


@pytest.mark.usefixtures("production")
def test_an_nkey_seed_file_is_passed_by_path(tmp_path: Path) -> None:
    seed = tmp_path / "node.nk"
    seed.write_text("SUAEXAMPLE\n")
    assert NatsAuthSettings(nats_nkey_seed_file=seed).connect_options() == {"nkeys_seed": str(seed)}
    with pytest.raises(ValidationError, match="does not exist"):
        NatsAuthSettings(nats_nkey_seed_file=tmp_path / "missing.nk")


@pytest.mark.parametrize(
    "given",
    [
        {"nats_user": "prefill"},
        {"nats_password": PASSWORD},
        {"nats_user": "pre fill", "nats_password": PASSWORD},
        {"nats_user": "prefill", "nats_password": PASSWORD, "nats_password_file": "/x"},
        {"nats_user": "prefill", "nats_password": PASSWORD, "nats_nkey_seed_file": "/x"},
    ],
)
@pytest.mark.usefixtures("production")
def test_inconsistent_nats_credentials_are_refused_without_the_password(
    given: dict[str, str],
) -> None:
    with pytest.raises(ValidationError) as info:
        NatsAuthSettings(**given)  # type: ignore[arg-type]
    assert PASSWORD not in error_text(info)


@pytest.mark.usefixtures("production")
def test_a_wrongly_typed_password_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_NATS_USER", "prefill")
    monkeypatch.setenv("CRESCENT_NATS_PASSWORD_FILE", PASSWORD)  # a password, not a path
    with pytest.raises(ValidationError) as info:
        NatsAuthSettings()
    assert PASSWORD not in error_text(info)


@pytest.mark.usefixtures("production")
def test_the_cachemeta_token_comes_from_the_variable_or_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert CacheMetaTokenSettings().cachemeta_token_value() is None
    monkeypatch.setenv("CRESCENT_CACHEMETA_TOKEN", "")
    assert CacheMetaTokenSettings().cachemeta_token_value() is None
    monkeypatch.setenv("CRESCENT_CACHEMETA_TOKEN", SECRET)
    assert CacheMetaTokenSettings().cachemeta_token_value() == SECRET
    path = tmp_path / "token"
    path.write_text(SECRET + "\n")
    monkeypatch.setenv("CRESCENT_CACHEMETA_TOKEN_FILE", str(path))
    with pytest.raises(ValidationError, match="not both") as info:
        CacheMetaTokenSettings()
    assert SECRET not in error_text(info)
    monkeypatch.delenv("CRESCENT_CACHEMETA_TOKEN")
    assert CacheMetaTokenSettings().cachemeta_token_value() == SECRET
    monkeypatch.setenv("CRESCENT_CACHEMETA_TOKEN", "")
    monkeypatch.delenv("CRESCENT_CACHEMETA_TOKEN_FILE")
    monkeypatch.setenv("CRESCENT_CACHEMETA_TOKEN", "short-token")
    with pytest.raises(ValidationError, match="too short") as info:
        CacheMetaTokenSettings()
    assert "short-token" not in error_text(info)


def test_logs_show_request_contents_only_when_asked() -> None:
    prompt = "my medical history is"
    assert prompt not in loggable(prompt, {})
    assert loggable(prompt, {}) == "<21 characters, hidden; CRESCENT_LOG_PROMPTS=true shows them>"
    assert "3 items" in loggable([101, 102, 103], {"CRESCENT_LOG_PROMPTS": "false"})
    assert loggable(prompt, {"CRESCENT_LOG_PROMPTS": "true"}) == repr(prompt)
    assert log_prompts({}) is False


@pytest.mark.parametrize("settings", [NodeSettings, SchedulerSettings])
def test_a_malformed_dev_mode_is_refused_without_the_secret(
    settings: type[NodeSettings | SchedulerSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRESCENT_DEV_MODE", "maybe")
    with pytest.raises(ValidationError, match="CRESCENT_DEV_MODE must be true or false") as info:
        settings(cache_secret=SECRET)
    assert SECRET not in error_text(info)


#: Values that shipped in Crescent's compose and Kubernetes files, and a few written the same way.
SHIPPED = [
    "change-me-in-production",
    "change-me-cachemeta-token",
    "replace-me-cache-secret",
    "trial-gateway-password",
    "trial-s3-secret-key",
    "crescent",
    "Password",
    "please-change-me-before-going-live",
    "my-EXAMPLE-secret-0123456789",
    DEV_CACHE_SECRET,
]


@pytest.mark.parametrize("value", SHIPPED)
def test_known_placeholders_are_recognised(value: str) -> None:
    assert is_placeholder(value)


@pytest.mark.parametrize("value", [SECRET, PASSWORD, new_secret(), "cachemeta-test-token-5c1f0e"])
def test_chosen_secrets_are_not_placeholders(value: str) -> None:
    assert not is_placeholder(value)


@pytest.mark.parametrize("value", [v for v in SHIPPED if len(v) >= 16 and v != DEV_CACHE_SECRET])
@pytest.mark.usefixtures("production")
def test_a_long_placeholder_cache_secret_is_refused_without_echoing_it(value: str) -> None:
    with pytest.raises(ValidationError, match="known placeholder") as info:
        NodeSettings(cache_secret=value)
    assert value not in error_text(info)


@pytest.mark.usefixtures("production")
def test_a_placeholder_cachemeta_token_is_refused_from_a_file_too(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("change-me-cachemeta-token\n")
    with pytest.raises(ValidationError, match="known placeholder"):
        CacheMetaTokenSettings(cachemeta_token_file=token)


def test_development_mode_still_takes_placeholders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_DEV_MODE", "true")
    assert NodeSettings(cache_secret="change-me-in-production").cache_secret
    assert check_password("crescent", "a password", dev=True) == "crescent"


def test_a_database_url_with_a_default_password_is_refused_outside_development() -> None:
    trial = "postgresql+asyncpg://crescent:crescent@postgres:5432/crescent"
    with pytest.raises(ValidationError, match="the password in CRESCENT_DB_URL") as info:
        check_db_url(trial, dev=False)
    assert "crescent@" not in error_text(info)
    encoded = "postgresql+asyncpg://crescent:change%2Dme@db/crescent"
    with pytest.raises(ValidationError, match="known placeholder"):
        check_db_url(encoded, dev=False)
    assert check_db_url(trial, dev=True) == trial
    chosen = f"postgresql+asyncpg://crescent:{new_secret()}@postgres:5432/crescent"
    for url in (chosen, "sqlite+aiosqlite:///var/cache/crescent/cachemeta.db", "postgresql://db/x"):
        assert check_db_url(url, dev=False) == url


def test_a_placeholder_password_is_refused_whatever_its_length() -> None:
    with pytest.raises(ValidationError, match="the S3 secret key is a known placeholder"):
        check_password("trial-s3-secret-key", "the S3 secret key", dev=False)
    assert check_password("short-but-chosen", "the S3 secret key", dev=False)


def test_a_placeholder_nats_password_is_refused_from_a_file_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRESCENT_DEV_MODE", "false")
    path = tmp_path / "nats.password"
    path.write_text("trial-decode-password\n")
    for given in ({"nats_password": "change-me-nats-password"}, {"nats_password_file": path}):
        with pytest.raises(ValidationError) as caught:
            NatsAuthSettings(nats_user="decode-0", **given)
        assert "placeholder" in str(caught.value) and "trial-decode" not in str(caught.value)


def test_services_refuse_default_database_and_s3_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.cachemeta.config import CacheMetaSettings
    from services.tierd.config import TierdSettings

    monkeypatch.setenv("CRESCENT_DEV_MODE", "false")
    with pytest.raises(ValidationError, match="placeholder") as caught:
        CacheMetaSettings(
            dev_mode=False,
            cachemeta_token=new_secret(),  # type: ignore[arg-type]
            db_url="postgresql+asyncpg://crescent:crescent@db:5432/crescent",
        )
    assert "crescent@" not in str(caught.value)
    with pytest.raises(ValidationError, match="placeholder") as refused:
        TierdSettings(
            cache_secret=SECRET,
            s3_endpoint="https://s3.example.net",
            s3_access_key="AKIAREALKEY0123",  # type: ignore[arg-type]
            s3_secret_key="change-me-s3-secret-key",  # type: ignore[arg-type]
        )
    assert "change-me" not in str(refused.value)
