"""One request's spans through real prefill and decode services (tiny engines, TCP block
servers, in-memory bus), collected in this process: one trace, every phase under the span
that handed the request on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared import tracing
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts
from tests.node.cluster import Cluster, request
from tests.node.test_handoffs import finished


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.install(provider)
    yield spans
    tracing.uninstall()


def test_a_handed_off_requests_trace_is_whole(
    make_engine: EngineFactory, exporter: InMemorySpanExporter
) -> None:
    prompt = prompts(1, 40, 40, seed=70)[0]

    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start()
        try:
            with tracing.span("scheduler"):  # stands in for the scheduler's span
                _, stream = await cluster.submit(request("traced-0", prompt))
            await stream.wait(finished)
            await cluster.bus.settle()
        finally:
            await cluster.stop()

    asyncio.run(scenario())
    spans = list(exporter.get_finished_spans())
    assert len({s.context.trace_id for s in spans}) == 1
    by_id: dict[int, ReadableSpan] = {s.context.span_id: s for s in spans}

    def chain(name: str) -> list[str]:
        span, names = next(s for s in spans if s.name == name), []
        while span.parent is not None:
            span = by_id[span.parent.span_id]
            names.append(span.name)
        return names

    assert chain("decode") == ["KVHandoff decode", "prefill", "PrefillTask prefill", "scheduler"]
    assert chain("prefill_compute") == ["prefill", "PrefillTask prefill", "scheduler"]
    assert chain("first_decode_step") == ["kv_transfer", "KVHandoff decode", "prefill",
                                          "PrefillTask prefill", "scheduler"]  # fmt: skip
    names = {s.name for s in spans}
    assert {"prefix_fetch", "prefill_queue", "kv_handoff"} <= names
    decode = next(s for s in spans if s.name == "decode")
    assert decode.attributes is not None and decode.attributes["crescent.tokens"] >= 1
