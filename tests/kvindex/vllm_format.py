"""KV events as an outsider writes and reads them, from the documented formats alone: vLLM's
batch structs as its KV events subscriber example spells them, and the NATS frame as the
architecture doc describes it (JSON: ``v``, ``role``, ``publisher``, ``epoch``, ``seq``,
``batch`` in base64). No Crescent class is used here, so the tests see the format, not the code."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

import msgspec


class Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(Event):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(Event):
    block_hashes: list[bytes | int]
    medium: str | None


class AllBlocksCleared(Event):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def frame(role: str, publisher: str, epoch: str, seq: int, events: list[Event]) -> bytes:
    """One NATS message carrying ``events`` as frame ``seq`` of the ``epoch`` of ``publisher``,
    a ``role``."""
    batch = msgspec.msgpack.encode(KVEventBatch(1.0, events))  # type: ignore[arg-type]
    body = {"v": 2, "role": role, "publisher": publisher, "epoch": epoch, "seq": seq}
    return json.dumps(body | {"batch": base64.b64encode(batch).decode()}).encode()


_decoder = msgspec.msgpack.Decoder(KVEventBatch)


@dataclass
class Rebuilt:
    """The per-publisher, per-tier views an outsider rebuilds from frames: block hash ->
    parent hash. A tier is cleared by a clear that names it (Crescent appends the medium
    after vLLM's fields, read here from the raw array) or by one that names none."""

    views: dict[tuple[str, str], dict[bytes | int, bytes | int | None]] = field(
        default_factory=dict
    )
    next_seq: dict[str, int] = field(default_factory=dict)
    gaps: int = 0
    removed: int = 0

    def take(self, data: bytes) -> None:
        message = json.loads(data)
        publisher, seq = message["publisher"], message["seq"]
        if self.next_seq.get(publisher, seq) != seq:
            self.gaps += 1
        self.next_seq[publisher] = seq + 1
        raw = base64.b64decode(message["batch"])
        mediums = [e[-1] if len(e) > 1 else None for e in msgspec.msgpack.decode(raw)[1]]
        for event, medium in zip(_decoder.decode(raw).events, mediums, strict=True):
            self._apply(publisher, event, medium)

    def _apply(self, publisher: str, event: Event, medium: str | None) -> None:
        if isinstance(event, AllBlocksCleared):
            for where in [w for w in self.views if w[0] == publisher]:
                if medium is None or where[1] == medium:
                    del self.views[where]
            return
        assert isinstance(event, BlockStored | BlockRemoved)
        view = self.views.setdefault((publisher, str(event.medium)), {})
        if isinstance(event, BlockRemoved):
            self.removed += len(event.block_hashes)
            for block in event.block_hashes:
                view.pop(block, None)
            return
        parent = event.parent_block_hash
        for block in event.block_hashes:
            view[block] = parent
            parent = block
