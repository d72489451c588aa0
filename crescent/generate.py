"""``crescent generate``: one prompt through the local engine, text streamed to stdout."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from shared.errors import CrescentError, InvalidRequestError
from shared.sampling_params import SamplingParams

DEFAULT_MAX_TOKENS = 256


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a .gguf file or a Hugging Face folder (default: SmolLM2-135M)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="raw text, tokenized as the tokenizer does by default")
    source.add_argument("--messages", type=Path, help="a JSON file with OpenAI-style messages")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (the default) is greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)


def run(args: argparse.Namespace) -> int:
    try:
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
        )
        messages = _read_messages(args.messages) if args.messages else None
        _generate(args.model, args.prompt, messages, params)
    except CrescentError as exc:
        sys.stderr.write(f"crescent generate: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _read_messages(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidRequestError(f"messages file {path} does not exist", "messages") from None
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"cannot read messages from {path}: {exc}", "messages") from None
    if not isinstance(data, list) or not data:
        raise InvalidRequestError(f"{path} must hold a non-empty JSON list of messages", "messages")
    return data


def _generate(
    model: str | None,
    prompt: str | None,
    messages: list[dict[str, Any]] | None,
    params: SamplingParams,
) -> None:
    # Heavy imports wait until the arguments are known to be valid.
    from shared.config import EngineSettings
    from shared.engine.factory import load_engine
    from shared.model.tokenizer import IncrementalDetokenizer

    # An explicit --model wins over CRESCENT_MODEL; otherwise the environment decides.
    settings = EngineSettings(model=model) if model else EngineSettings()
    loaded = load_engine(settings)
    tok = loaded.tokenizer
    ids = tok.apply_chat_template(messages) if messages is not None else tok.encode(prompt or "")
    engine = loaded.engine
    engine.add_request(uuid.uuid4().hex, ids, params)
    detok = IncrementalDetokenizer(tok)
    out = sys.stdout
    while engine.has_unfinished_requests():
        for step in engine.step():
            out.write(detok.push(step.new_token_ids))
            out.flush()
    out.write(detok.flush())
    if out.isatty():
        out.write("\n")
    out.flush()
