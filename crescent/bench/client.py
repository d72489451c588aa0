"""One streamed completion, timed: the HTTP side of the bench.

A request is ``POST /v1/completions`` with the prompt as token ids, ``stream: true`` and
usage in the last chunk. Its clock starts just before the request is sent; the first token
is the first chunk whose text is not empty, and every later such chunk closes one
inter-token gap. Nothing here raises for a server's failure: a refused or broken request
comes back as a record with ``ok`` false, its HTTP status and the server's message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from crescent.bench.records import RequestRecord
from crescent.bench.workload import BenchRequest

ERROR_CHARS = 300  # of a server's error message kept in the record


def request_body(
    request: BenchRequest,
    model: str,
    ignore_eos: bool,
    cache_salt: str | None,
    slos_ms: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The request's JSON; ``slos_ms`` (TTFT, time between tokens) as the extension fields
    ``ttft_slo_ms`` and ``tbt_slo_ms`` when given."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(request.prompt),
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    if slos_ms is not None:
        body["ttft_slo_ms"], body["tbt_slo_ms"] = slos_ms
    return body


async def stream_completion(
    http: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    record: RequestRecord,
    headers: Mapping[str, str] | None = None,
    on_text: Callable[[str], None] | None = None,
) -> RequestRecord:
    """Sends ``body`` to ``url`` and fills ``record`` in from the stream; ``on_text`` gets
    each piece of text as it comes."""
    start = time.perf_counter()
    chunks = 0
    last: float | None = None
    try:
        async with http.stream("POST", url, json=body, headers=headers) as resp:
            record.status = resp.status_code
            if resp.status_code != 200:
                record.error = _error_text((await resp.aread()).decode(errors="replace"))
                return record
            async for line in resp.aiter_lines():
                event = _event(line)
                if event is None:
                    continue
                if event is _DONE:
                    break
                if "error" in event:
                    record.error = _error_text(json.dumps(event["error"]))
                    return record
                now = time.perf_counter()
                record.response_id = record.response_id or event.get("id")
                text = _text(event)
                if text:
                    if on_text is not None:
                        on_text(text)
                    chunks += 1
                    if last is None:
                        record.ttft_s = now - start
                    else:
                        record.itl_s.append(now - last)
                    last = now
                _take_usage(event, record)
    except (httpx.HTTPError, ValueError) as exc:
        record.error = _error_text(f"{type(exc).__name__}: {exc}")
        return record
    record.e2e_s = time.perf_counter() - start
    if record.ttft_s is None:
        record.error = "the stream carried no text"
        return record
    record.output_tokens = record.output_tokens or chunks
    record.ok = True
    return record


_DONE: dict[str, Any] = {}


def _event(line: str) -> dict[str, Any] | None:
    """The JSON object of one ``data:`` line, ``_DONE`` for the end, None for anything else
    (comments, ``event:`` lines, blank separators)."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return _DONE
    event = json.loads(payload)
    if not isinstance(event, dict):
        raise ValueError(f"a stream event is not an object: {payload[:80]}")
    return event


def _text(event: Mapping[str, Any]) -> str:
    for choice in event.get("choices") or ():
        # Completions carry ``text``; chat chunks (a server that answers in their shape) a delta.
        text = choice.get("text") or (choice.get("delta") or {}).get("content")
        if text:
            return str(text)
    return ""


def _take_usage(event: Mapping[str, Any], record: RequestRecord) -> None:
    usage = event.get("usage")
    if isinstance(usage, dict):
        if usage.get("completion_tokens") is not None:
            record.output_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            record.prompt_tokens = int(usage["prompt_tokens"])
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            record.cached_tokens = int(details["cached_tokens"])
        by_tier = details.get("cached_tokens_by_tier")
        if isinstance(by_tier, dict):
            record.cached_by_tier = {str(k): int(v) for k, v in by_tier.items()}
    timings = event.get("timings")
    # llama-server reports the prompt tokens it reused as ``timings.cache_n``.
    if isinstance(timings, dict) and record.cached_tokens is None and "cache_n" in timings:
        record.cached_tokens = int(timings["cache_n"])


def _error_text(text: str) -> str:
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        inner = parsed.get("error", parsed)
        message = inner.get("message") if isinstance(inner, dict) else inner
        text = str(message if message is not None else parsed)
    return text.strip()[:ERROR_CHARS]
