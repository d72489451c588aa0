"""What tracing and the request-id binding cost a bus message, off and on.

Per wire message, a service's bus does ``tracing.stamp`` before it sends and runs its handler
inside ``tracing.delivery``. This times that pair on a ``PrefillTask`` (the message every
request crosses the bus in), side by side in one process, against what the bus does anyway
(msgspec encode and decode of the same message):

- off: no ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the default);
- on: an SDK tracer provider whose processor drops every span (the spans are made, the export
  is left out, as a collector's cost is not Crescent's).

    .venv/bin/python bench/tracing.py [--messages 200000] [--repeats 5]

Prints the median of ``--repeats`` runs, in microseconds per message, and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared import tracing
from shared.cluster_messages import PrefillTask
from shared.messages import GenerateRequest, SamplingSpec, decode, encode


def task() -> PrefillTask:
    request = GenerateRequest(
        request_id="chatcmpl-bench-0", tenant="tenant", prompt_token_ids=list(range(512)),
        sampling=SamplingSpec(max_tokens=64),
    )  # fmt: skip
    return PrefillTask(request=request, decode_nodes=["decode-0"])


def per_message_us(work: Callable[[], None], count: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(count):
            work()
        runs.append((time.perf_counter() - started) / count * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    message = task()
    data = encode(message)

    def codec() -> None:
        decode(encode(message), PrefillTask)

    def traced() -> None:
        tracing.stamp(message)
        with tracing.delivery(message, "crescent.prefill.p0"):
            pass

    tracing.uninstall()
    codec_us = per_message_us(codec, args.messages, args.repeats)
    off_us = per_message_us(traced, args.messages, args.repeats)
    from opentelemetry.sdk.trace import TracerProvider

    tracing.install(TracerProvider())  # no span processor: spans are made and dropped
    message.request.traceparent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    on_us = per_message_us(traced, args.messages // 10, args.repeats)
    tracing.uninstall()
    print(f"message: PrefillTask of a 512-token prompt, {len(data)} bytes on the wire")
    print(f"{'what':<44}{'us/message':>12}{'vs codec':>10}")
    for what, us in (
        ("msgspec encode + decode (the bus's own work)", codec_us),
        ("stamp + delivery, tracing off", off_us),
        ("stamp + delivery, tracing on (spans dropped)", on_us),
    ):
        print(f"{what:<44}{us:>12.3f}{us / codec_us:>9.2f}x")


if __name__ == "__main__":
    main()
