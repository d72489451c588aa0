"""OpenTelemetry spans of a request's phases, linked across services through the bus.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (``configure``): then every function here
returns at its first line, and the OpenTelemetry packages are never imported. On, each service
exports its spans over OTLP/HTTP, and a request's trace context rides on its wire message
(``GenerateRequest.traceparent``, W3C format, also inside ``PrefillTask`` and ``KVHandoff``):
``stamp`` writes it on what a service sends, ``delivery`` opens the receiving service's span
under it. Phases timed after the fact (a node's queue, fetch, compute, hand-off and decode)
become spans with ``record``; ``remember`` keeps, per request, the span later ones hang under.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from shared import logs

#: Requests whose last span this process remembers (a node's in-flight requests, and more).
MAX_REMEMBERED = 4096
Attributes = Mapping[str, str | int | float | bool]


class _State:
    """This process's tracer (None: tracing is off) and the span last made per request."""

    def __init__(self) -> None:
        self.tracer: Any = None
        self.provider: Any = None
        self.parents: OrderedDict[str, str] = OrderedDict()


_state = _State()


def configure(service: str, endpoint: str) -> bool:
    """Turns tracing on for this process when ``endpoint`` (``TracingSettings``, from
    ``OTEL_EXPORTER_OTLP_ENDPOINT``) is not blank; returns whether it did. The exporter reads
    that variable and the other ``OTEL_*`` itself."""
    if not endpoint.strip():
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"crescent-{service}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    install(provider)
    return True


def install(provider: Any) -> None:
    """Traces with ``provider`` (an SDK ``TracerProvider``; tests give one that keeps spans)."""
    _state.provider = provider
    _state.tracer = provider.get_tracer("crescent")


def uninstall() -> None:
    _state.tracer = _state.provider = None
    _state.parents.clear()


def enabled() -> bool:
    return _state.tracer is not None


@contextmanager
def span(name: str, parent: str = "", attributes: Attributes | None = None) -> Iterator[None]:
    """A span around the block, the current one inside it; under ``parent`` (a traceparent)
    if given, else under the current span."""
    tracer = _state.tracer
    if tracer is None:
        yield
        return
    context = _context(parent) if parent else None
    with tracer.start_as_current_span(name, context=context, attributes=attributes):
        yield


def record(
    name: str, parent: str, seconds: float, ago_s: float = 0.0, attrs: Attributes | None = None
) -> str:
    """A span that ended ``ago_s`` seconds ago after lasting ``seconds``, under ``parent``;
    returns its traceparent ("" when tracing is off or there is no parent)."""
    tracer = _state.tracer
    if tracer is None or not parent:
        return ""
    end = time.time_ns() - int(ago_s * 1e9)
    start = end - int(max(seconds, 0.0) * 1e9)
    made = tracer.start_span(name, context=_context(parent), start_time=start, attributes=attrs)
    made.end(end_time=end)
    return _format(made.get_span_context())


def current() -> str:
    """The traceparent of the current span; "" when there is none."""
    if _state.tracer is None:
        return ""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return _format(context) if context.is_valid else ""


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span, for log lines."""
    if _state.tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return (f"{context.trace_id:032x}", f"{context.span_id:016x}") if context.is_valid else None


def remember(request_id: str, traceparent: str) -> None:
    """Makes ``traceparent`` the span this process hangs ``request_id``'s next spans under."""
    if _state.tracer is None or not traceparent:
        return
    parents = _state.parents
    parents[request_id] = traceparent
    parents.move_to_end(request_id)
    while len(parents) > MAX_REMEMBERED:
        parents.popitem(last=False)


def parent_of(request_id: str) -> str:
    return _state.parents.get(request_id, "") if _state.tracer is not None else ""


# -- the bus ---------------------------------------------------------------------------------


def request_of(message: object) -> Any:
    """The ``GenerateRequest`` a wire message carries (itself, or its ``request``), or None."""
    if hasattr(message, "traceparent"):
        return message
    inner = getattr(message, "request", None)
    return inner if hasattr(inner, "traceparent") else None


def stamp(message: object) -> None:
    """Names the sending task's tagged request for the log lines (``logs.name_request``), and
    writes the sending span's context on a message that carries a request: the current span,
    else the one remembered for the request."""
    request = request_of(message)
    if request is None:
        return
    logs.name_request(request.request_id)
    if _state.tracer is None:
        return
    parent = current() or parent_of(request.request_id)
    if parent:
        request.traceparent = parent


class Delivery:
    """Around the handling of a message from the bus: its request id for the log lines, and,
    when it carries a trace context while tracing is on, a span of this service under it. A
    class rather than a generator: it wraps every message a service receives."""

    __slots__ = ("_request", "_span", "_subject", "_token", "message")

    def __init__(self, message: object, subject: str) -> None:
        self.message = message
        self._subject = subject
        self._request = request_of(message)
        self._span: Any = None
        self._token: Any = None

    def __enter__(self) -> None:
        request = self._request
        if request is not None:
            self._token = logs.REQUEST_ID.set(request.request_id)
        else:
            self._token = logs.REQUEST_ID.set(getattr(self.message, "request_id", None))
        if _state.tracer is None or request is None or not request.traceparent:
            return
        name = f"{type(self.message).__name__} {self._subject.split('.', 2)[1]}"
        attrs = {"crescent.request_id": request.request_id}
        self._span = span(name, request.traceparent, attrs)
        self._span.__enter__()
        remember(request.request_id, current())

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._span is not None:
                self._span.__exit__(*exc)
        finally:
            logs.REQUEST_ID.reset(self._token)


delivery = Delivery


def _format(context: Any) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _context(traceparent: str) -> Any:
    """An OpenTelemetry context whose current span is the remote one ``traceparent`` names;
    None (the current context) when it does not parse."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    try:
        _version, trace_id, span_id, flags = traceparent.split("-")
        sampled = TraceFlags(int(flags, 16))
        context = SpanContext(int(trace_id, 16), int(span_id, 16), True, sampled)
    except ValueError:
        return None
    if not context.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(context))
