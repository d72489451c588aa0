"""One request's trace, whole: the session's stack exports its spans over OTLP to a receiver
in this process, and a disaggregated request's spans form one tree across the gateway, the
scheduler, the prefill node and the decode node, with a span per phase."""

from __future__ import annotations

import time

import pytest

from tests.e2e.disaggregated import Disaggregated
from tests.support.otlp import OtlpReceiver, Span

pytestmark = pytest.mark.slow

#: The spans a disaggregated request leaves, by service.
EXPECTED = {
    "crescent-gateway": {"POST /v1/chat/completions"},
    "crescent-scheduler": {"GenerateRequest requests", "placement"},
    "crescent-prefill": {"PrefillTask prefill", "prefill", "prefix_fetch", "prefill_queue",
                         "prefill_compute"},
    "crescent-decode": {"KVHandoff decode", "kv_transfer", "kv_handoff", "first_decode_step",
                        "decode"},
}  # fmt: skip


def trace_of(receiver: OtlpReceiver, response_id: str, timeout_s: float = 20) -> list[Span]:
    """The spans of the trace whose scheduler span names the request, once every service's
    spans of it have arrived."""
    deadline = time.monotonic() + timeout_s
    while True:
        with receiver.lock:
            ours = [
                s for s in receiver.spans
                if str(s.attributes.get("crescent.request_id", "")).startswith(response_id)
            ]  # fmt: skip
        spans = receiver.trace(ours[0].trace_id) if ours else []
        names = {(s.service, s.name) for s in spans}
        if all((svc, n) in names for svc, want in EXPECTED.items() for n in want):
            return spans
        if time.monotonic() > deadline:
            return spans
        time.sleep(0.2)  # poll interval until the deadline


def test_a_disaggregated_requests_trace_is_whole(
    disaggregated: Disaggregated, otlp_receiver: OtlpReceiver
) -> None:
    response_id = disaggregated.response_id
    spans = trace_of(otlp_receiver, response_id)
    assert spans, f"no span names {response_id}"
    by_service: dict[str, set[str]] = {}
    for s in spans:
        by_service.setdefault(s.service, set()).add(s.name)
    for service, names in EXPECTED.items():
        assert names <= by_service.get(service, set()), (service, by_service)
    ids = {s.span_id: s for s in spans}
    roots = [s for s in spans if s.parent_id == ""]
    assert [r.name for r in roots] == ["POST /v1/chat/completions"], roots
    for s in spans:
        assert s.parent_id == "" or s.parent_id in ids, f"{s.name} has no parent in the trace"
        assert s.end_ns >= s.start_ns

    def chain(name: str) -> list[str]:
        span, names = next(s for s in spans if s.name == name), []
        while span.parent_id:
            span = ids[span.parent_id]
            names.append(span.name)
        return names

    assert chain("decode") == [
        "KVHandoff decode", "prefill", "PrefillTask prefill", "GenerateRequest requests",
        "POST /v1/chat/completions",
    ]  # fmt: skip
    assert chain("kv_handoff")[:2] == ["kv_transfer", "KVHandoff decode"]
    assert chain("prefill_compute")[:2] == ["prefill", "PrefillTask prefill"]
    assert chain("placement") == ["GenerateRequest requests", "POST /v1/chat/completions"]
