"""/tokenize and /detokenize: the served tokenizer and chat rendering, as vLLM shapes them."""

from __future__ import annotations

import httpx

from shared.model.tokenizer import Tokenizer

HELLO = [{"role": "user", "content": "Hello there"}]


def test_a_prompt_tokenizes_as_the_model_reads_it(
    http: httpx.Client, model_name: str, tokenizer: Tokenizer
) -> None:
    body = {"model": model_name, "prompt": "The capital of France", "return_token_strs": True}
    got = http.post("/tokenize", json=body).json()
    ids = tokenizer.encode("The capital of France")
    assert got["tokens"] == ids and got["count"] == len(ids)
    assert got["max_model_len"] == 8192
    assert got["token_strs"] == [tokenizer.id_to_token(t) for t in ids]


def test_messages_tokenize_as_a_chat_request_renders_them(
    http: httpx.Client, tokenizer: Tokenizer
) -> None:
    got = http.post("/tokenize", json={"messages": HELLO}).json()
    assert got["tokens"] == tokenizer.apply_chat_template(HELLO)
    bare = http.post("/tokenize", json={"messages": HELLO, "add_generation_prompt": False})
    assert bare.json()["tokens"] == tokenizer.apply_chat_template(HELLO, False)
    assert "token_strs" not in got


def test_detokenize_inverts_tokenize(http: httpx.Client, model_name: str) -> None:
    text = "Crescent says héllo wörld 🌙"
    ids = http.post("/tokenize", json={"prompt": text}).json()["tokens"]
    back = http.post("/detokenize", json={"model": model_name, "tokens": ids})
    assert back.status_code == 200 and back.json() == {"prompt": text}


def test_bad_inputs_are_openai_errors(http: httpx.Client) -> None:
    cases = [
        ("/detokenize", {"tokens": [10**7]}, 400, "tokens"),
        ("/detokenize", {"tokens": ["a"]}, 400, "tokens[0]"),
        ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/tokenize", {"prompt": "x", "messages": HELLO}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
    ]
    for path, body, status, param in cases:
        response = http.post(path, json=body)
        assert response.status_code == status, (path, body, response.text)
        assert response.json()["error"]["param"] == param
