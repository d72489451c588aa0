"""How close each node is to its role's objective, and the figure each role is scaled on.

A ratio of 1.0 means the node is at its role's objective:

- a prefill node: the time to first token the scheduler would predict now for a typical new
  prompt there (its queue wait plus the prompt's compute, priced as placement prices it,
  ``costs.cost_on_node``), stretched by the node's measured misses as admission stretches it
  (``calibration.py``), over the TTFT objective. The typical prompt is the mean prompt, and
  mean cached prefix, of the last placements (``TypicalPrompt``); an idle node sits at its
  floor, the typical prompt's compute over the objective.
- a decode node: its recent time between tokens, the mean engine step its streams waited
  through over the last ``TBT_WINDOW_S``, from the step samples of its heartbeats
  (``DecodeSteps``), over the TBT objective. A node that decoded nothing lately is at 0.

Pure: no I/O, no framework; the scheduler reads it on its heartbeat tick.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.costs import PlacementRequest, cost_on_node
from shared.cluster_messages import StepSample

ROLES = ("prefill", "decode")
#: Decode steps heard longer ago than this no longer make a node's recent time between tokens.
TBT_WINDOW_S = 10.0
#: Placements the typical prompt is the mean of.
PROMPT_WINDOW = 256
#: The typical prompt's length before any placement (``CRESCENT_SATURATION_PROMPT_TOKENS``).
REFERENCE_PROMPT_TOKENS = 512
#: Ratios are capped here: a heartbeat's field is bounded, and beyond it all says "far past".
MAX_RATIO = 1e6


@dataclass(frozen=True, slots=True)
class Objectives:
    """What a ratio of 1.0 stands for: the time to first token and between tokens, in
    seconds. Invariant: both positive."""

    ttft_s: float
    tbt_s: float


@dataclass(frozen=True, slots=True)
class Saturation:
    """One reading: ``nodes`` maps each live prefill and decode node to its role and ratio;
    ``roles`` each role's figure, absent for a role with no node that takes work (no node is
    not an idle node)."""

    nodes: dict[str, tuple[str, float]] = field(default_factory=dict)
    roles: dict[str, float] = field(default_factory=dict)


class TypicalPrompt:
    """Owns the prompt and cached tokens of the last ``window`` placements and their sums.
    Invariant: the sums are those of the window; before any placement the typical prompt is
    ``reference_tokens`` long with nothing cached."""

    def __init__(self, reference_tokens: int, window: int = PROMPT_WINDOW) -> None:
        self.reference_tokens = reference_tokens
        self._recent: deque[tuple[int, int]] = deque(maxlen=window)
        self._sums = (0, 0)

    def add(self, prompt_tokens: int, cached_tokens: int) -> None:
        prompts, cached = self._sums
        if len(self._recent) == self._recent.maxlen:
            old_prompt, old_cached = self._recent[0]
            prompts, cached = prompts - old_prompt, cached - old_cached
        self._recent.append((prompt_tokens, cached_tokens))
        self._sums = (prompts + prompt_tokens, cached + cached_tokens)

    def tokens(self) -> tuple[int, int]:
        """(prompt tokens, of which cached) of the typical prompt: the rounded means."""
        count = len(self._recent)
        if count == 0:
            return self.reference_tokens, 0
        prompts, cached = self._sums
        return max(round(prompts / count), 1), round(cached / count)


@dataclass(slots=True)
class DecodeSteps:
    """Owns each decode node's recent steps as (heard at, seconds, sequences decoding) and
    their running sums of seconds × sequences and of sequences.

    Invariant: a node's sums are those of its steps; reading or adding at ``now`` first drops
    the steps heard before ``now - window_s``.
    """

    window_s: float = TBT_WINDOW_S
    _steps: dict[str, deque[tuple[float, float, int]]] = field(default_factory=dict)
    _sums: dict[str, tuple[float, int]] = field(default_factory=dict)

    def add(self, node_id: str, samples: Iterable[StepSample], now: float) -> None:
        """Records the steps of one heartbeat of ``node_id``, heard at ``now``."""
        steps = self._steps.setdefault(node_id, deque())
        self._expire(node_id, now)
        weighted, seqs = self._sums.get(node_id, (0.0, 0))
        for sample in samples:
            decoding = decoding_seqs(sample)
            if decoding > 0:
                steps.append((now, sample.seconds, decoding))
                weighted, seqs = weighted + sample.seconds * decoding, seqs + decoding
        self._sums[node_id] = (weighted, seqs)

    def tbt_s(self, node_id: str, now: float) -> float:
        """The mean time between tokens of ``node_id``'s streams over the window (each step
        weighs as many tokens as it made); 0 when it decoded nothing in it."""
        self._expire(node_id, now)
        weighted, seqs = self._sums.get(node_id, (0.0, 0))
        return weighted / seqs if seqs > 0 else 0.0

    def keep(self, node_ids: Collection[str]) -> None:
        """Forgets the nodes not in ``node_ids`` (those the view dropped)."""
        for node_id in [n for n in self._steps if n not in node_ids]:
            del self._steps[node_id]
            self._sums.pop(node_id, None)

    def _expire(self, node_id: str, now: float) -> None:
        steps = self._steps.get(node_id)
        if not steps or now - steps[0][0] <= self.window_s:
            return
        weighted, seqs = self._sums[node_id]
        while steps and now - steps[0][0] > self.window_s:
            _, seconds, decoding = steps.popleft()
            weighted, seqs = weighted - seconds * decoding, seqs - decoding
        # Sums of what is left, exactly 0 once nothing is: subtraction leaves float crumbs.
        self._sums[node_id] = (weighted, seqs) if steps else (0.0, 0)


def decoding_seqs(sample: StepSample) -> int:
    """The sequences of a step that each got their next token. A step that computes more
    tokens than it has sequences carries a prompt's chunk (a local prefill): that sequence
    made no token between tokens, so one is left out (the samples do not say if more were)."""
    if sample.num_tokens <= sample.num_seqs:
        return sample.num_seqs
    return max(sample.num_seqs - 1, 0)


def prefill_ratio(
    view: ClusterView, node: NodeLoad, prompt: tuple[int, int], objectives: Objectives
) -> float:
    """A prefill node's predicted TTFT for the typical ``prompt`` (tokens, of which cached
    in the node's own pool), calibrated, over the TTFT objective."""
    tokens, cached = prompt
    request = PlacementRequest(num_prompt_tokens=max(tokens, 1), max_tokens=1)
    cost = cost_on_node(request, view, node, cached // max(node.block_size, 1))
    expected_s = cost.ttft_s * view.calibration.scale(node.node_id)
    return min(expected_s / objectives.ttft_s, MAX_RATIO)


def decode_ratio(steps: DecodeSteps, node: NodeLoad, now: float, objectives: Objectives) -> float:
    """A decode node's recent time between tokens over the TBT objective."""
    return min(steps.tbt_s(node.node_id, now) / objectives.tbt_s, MAX_RATIO)


def role_figure(ratios: Sequence[float]) -> float:
    """The figure an autoscaler scales a role on: the mean of its nodes' ratios.

    The mean, not the maximum, because a proportional autoscaler (Kubernetes' HPA, KEDA)
    sets ``replicas = ceil(replicas × figure / target)``, which holds for a figure that
    falls as the same work spreads over more nodes: the scheduler sends each request to the
    node where it costs least, so queues even out and the mean tracks every node. The
    maximum would follow one outlier that more replicas do not cure (a node on a slower
    host, one a tenant's cached prefix draws to) and scale the role up for it without end.
    The per-node gauges keep such a node in view.
    """
    return sum(ratios) / len(ratios) if ratios else 0.0


def measure(
    view: ClusterView,
    steps: DecodeSteps,
    prompt: tuple[int, int],
    objectives: Objectives,
    now: float,
) -> Saturation:
    """Every live prefill and decode node's ratio, and each role's figure over the nodes
    that take work (alive, healthy, not draining)."""
    steps.keep(view.nodes)
    nodes: dict[str, tuple[str, float]] = {}
    roles: dict[str, float] = {}
    for role in ROLES:
        taking = []
        for node in view.live(role, now):
            if role == "prefill":
                ratio = prefill_ratio(view, node, prompt, objectives)
            else:
                ratio = decode_ratio(steps, node, now, objectives)
            nodes[node.node_id] = (role, ratio)
            if node.healthy and not node.draining:
                taking.append(ratio)
        if taking:
            roles[role] = role_figure(taking)
    return Saturation(nodes, roles)
