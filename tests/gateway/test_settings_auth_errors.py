"""Settings from the environment, API keys -> tenants, and OpenAI-shaped error bodies."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.gateway import errors
from services.gateway.auth import ApiKeys
from services.gateway.config import GatewaySettings, parse_api_keys
from services.gateway.errors import ApiError
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest


def test_settings_come_from_crescent_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_PORT", "9001")
    monkeypatch.setenv("CRESCENT_NATS_URL", "nats://10.0.0.1:4222")
    monkeypatch.setenv("CRESCENT_API_KEYS", "k1:a, k2:b")
    monkeypatch.setenv("CRESCENT_SERVED_MODEL_NAME", "smol")
    settings = GatewaySettings()
    assert (settings.host, settings.port) == ("127.0.0.1", 9001)
    assert settings.nats_url == "nats://10.0.0.1:4222"
    assert settings.tenants_by_key == {"k1": "a", "k2": "b"}
    assert settings.served_model_name == "smol"
    assert settings.max_request_bytes == 4 * 1024 * 1024


@pytest.mark.parametrize("raw", ["nokey", "k:", ":t", "k:a,k:b"])
def test_malformed_api_keys_are_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_api_keys(raw)
    with pytest.raises(ValidationError):
        GatewaySettings(api_keys=raw)


def test_open_mode_is_tenant_default() -> None:
    keys = ApiKeys({})
    assert keys.open and keys.tenant(None) == "default"


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic sk-a", "Bearer sk-c", "sk-a"])
def test_missing_or_wrong_keys_are_401(header: str | None) -> None:
    with pytest.raises(ApiError) as info:
        ApiKeys({"sk-a": "alpha"}).tenant(header)
    assert info.value.status == 401 and info.value.code == "invalid_api_key"


def test_a_listed_key_names_its_tenant() -> None:
    keys = ApiKeys({"sk-a": "alpha", "sk-b": "beta"})
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
