"""JSON log lines: one object per record, with the request id of the task that logged it."""

from __future__ import annotations

import asyncio
import json
import logging

from shared.logs import (
    JsonFormatter,
    LogSettings,
    bind_request,
    name_request,
    request_scope,
    tagged,
)


def record(message: str, exc: BaseException | None = None) -> logging.LogRecord:
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("services.x", logging.WARNING, __file__, 1, message, (), info)


def test_a_record_is_one_json_object_with_the_request_id_in_scope() -> None:
    formatter = JsonFormatter("decode", lambda: ("ab" * 16, "cd" * 8))
    with request_scope("chatcmpl-1-0"):
        line = formatter.format(record("pulled 3 blocks"))
    entry = json.loads(line)
    assert entry["service"] == "decode" and entry["level"] == "WARNING"
    assert entry["message"] == "pulled 3 blocks" and entry["logger"] == "services.x"
    assert entry["request_id"] == "chatcmpl-1-0"
    assert (entry["trace_id"], entry["span_id"]) == ("ab" * 16, "cd" * 8)
    assert entry["ts"].endswith("Z") and "\n" not in line
    assert "request_id" not in json.loads(JsonFormatter("decode").format(record("idle")))


def test_a_bound_request_reaches_the_tasks_it_starts_and_no_other() -> None:
    formatter = JsonFormatter("gateway")

    async def scenario() -> list[dict[str, str]]:
        async def child() -> dict[str, str]:
            return dict(json.loads(formatter.format(record("child"))))

        async def handle(request_id: str) -> dict[str, str]:
            bind_request(request_id)
            return await asyncio.create_task(child())

        return list(await asyncio.gather(handle("a"), handle("b")))

    assert [e["request_id"] for e in asyncio.run(scenario())] == ["a", "b"]
    try:
        raise ValueError("boom")
    except ValueError as exc:
        assert "ValueError: boom" in json.loads(formatter.format(record("x", exc)))["exc"]


def test_the_format_is_a_setting() -> None:
    assert LogSettings().log_format == "text"
    assert LogSettings(log_format="json").log_format == "json"


def test_a_tagged_request_named_in_a_task_it_started_shows_in_all_its_lines() -> None:
    formatter = JsonFormatter("gateway")

    async def route() -> list[str | None]:
        with tagged():
            before = json.loads(formatter.format(record("parsing"))).get("request_id")

            async def submit() -> None:
                name_request("chatcmpl-9-0")  # as the bus does when it sends the request
                name_request("chatcmpl-9-1")  # the first name stays

            await asyncio.create_task(submit())
            after = json.loads(formatter.format(record("streaming"))).get("request_id")
        outside = json.loads(formatter.format(record("idle"))).get("request_id")
        return [before, after, outside]

    assert asyncio.run(route()) == [None, "chatcmpl-9-0", None]
