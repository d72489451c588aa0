"""The KV event index: each publisher's blocks per tier, folded from its numbered frames, and
the longest prefix of a prompt that each publisher holds in each tier. Pure: no I/O.

How frames are trusted. Frames of one publisher's epoch are numbered 0, 1, 2, ...:

- The first frame of an epoch opens a view. From frame 0 the view is whole; from a later one
  (the index started after the publisher) it holds only blocks stored since, so it may miss
  some but never names a block the publisher dropped. A resend is asked for.
- A skipped number is a gap: a frame with drops may be lost, so every tier of the publisher
  is forgotten and a resend is asked for. Until it comes, events are ignored except for the
  tiers the publisher has cleared since (``AllBlocksCleared`` names one tier, or every tier).
- A number already folded (a replay) is ignored.

How memory is bounded. A publisher's tier holds at most ``max_blocks_per_view`` blocks: past
that, its oldest stored blocks are dropped from the view (the index then under-reports, never
over-reports, and says the view is not complete). At most ``max_publishers`` publishers are
indexed at once; frames of another are refused until one is forgotten.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, tier_of

Key = bytes | int


@dataclass(slots=True)
class TierView:
    """One publisher's blocks in one tier. Invariant: ``blocks`` maps the hashes stored and not
    removed or cleared since, each to (its parent's hash, its tokens), oldest stored first,
    except the ``trimmed`` oldest ones dropped to keep within the cap."""

    blocks: dict[Key, tuple[Key | None, int]] = field(default_factory=dict)
    trimmed: int = 0

    def store(self, event: BlockStored, cap: int) -> None:
        parent = event.parent_block_hash
        for key in event.block_hashes:
            self.blocks.pop(key, None)  # stored again: now the newest
            self.blocks[key] = (parent, event.block_size)
            parent = key
        while len(self.blocks) > cap:
            del self.blocks[next(iter(self.blocks))]
            self.trimmed += 1

    def remove(self, keys: Sequence[Key]) -> None:
        for key in keys:
            self.blocks.pop(key, None)


@dataclass(slots=True)
class PublisherView:
    """What the index knows of one publisher's current epoch. Invariants: ``tiers`` holds only
    tiers whose events since the last gap were all folded; while ``resent`` is a set (a gap
    was seen) events reach only the tiers in it, those cleared since the gap."""

    epoch: str
    last_seq: int
    tiers: dict[str, TierView] = field(default_factory=dict)
    resent: set[str] | None = None
    complete: bool = True
    asked_at: float = -math.inf

    def accepts(self, tier: str) -> bool:
        return self.resent is None or tier in self.resent

    @property
    def whole(self) -> bool:
        """Whether the view holds every block the publisher does (no gap, no late join, no
        block dropped for the cap)."""
        return self.complete and not any(t.trimmed for t in self.tiers.values())


@dataclass(frozen=True, slots=True)
class Folded:
    """What folding one frame did: ``applied`` False for a replayed frame or one ``refused``
    (a publisher past the cap on publishers); ``resync`` is why the publisher should resend
    every tier, or "" when it need not be asked now."""

    applied: bool
    resync: str = ""
    refused: bool = False


@dataclass(frozen=True, slots=True)
class TierMatch:
    blocks: int
    tokens: int


@dataclass(frozen=True, slots=True)
class PublisherMatch:
    """One publisher's hold on a prompt: the leading blocks it holds in each tier, and across
    its tiers together (``longest``: each block in any of them)."""

    publisher: str
    longest: TierMatch
    tiers: dict[str, TierMatch]
    complete: bool


class KvIndex:
    """Owns every publisher's view, keyed by the publisher's name (its role and id, as the
    handlers give it). Invariant: each view is what its folded frames say, under the trust
    rules of this module, within the caps on blocks per view and on publishers;
    ``resync_after_s`` spaces the resend requests of one publisher that stays out of step."""

    def __init__(
        self,
        resync_after_s: float = 5.0,
        max_blocks_per_view: int = 1 << 20,
        max_publishers: int = 1024,
    ) -> None:
        self.publishers: dict[str, PublisherView] = {}
        self.resync_after_s = resync_after_s
        self.max_blocks_per_view = max_blocks_per_view
        self.max_publishers = max_publishers

    def fold(self, publisher: str, epoch: str, seq: int, batch: KVEventBatch, now: float) -> Folded:
        """Folds frame ``seq`` of ``publisher``'s ``epoch``."""
        view = self.publishers.get(publisher)
        reason = ""
        if view is None and len(self.publishers) >= self.max_publishers:
            return Folded(False, refused=True)
        if view is None or view.epoch != epoch:
            view = self.publishers[publisher] = PublisherView(epoch, seq - 1, complete=seq == 0)
            reason = "" if seq == 0 else f"joined at frame {seq}"
        elif seq <= view.last_seq:
            return Folded(False)
        elif seq != view.last_seq + 1:
            reason = f"frames {view.last_seq + 1}..{seq - 1} missed"
            view.tiers.clear()
            view.resent = set()
            view.complete = False
        view.last_seq = seq
        for event in batch.events:
            self._apply(view, event)
        if not view.complete and (reason or now - view.asked_at >= self.resync_after_s):
            view.asked_at = now
            return Folded(True, reason or "still out of step")
        return Folded(True)

    def _apply(
        self, view: PublisherView, event: BlockStored | BlockRemoved | AllBlocksCleared
    ) -> None:
        if isinstance(event, AllBlocksCleared):
            if event.medium is None:
                view.tiers.clear()
                view.resent = None
            else:
                tier = tier_of(event.medium)
                view.tiers.pop(tier, None)
                if view.resent is not None:
                    view.resent.add(tier)
            view.complete = True
            return
        tier = tier_of(event.medium)
        if not view.accepts(tier):
            return
        if isinstance(event, BlockStored):
            view.tiers.setdefault(tier, TierView()).store(event, self.max_blocks_per_view)
        elif tier in view.tiers:
            view.tiers[tier].remove(event.block_hashes)

    def forget(self, publisher: str) -> bool:
        """Drops ``publisher``'s view (it is gone); True if there was one."""
        return self.publishers.pop(publisher, None) is not None

    def match(self, keys: Sequence[Key]) -> list[PublisherMatch]:
        """Per publisher holding the first of ``keys``, its leading blocks per tier and across
        tiers, longest first (then by name); tiers holding none are left out."""
        found = []
        for name, view in self.publishers.items():
            tiers = {t: _leading(keys, [v]) for t, v in view.tiers.items()}
            tiers = {t: m for t, m in tiers.items() if m.blocks}
            if tiers:
                longest = _leading(keys, list(view.tiers.values()))
                found.append(PublisherMatch(name, longest, tiers, view.whole))
        return sorted(found, key=lambda m: (-m.longest.blocks, m.publisher))


def _leading(keys: Sequence[Key], views: list[TierView]) -> TierMatch:
    """How many of ``keys`` lead in ``views`` together, and their tokens."""
    blocks = tokens = 0
    for key in keys:
        entry = next((v.blocks[key] for v in views if key in v.blocks), None)
        if entry is None:
            break
        blocks += 1
        tokens += entry[1]
    return TierMatch(blocks, tokens)
