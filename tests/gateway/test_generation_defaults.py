"""The model's sampling defaults (generation_config.json, a GGUF's general.sampling.*) and
how requests get them: a request's own values win, then the model's, then Crescent's."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from services.gateway.config import GatewaySettings
from services.gateway.requests import COMPLETIONS_DEFAULT_MAX_TOKENS, RequestBuilder
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest
from shared.model.generation_config import (
    GENERATION_CONFIG,
    SamplingDefaults,
    from_gguf,
    sampling_defaults,
)
from shared.model.gguf_meta import GgufMeta
from shared.model.tokenizer import Tokenizer

MODEL = "test-model"
MAX_LEN = 64
LLAMA3 = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "bos_token_id": 1}


def folder_with(tmp_path: Path, config: dict[str, Any] | None) -> Path:
    if config is not None:
        (tmp_path / GENERATION_CONFIG).write_text(json.dumps(config))
    return tmp_path


def test_auto_reads_the_sampling_keys_of_generation_config(tmp_path: Path) -> None:
    config = LLAMA3 | {"top_k": 20, "repetition_penalty": 1.1, "max_new_tokens": 32}
    defaults = sampling_defaults(folder_with(tmp_path, config))
    assert defaults.values() == {
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 20,
        "repetition_penalty": 1.1,
        "max_tokens": 32,
    }
    assert "generation_config.json" in defaults.describe()


def test_none_and_a_folder_without_one_keep_crescents(tmp_path: Path) -> None:
    assert sampling_defaults(folder_with(tmp_path, LLAMA3), "none").values() == {}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sampling_defaults(empty).values() == {}
    assert "sets none" in sampling_defaults(empty).describe()


def test_overrides_win_over_the_models(tmp_path: Path) -> None:
    defaults = sampling_defaults(folder_with(tmp_path, LLAMA3), "auto", {"temperature": 0})
    assert defaults.values() == {"temperature": 0, "top_p": 0.9}
    alone = sampling_defaults(tmp_path, "none", {"max_new_tokens": 8})
    assert alone.values() == {"max_tokens": 8}


def test_what_crescent_cannot_apply_is_skipped_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = {"temperature": 7.0, "min_p": 0.05, "top_p": 0.8, "max_new_tokens": None}
    with caplog.at_level(logging.WARNING):
        defaults = sampling_defaults(folder_with(tmp_path, config))
    assert defaults.values() == {"top_p": 0.8}
    assert "temperature=7.0" in caplog.text and "min_p=0.05" in caplog.text


def test_a_bad_override_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ('{"temperature": 9}', '{"do_sample": 1}', '{"max_new_tokens": 0}'):
        monkeypatch.setenv("CRESCENT_OVERRIDE_GENERATION_CONFIG", bad)
        with pytest.raises(ValidationError, match="OVERRIDE_GENERATION_CONFIG"):
            GatewaySettings()
    monkeypatch.setenv("CRESCENT_OVERRIDE_GENERATION_CONFIG", '{"temperature": 0}')
    monkeypatch.setenv("CRESCENT_GENERATION_CONFIG", "none")
    settings = GatewaySettings()
    assert settings.override_generation_config == {"temperature": 0}
    assert settings.generation_config == "none"


def test_gguf_sampling_metadata_becomes_generation_config(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "sampling.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_float32("general.sampling.temp", 0.7)
    writer.add_float32("general.sampling.top_p", 0.8)
    writer.add_int32("general.sampling.top_k", 40)
    writer.add_float32("general.sampling.min_p", 0.05)
    writer.add_float32("general.sampling.penalty_repeat", 1.05)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    meta = GgufMeta(gguf.GGUFReader(path), path)
    config = from_gguf(meta)
    assert config == {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 40,
        "min_p": 0.05,
        "repetition_penalty": 1.05,
    }


@pytest.fixture
def builder(tokenizer: Tokenizer) -> RequestBuilder:
    defaults = SamplingDefaults(temperature=0.6, top_p=0.9, top_k=20, max_tokens=8, source="t")
    return RequestBuilder(tokenizer, MODEL, MAX_LEN, max_n=2, defaults=defaults)


def chat_sampling(builder: RequestBuilder, **fields: Any) -> Any:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]} | fields
    prepared = builder.chat(ChatCompletionRequest.model_validate(body), "tenant")
    return prepared.choices[0].request.sampling


def test_a_request_without_sampling_fields_gets_the_models(builder: RequestBuilder) -> None:
    s = chat_sampling(builder)
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens) == (0.6, 0.9, 20, 8)
    assert s.repetition_penalty == 1.0  # the model's config left it out: Crescent's


def test_a_requests_own_values_win(builder: RequestBuilder) -> None:
    s = chat_sampling(builder, temperature=0, top_p=1, top_k=0, max_tokens=20)
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens) == (0, 1, 0, 20)
    assert chat_sampling(builder, max_completion_tokens=3).max_tokens == 3


def test_the_default_max_tokens_fits_the_room_left(tokenizer: Tokenizer) -> None:
    roomy = RequestBuilder(
        tokenizer, MODEL, MAX_LEN, 1, defaults=SamplingDefaults(max_tokens=10**6)
    )
    prompt = len(tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}]))
    assert chat_sampling(roomy).max_tokens == MAX_LEN - prompt


def test_completions_take_the_models_max_tokens_instead_of_16(
    builder: RequestBuilder, tokenizer: Tokenizer
) -> None:
    body = CompletionRequest.model_validate({"model": MODEL, "prompt": "Hello"})
    sampling = builder.completion(body, "tenant").choices[0].request.sampling
    assert sampling.max_tokens == 8 and sampling.temperature == 0.6
    plain = RequestBuilder(tokenizer, MODEL, MAX_LEN, max_n=1)
    sampling = plain.completion(body, "tenant").choices[0].request.sampling
    assert sampling.max_tokens == COMPLETIONS_DEFAULT_MAX_TOKENS and sampling.temperature == 1.0
