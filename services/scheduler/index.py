"""Nodes kept in the order placement searches them, so a placement prices a handful of nodes
instead of every node of the cluster.

Prefill nodes are kept by the prompt tokens ahead of a new request (``queued_tokens +
placed_tokens``), per pricing class: nodes of one class that hold no prefix of their own cost
the same but for their queue, so their TTFTs rise with the queue and a search can stop at the
first node that cannot win. Decode nodes are kept by what bounds their predicted time between
tokens from below (``decode_index.py``). ``ClusterView`` keeps both current: every change of a
field that orders them goes through ``ClusterView.update``, ``record`` or ``withdraw``.
Pure: no I/O.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.scheduler.cluster import NodeLoad

#: Nodes of one prefill pricing class: (tokens per step, block size, bytes per block).
PrefillClass = tuple[int, int, int]
#: An entry of a sorted list: (ordering key, node id).
Entry = tuple[int, str]


def insert(entries: list[Entry], entry: Entry) -> None:
    bisect.insort(entries, entry)


def remove(entries: list[Entry], entry: Entry) -> None:
    at = bisect.bisect_left(entries, entry)
    if at < len(entries) and entries[at] == entry:
        del entries[at]


def load_of(node: NodeLoad) -> int:
    """Prompt tokens a prefill node computes before a request placed on it now."""
    return node.queued_tokens + node.placed_tokens


def measures_links(node: NodeLoad) -> bool:
    """Whether ``node`` measured a pull: then its fetch times are its own, not its class's."""
    links = node.fetch_bandwidth
    return bool(links) and any(bw > 0 for bw in links.values())


@dataclass(slots=True)
class PrefillIndex:
    """Owns the prefill nodes in load order by pricing class, and the nodes priced one by one.

    Invariants: every prefill node of the view is in exactly one of ``classes`` (under the key
    ``where`` names, with its load as of its last ``put``) or ``measured`` (it measured its
    links); ``hosts`` maps a host to its prefill nodes.
    """

    classes: dict[PrefillClass, list[Entry]] = field(default_factory=dict)
    measured: set[str] = field(default_factory=set)
    hosts: dict[str, set[str]] = field(default_factory=dict)
    where: dict[str, tuple[PrefillClass | None, int, str]] = field(default_factory=dict)

    def put(self, node: NodeLoad, pricing_class: PrefillClass) -> None:
        load = load_of(node)
        kept_as = (None if measures_links(node) else pricing_class, load, node.host_id)
        if self.where.get(node.node_id) == kept_as:
            return
        self.remove(node.node_id)
        if kept_as[0] is None:
            self.measured.add(node.node_id)
        else:
            insert(self.classes.setdefault(pricing_class, []), (load, node.node_id))
        self.where[node.node_id] = kept_as
        if node.host_id:
            self.hosts.setdefault(node.host_id, set()).add(node.node_id)

    def remove(self, node_id: str) -> None:
        found = self.where.pop(node_id, None)
        if found is None:
            return
        pricing_class, load, host = found
        if pricing_class is None:
            self.measured.discard(node_id)
        else:
            entries = self.classes[pricing_class]
            remove(entries, (load, node_id))
            if not entries:
                del self.classes[pricing_class]
        if host:
            on_host = self.hosts[host]
            on_host.discard(node_id)
            if not on_host:
                del self.hosts[host]

    def current(self, node: NodeLoad) -> bool:
        """Whether ``node``'s load is the one it is kept under."""
        found = self.where.get(node.node_id)
        return found is not None and found[1] == load_of(node)
