"""shared.tracing: off (no OTEL_EXPORTER_OTLP_ENDPOINT) it imports nothing and stamps nothing;
on, a request's context rides on its wire messages and each service's spans join one trace."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared import phases, tracing
from shared.cluster_messages import KVHandoff, PrefillTask
from shared.logs import REQUEST_ID
from shared.messages import GenerateRequest, SamplingSpec, TokenChunk
from shared.node.spans import trace_chunk


def request(request_id: str = "chatcmpl-1-0") -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id, tenant="t", prompt_token_ids=[1, 2, 3],
        sampling=SamplingSpec(max_tokens=4),
    )  # fmt: skip


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.install(provider)
    yield spans
    tracing.uninstall()


def test_off_it_costs_nothing() -> None:
    code = """
import os, sys
os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
from shared import tracing
from shared.messages import GenerateRequest, SamplingSpec
from shared.tracing_settings import TracingSettings
assert tracing.configure("test", TracingSettings().endpoint) is False
r = GenerateRequest(request_id="r", tenant="t", prompt_token_ids=[1],
                    sampling=SamplingSpec(max_tokens=1))
tracing.stamp(r)
with tracing.delivery(r, "crescent.requests"), tracing.span("x"):
    pass
assert r.traceparent == "" and tracing.record("y", "00-ab-cd-01", 1.0) == ""
assert not any(m.startswith("opentelemetry") for m in sys.modules), "imported"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_request_carries_its_context_from_service_to_service(
    exporter: InMemorySpanExporter,
) -> None:
    sent = request()
    with tracing.span("POST /v1/chat/completions"):
        tracing.stamp(sent)  # the gateway submits
    assert sent.traceparent.startswith("00-")
    with tracing.delivery(sent, "crescent.requests"):  # the scheduler
        assert REQUEST_ID.get() == "chatcmpl-1-0"
        task = PrefillTask(request=sent, decode_nodes=["d0"])
        tracing.stamp(task)
    with tracing.delivery(task, "crescent.prefill.p0"):  # the prefill node
        pass
    chunk = TokenChunk(request_id=sent.request_id, index=0, token_ids=[5])
    chunk.phases = {phases.PREFIX_FETCH: 0.01, phases.PREFILL_QUEUE: 0.02,
                    phases.PREFILL_COMPUTE: 0.05}  # fmt: skip
    trace_chunk(chunk, None)
    handoff = KVHandoff(
        request=sent, first_token=5, prefill_node="p0", transfer_kind="tcp",
        transfer_address=b"x", lease_id="l", block_ids=[], block_checksums=[],
    )  # fmt: skip
    tracing.stamp(handoff)  # sent outside any span: under the prefill span
    with tracing.delivery(handoff, "crescent.decode.d0"):
        pass
    assert REQUEST_ID.get() is None

    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert len({s.context.trace_id for s in spans.values()}) == 1

    def parent(name: str) -> str:
        ctx = spans[name].parent
        assert ctx is not None, name
        return next(n for n, s in spans.items() if s.context.span_id == ctx.span_id)

    assert parent("GenerateRequest requests") == "POST /v1/chat/completions"
    assert parent("PrefillTask prefill") == "GenerateRequest requests"
    assert parent("prefill") == "PrefillTask prefill"
    assert {parent(p) for p in ("prefix_fetch", "prefill_queue", "prefill_compute")} == {"prefill"}
    assert parent("KVHandoff decode") == "prefill"
    fetch, compute = spans["prefix_fetch"], spans["prefill_compute"]
    assert fetch.end_time <= compute.start_time  # back to back, in order
    assert compute.end_time - spans["prefill"].start_time == pytest.approx(0.08e9, rel=0.01)
