"""Settings from the environment, API keys -> tenants, and OpenAI-shaped error bodies."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.gateway import errors
from services.gateway.auth import ApiKeys, key_digest, key_line, parse_api_keys, parse_key_file
from services.gateway.config import GatewaySettings
from services.gateway.errors import ApiError
from services.gateway.sampling import TenantTerms
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest


def test_settings_come_from_crescent_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_PORT", "9001")
    monkeypatch.setenv("CRESCENT_NATS_URL", "nats://10.0.0.1:4222")
    monkeypatch.setenv("CRESCENT_API_KEYS", "k1:a, k2:b")
    monkeypatch.setenv("CRESCENT_SERVED_MODEL_NAME", "smol")
    settings = GatewaySettings()
    assert (settings.host, settings.port) == ("127.0.0.1", 9001)
    assert settings.nats_url == "nats://10.0.0.1:4222"
    assert settings.tenants_by_digest == {key_digest("k1"): "a", key_digest("k2"): "b"}
    assert settings.served_model_name == "smol"
    assert settings.max_request_bytes == 4 * 1024 * 1024


def test_tenant_objectives_are_read_and_a_malformed_list_stops_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRESCENT_API_KEYS", "k1:a")
    monkeypatch.setenv("CRESCENT_TENANT_TTFT_SLO_MS", "a=500, b=2000")
    assert GatewaySettings().tenant_ttft_slos_ms == {"a": 500, "b": 2000}
    monkeypatch.setenv("CRESCENT_TENANT_TBT_SLO_MS", "a=80")
    monkeypatch.setenv("CRESCENT_TENANT_WEIGHTS", "b=4")
    assert GatewaySettings().tenant_terms == {
        "a": TenantTerms(500, 80, 1.0),
        "b": TenantTerms(2000, None, 4.0),
    }
    for variable, value in (
        ("CRESCENT_TENANT_TTFT_SLO_MS", "a=fast"),
        ("CRESCENT_TENANT_TBT_SLO_MS", "a=0"),
        ("CRESCENT_TENANT_TTFT_SLO_MS", "a=0"),  # with a's TBT objective set beside it
        ("CRESCENT_TENANT_WEIGHTS", "b=0"),
        ("CRESCENT_TENANT_WEIGHTS", "b=1001"),
    ):
        with monkeypatch.context() as m:
            m.setenv(variable, value)
            with pytest.raises(ValidationError, match=variable):
                GatewaySettings()


SECRET_KEY = "sk-live-4f9c2a7d1e"


def every_text(info: pytest.ExceptionInfo[ValidationError]) -> str:
    error = info.value
    return f"{error}\n{error!r}\n{error.json()}\n{error.errors()!r}"


@pytest.mark.parametrize(
    "raw",
    [
        SECRET_KEY,
        f"{SECRET_KEY}:",
        f":{SECRET_KEY}",
        f"{SECRET_KEY}:a,{SECRET_KEY}:b",
        f"{SECRET_KEY}:two words",
        f"ok:fine,{SECRET_KEY}",
    ],
)
def test_malformed_api_keys_are_refused_without_showing_a_key(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError) as plain:
        parse_api_keys(raw)
    assert SECRET_KEY not in str(plain.value)
    with pytest.raises(ValidationError) as info:
        GatewaySettings.model_validate({"api_keys": raw})
    assert SECRET_KEY not in every_text(info)
    monkeypatch.setenv("CRESCENT_API_KEYS", raw)
    with pytest.raises(ValidationError) as info:
        GatewaySettings()
    assert SECRET_KEY not in every_text(info)


def test_plain_keys_are_hashed_at_load_and_never_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_API_KEYS", f"{SECRET_KEY}:alpha")
    settings = GatewaySettings()
    assert SECRET_KEY not in repr(settings) and SECRET_KEY not in str(settings.model_dump())
    assert settings.tenants_by_digest == {key_digest(SECRET_KEY): "alpha"}
    assert ApiKeys(settings.tenants_by_digest).tenant(f"Bearer {SECRET_KEY}") == "alpha"


def test_a_key_file_lists_digests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keys"
    path.write_text(
        f"# production keys\n\n{key_line(SECRET_KEY, 'alpha')}\n  {key_line('sk-b', 'beta')}  \n"
    )
    monkeypatch.setenv("CRESCENT_API_KEYS_FILE", str(path))
    monkeypatch.setenv("CRESCENT_API_KEYS", "sk-c:gamma")
    keys = ApiKeys(GatewaySettings().tenants_by_digest)
    assert keys.tenant(f"Bearer {SECRET_KEY}") == "alpha"
    assert keys.tenant("Bearer sk-b") == "beta" and keys.tenant("Bearer sk-c") == "gamma"
    monkeypatch.setenv("CRESCENT_API_KEYS", "sk-b:beta")
    with pytest.raises(ValidationError, match="in both"):
        GatewaySettings()


@pytest.mark.parametrize(
    "line",
    [
        SECRET_KEY,
        f"{SECRET_KEY} alpha",
        f"sha256:{SECRET_KEY} alpha",
        "sha256:" + "zz" * 32 + " alpha",
        key_line(SECRET_KEY, "alpha").split()[0],
        key_line(SECRET_KEY, "alpha") + " extra",
    ],
)
def test_a_bad_key_file_line_is_named_by_number_only(
    line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# ok\n{line}\n")
    with pytest.raises(ValueError, match="line 2 of the API key file") as plain:
        parse_key_file(path.read_text())
    assert SECRET_KEY not in str(plain.value)
    monkeypatch.setenv("CRESCENT_API_KEYS_FILE", str(path))
    with pytest.raises(ValidationError, match="line 2 of CRESCENT_API_KEYS_FILE") as info:
        GatewaySettings()
    assert SECRET_KEY not in every_text(info)


def test_an_unreadable_key_file_is_named_by_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_API_KEYS_FILE", SECRET_KEY)  # a key where a path belongs
    with pytest.raises(ValidationError, match="cannot read CRESCENT_API_KEYS_FILE") as info:
        GatewaySettings()
    assert SECRET_KEY not in every_text(info)


def test_a_listed_key_twice_in_the_file_is_refused() -> None:
    line = key_line(SECRET_KEY, "alpha")
    with pytest.raises(ValueError, match="line 2 of the API key file: this API key is listed"):
        parse_key_file(f"{line}\n{line}\n")


def test_open_mode_is_tenant_default() -> None:
    keys = ApiKeys({})
    assert keys.open and keys.tenant(None) == "default"
    assert GatewaySettings.model_validate({"api_keys": ""}).tenants_by_digest == {}


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic sk-a", "Bearer sk-c", "sk-a"])
def test_missing_or_wrong_keys_are_401(header: str | None) -> None:
    with pytest.raises(ApiError) as info:
        ApiKeys.from_keys({"sk-a": "alpha"}).tenant(header)
    assert info.value.status == 401 and info.value.code == "invalid_api_key"


def test_a_listed_key_names_its_tenant() -> None:
    keys = ApiKeys.from_keys({"sk-a": "alpha", "sk-b": "beta"})
    assert keys.tenant("Bearer sk-b") == "beta"
    assert keys.tenant("bearer  sk-a ") == "alpha"


def test_error_body_has_openai_keys() -> None:
    body = errors.rate_limited("slow down", 2.1)
    assert body.body() == {
        "error": {
            "message": "slow down",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    assert body.headers == {"Retry-After": "3"}
    assert errors.from_backend(503, None, None).status == 503
    assert errors.from_backend(None, "boom", None).status == 500


def validation_error(
    model: type[ChatCompletionRequest | CompletionRequest], data: object
) -> ApiError:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return errors.from_validation(list(info.value.errors()))


def test_validation_errors_become_400_naming_the_field() -> None:
    extra = validation_error(CompletionRequest, {"model": "m", "prompt": "x", "bogus": 1})
    assert extra.status == 400 and extra.param == "bogus"
    assert extra.message == "Unrecognized request argument supplied: bogus"
    missing = validation_error(ChatCompletionRequest, {"model": "m"})
    assert missing.param == "messages" and "required" in missing.message
    wrong = validation_error(CompletionRequest, {"model": "m", "prompt": "x", "n": "many"})
    assert wrong.param == "n"
    union = validation_error(CompletionRequest, {"model": "m", "prompt": [1.5]})
    assert union.param == "prompt"
    nested = validation_error(
        ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": 5}]}
    )
    assert nested.param == "messages[0].content"
    not_object = validation_error(ChatCompletionRequest, [1, 2])
    assert not_object.param is None and "JSON object" in not_object.message
