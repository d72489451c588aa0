"""The best few decode nodes for a request, as ranking every decode node's forecast would give
them, forecasting only the nodes that can make the first places.

The rank of a node that has room is ``(time between tokens, sequences, id)``; nodes without
room come after every node with room. ``decode_index.py`` keeps each node under a lower bound
of both its time between tokens and its sequences, in groups each walked in increasing bound,
so the walk can stop once the next bound ranks after the ``k``-th node found with room.
Nodes whose forecast is their own (a step-time fit of their own, an odd heartbeat) are
forecast one by one. Pure: no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterator

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.forecast import DecodeForecast, forecast
from services.scheduler.index import Entry
from services.scheduler.pricing import PlacementRequest
from services.scheduler.timing import StepCoefficients, decode_step_seconds

#: A node of a group: (bound on its step, bound on its batch, id, bound on its context).
_Next = tuple[float, int, str, int]
#: A node waiting to be forecast and the rest of its group (None: its bound counts the
#: sequences on their way to it, and the rest of its group is in the heap already), or a
#: group not read yet (its entries).
_Candidate = tuple[float, int, str, int, Iterator[_Next] | list[Entry] | None]
_Ranked = tuple[tuple[int, float, int, str], DecodeForecast]


def rank_key(f: DecodeForecast) -> tuple[int, float, int, str]:
    """Lower is better: nodes with room by predicted time between tokens (then fewer
    sequences, then id); after them those without room, fewest sequences first (the request
    would queue there rather than fail)."""
    if f.fits:
        return (0, f.tbt_s, f.seqs, f.node_id)
    return (1, float(f.seqs), 0, f.node_id)


def best_decodes(
    request: PlacementRequest,
    view: ClusterView,
    now: float,
    at: float,
    k: int,
    avoid: Collection[str] = (),
) -> list[DecodeForecast]:
    """``sorted(forecasts of every decode node that may take work, not in avoid)[:k]`` by
    ``rank_key``, for the request's prefill ending at ``at``."""
    index = view.decode_search()
    index.advance(at)

    def takes_work(node: NodeLoad) -> bool:
        return view.takes_work(node, "decode", now, avoid)

    individual = view.timing.individual("decode")
    alone = index.odd | individual if individual else index.odd
    found: list[_Ranked] = []
    without_room: list[DecodeForecast] = []

    def consider(node: NodeLoad, coef: StepCoefficients | None = None) -> None:
        f = forecast(node, view, request, at, coef)
        if not f.fits:
            without_room.append(f)
            return
        _keep_best(found, (rank_key(f), f), k)

    for node_id in alone:
        node = view.nodes.get(node_id)
        if node is not None and takes_work(node):
            consider(node)
    coef = view.timing.shared("decode")
    prompt = request.num_prompt_tokens
    # A group enters as its first entry's bound, a marker (id "", before every id) for all
    # of it: most groups are never read.
    heap: list[_Candidate] = []
    for groups in (index.strong, index.weak):
        for (_, batch), entries in groups.items():
            context = entries[0][0] + prompt
            heap.append((decode_step_seconds(coef, batch, context), batch, "", context, entries))
    heapq.heapify(heap)
    complete = True
    while heap:
        bound, batch, node_id, context, rest = heapq.heappop(heap)
        if len(found) >= k and (0, bound, batch, node_id) > found[k - 1][0]:
            complete = False
            break
        if isinstance(rest, list):  # a group's marker: read the group from now on
            walk = _walk(view, coef, batch, rest, prompt, alone, takes_work)
            first = next(walk, None)
            if first is not None:
                heapq.heappush(heap, (*first, walk))
            continue
        if rest is not None:
            following = next(rest, None)
            if following is not None:
                heapq.heappush(heap, (*following, rest))
            # Sequences placed on the node and due by then join its batch: a cheap bound
            # first, the forecast only if the node can still make the first places.
            come, tokens = view.arriving_by(node_id, at)
            if come:
                context += tokens
                raised = decode_step_seconds(coef, batch + come, context)
                heapq.heappush(heap, (raised, batch + come, node_id, context, None))
                continue
        # A node of a group is one of those ``shared`` predicts: not ``alone``.
        consider(view.nodes[node_id], coef)
    ranked = [f for _, f in found]
    if complete and len(ranked) < k:
        ranked += sorted(without_room, key=rank_key)[: k - len(ranked)]
    return ranked


def _keep_best(found: list[_Ranked], item: _Ranked, k: int) -> None:
    """Inserts ``item`` in order of its key, keeping the ``k`` best."""
    at = len(found)
    while at > 0 and item[0] < found[at - 1][0]:
        at -= 1
    if at < k:
        found.insert(at, item)
        del found[k:]


def _walk(
    view: ClusterView,
    coef: StepCoefficients,
    batch: int,
    entries: list[Entry],
    prompt: int,
    alone: set[str],
    takes_work: Callable[[NodeLoad], bool],
) -> Iterator[_Next]:
    """The group's nodes that may take work, in increasing bound."""
    nodes = view.nodes
    for tokens, node_id in entries:
        if node_id in alone or not takes_work(nodes[node_id]):
            continue
        context = tokens + prompt
        yield (decode_step_seconds(coef, batch, context), batch, node_id, context)
