"""Across services, a request's log lines carry its id: the bus binds the request id of each
message it delivers (a request, a task or hand-off carrying one, a token chunk) while its
handler runs, and the JSON format writes it. A real NATS server, two bus clients."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from pathlib import Path

from shared import subjects
from shared.bus import NatsBus
from shared.cluster_messages import PrefillTask
from shared.logs import JsonFormatter
from shared.messages import GenerateRequest, SamplingSpec, TokenChunk
from tests.support.nats import nats_url


def test_a_handlers_log_lines_carry_the_delivered_requests_id(tmp_path: Path) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter("node"))
    log = logging.getLogger("tests.bus_logs")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    request = GenerateRequest(
        request_id="chatcmpl-7-0", tenant="t", prompt_token_ids=[1],
        sampling=SamplingSpec(max_tokens=1),
    )  # fmt: skip

    async def scenario(url: str) -> None:
        sender = await NatsBus.connect(url, "crescent-test-sender")
        receiver = await NatsBus.connect(url, "crescent-test-receiver")
        # Each subscription has its own handler task: the chunk is published after the task
        # has been handled, so the lines come in a known order.
        took, done = asyncio.Event(), asyncio.Event()

        async def on_task(task: PrefillTask) -> None:
            log.info("took a task")
            took.set()

        async def on_chunk(chunk: TokenChunk) -> None:
            log.info("got a chunk")
            done.set()

        await receiver.subscribe(subjects.prefill_tasks("p0"), PrefillTask, on_task)
        await receiver.subscribe(subjects.tokens("chatcmpl-7-0"), TokenChunk, on_chunk)
        await receiver.flush()
        await sender.publish(
            subjects.prefill_tasks("p0"), PrefillTask(request=request, decode_nodes=["d0"])
        )
        await sender.flush()  # the server has the task before the wait starts counting
        await asyncio.wait_for(took.wait(), 10)
        chunk = TokenChunk(request_id="chatcmpl-7-0", index=0, token_ids=[3])
        await sender.publish(subjects.tokens("chatcmpl-7-0"), chunk)
        await sender.flush()
        await asyncio.wait_for(done.wait(), 10)
        log.info("outside any request")
        await sender.close()
        await receiver.close()

    try:
        with nats_url(tmp_path) as url:
            asyncio.run(scenario(url))
    finally:
        log.removeHandler(handler)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["message"], e.get("request_id")) for e in lines] == [
        ("took a task", "chatcmpl-7-0"),
        ("got a chunk", "chatcmpl-7-0"),
        ("outside any request", None),
    ]
