"""Relays another engine's KV events onto Crescent's subjects: vLLM publishes each batch on a
ZMQ PUB socket as three frames (topic, an 8-byte big-endian sequence number, the msgpack
batch); the relay forwards the batch unchanged in a ``KvEventFrame`` on
``subjects.kv_events("external", <publisher>)``, its sequence number as ``seq``. Run it beside
the engine with ``python -m services.kvindex.relay`` (it needs ``pyzmq``, which Crescent itself
does not), connected as the relay's NATS user, which may publish only external events: a relay
cannot speak for a Crescent node or tierd.

A number lower than the last one means the engine restarted: the relay starts a new epoch,
so listeners open a fresh view instead of seeing a gap.
"""

from __future__ import annotations

import logging
import uuid

from services.kvindex.config import RelaySettings
from shared import subjects
from shared.bus import Bus, NatsBus
from shared.kv_events import KvEventFrame
from shared.lifecycle import Lifecycle
from shared.runtime import run_service
from shared.task_policy import OnError

log = logging.getLogger("kvindex.relay")


class RelayStream:
    """Owns the numbering of one engine's relayed frames, and their subject (the engine's id
    under the ``external`` role). Invariant: within an epoch, ``seq`` is the engine's own
    number; a number below the last one starts a new epoch."""

    def __init__(self, publisher: str) -> None:
        self.publisher = subjects.check_token(publisher, "publisher id")
        self.subject = subjects.kv_events(subjects.KV_EXTERNAL, publisher)
        self.epoch = uuid.uuid4().hex[:16]
        self.last_seq = -1

    def frame(self, seq_bytes: bytes, payload: bytes) -> KvEventFrame:
        """The frame carrying one of the engine's batches; ``ValueError`` on a bad number."""
        if len(seq_bytes) != 8:
            raise ValueError(f"a sequence frame is 8 bytes, not {len(seq_bytes)}")
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        if seq < 0:
            raise ValueError(f"sequence number {seq} is negative")
        if seq <= self.last_seq:
            self.epoch = uuid.uuid4().hex[:16]
            log.info("the engine's numbers restarted at %d: new epoch %s", seq, self.epoch)
        self.last_seq = seq
        return KvEventFrame(
            role=subjects.KV_EXTERNAL,
            publisher=self.publisher,
            epoch=self.epoch,
            seq=seq,
            batch=payload,
        )


class Relay:
    """Owns the ZMQ subscription, the bus connection and the lifecycle running the loop."""

    def __init__(self, settings: RelaySettings) -> None:
        self.settings = settings
        self.stream = RelayStream(settings.relay_publisher)
        self.lifecycle = Lifecycle("kvindex-relay")
        self.bus: Bus | None = None

    async def start(self) -> None:
        s = self.settings
        self.bus = await NatsBus.connect(
            s.nats_url, "crescent-kvindex-relay", **s.connect_options()
        )
        self.lifecycle.on_stop("bus", self.bus.close)
        self.lifecycle.run("relay", self._relay, on_error=OnError.RESTART)
        await self.lifecycle.start()

    async def _relay(self) -> None:
        import zmq  # optional: only a relay needs it
        import zmq.asyncio

        s, bus = self.settings, self.bus
        assert bus is not None
        socket = zmq.asyncio.Context.instance().socket(zmq.SUB)
        socket.connect(s.relay_zmq_endpoint)
        socket.setsockopt_string(zmq.SUBSCRIBE, s.relay_zmq_topic)
        subject = self.stream.subject
        log.info("relaying %s to %s", s.relay_zmq_endpoint, subject)
        try:
            while True:
                parts = await socket.recv_multipart()
                if len(parts) != 3:
                    log.warning("skipped a ZMQ message of %d frames, not 3", len(parts))
                    continue
                await bus.publish(subject, self.stream.frame(parts[1], parts[2]))
        finally:
            socket.close(linger=0)

    async def stop(self) -> None:
        await self.lifecycle.stop()


def main() -> None:
    settings = RelaySettings()

    async def build() -> Relay:
        return Relay(settings)

    run_service("kvindex-relay", build)


if __name__ == "__main__":
    main()
