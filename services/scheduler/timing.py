"""How long an engine step takes, fitted to the steps the nodes measure and report.

A step that computes ``tokens`` new tokens of ``seqs`` sequences over ``context`` tokens already
in their KV cache is modelled as

    seconds = base_s + per_token_s * tokens + per_attention_s * attention
    attention = tokens * (context + tokens / 2) / seqs

``attention`` counts the query-key pairs of the step when the context is spread evenly over the
batch: a prefill chunk of one sequence gives ``tokens * (context + tokens / 2)``, a decode batch
(one token per sequence) gives ``context + seqs / 2``. The coefficients come from a least-squares
fit that is non-negative and pulled gently towards a prior, so few or degenerate samples give
sensible answers. Pure: no I/O, no framework; the simulator imports it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from services.scheduler.fit import Moments, SlidingMoments, fit
from shared.cluster_messages import StepSample


def attention_work(num_seqs: int, num_tokens: int, num_context_tokens: int) -> float:
    """The attention feature of a step (see the module docstring)."""
    return num_tokens * (num_context_tokens + num_tokens / 2) / max(num_seqs, 1)


@dataclass(frozen=True, slots=True)
class StepCoefficients:
    """The three coefficients of the step-time model; all non-negative."""

    base_s: float
    per_token_s: float
    per_attention_s: float

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.base_s, self.per_token_s, self.per_attention_s)

    def step_seconds(self, num_seqs: int, num_tokens: int, num_context_tokens: int) -> float:
        attention = attention_work(num_seqs, num_tokens, num_context_tokens)
        return self.base_s + self.per_token_s * num_tokens + self.per_attention_s * attention


#: Before any sample: SmolLM2-135M in fp32 on two CPU cores (BRIEF §3: 128/512/2048-token
#: prefills in 0.36/1.3/7.6 s), so a fresh node on faster hardware is over- not under-estimated.
DEFAULT_PRIOR = StepCoefficients(base_s=0.05, per_token_s=2e-3, per_attention_s=1.7e-6)
#: The prior counts as a thousandth of a sample: enough to settle what the data leave open,
#: too little to bias a fit the data determine.
PRIOR_WEIGHT = 1e-3


def features(sample: StepSample) -> tuple[float, float, float]:
    """The regressors of a step: a constant, its tokens, its attention work."""
    work = attention_work(sample.num_seqs, sample.num_tokens, sample.num_context_tokens)
    return (1.0, float(sample.num_tokens), work)


def _valid(sample: StepSample) -> bool:
    return (
        math.isfinite(sample.seconds)
        and sample.seconds >= 0
        and min(sample.num_seqs, sample.num_tokens, sample.num_context_tokens) >= 0
    )


def fit_step_time(
    samples: Iterable[StepSample], prior: StepCoefficients, prior_weight: float = PRIOR_WEIGHT
) -> StepCoefficients:
    """The non-negative least-squares fit of ``samples`` (see ``fit.fit``); ``prior`` if none."""
    moments = Moments()
    for sample in filter(_valid, samples):
        moments.add(features(sample), sample.seconds)
    return _coefficients(moments, prior, prior_weight)


def _coefficients(moments: Moments, prior: StepCoefficients, weight: float) -> StepCoefficients:
    base, per_token, per_attention = fit(moments, prior.as_tuple(), weight)
    return StepCoefficients(base, per_token, per_attention)


class _Window:
    """A node's role and its last samples' running sums (``SlidingMoments``)."""

    def __init__(self, role: str, size: int) -> None:
        self.role = role
        self.sums = SlidingMoments(size)

    @property
    def moments(self) -> Moments:
        return self.sums.moments

    def extend(self, samples: Iterable[StepSample]) -> None:
        for sample in samples:
            self.sums.add(features(sample), sample.seconds)


class StepTimes:
    """Owns the recent step samples of every node and the fits made of them.

    Invariants: a node's window holds its last ``window`` valid samples; a cached fit (per node,
    and pooled per role) is dropped whenever samples it was made of change, and ``version``
    grows with every such change. A node with fewer than ``min_samples`` samples is predicted
    by its role's pooled fit while the pool has enough, and by its role's prior (through its
    own few samples) before that; ``individual`` holds every node that may be predicted by
    anything else than ``shared(role)``.
    """

    def __init__(
        self,
        prior: StepCoefficients = DEFAULT_PRIOR,
        *,
        window: int = 256,
        min_samples: int = 16,
        prior_weight: float = PRIOR_WEIGHT,
        role_priors: Mapping[str, StepCoefficients] | None = None,
    ) -> None:
        self.prior = prior
        self.role_priors = dict(role_priors or {})
        self.window = window
        self.min_samples = min_samples
        self.prior_weight = prior_weight
        self.version = 0
        self._windows: dict[str, _Window] = {}
        self._node_fits: dict[str, StepCoefficients] = {}
        self._role_fits: dict[str, StepCoefficients | None] = {}
        self._sampled: set[str] = set()  # nodes with at least one sample
        self._fitted: set[str] = set()  # nodes with at least ``min_samples``

    def prior_for(self, role: str) -> StepCoefficients:
        return self.role_priors.get(role, self.prior)

    def add(self, node_id: str, role: str, samples: Iterable[StepSample]) -> None:
        """Records a heartbeat's samples (invalid ones, e.g. negative times, are dropped)."""
        new = [s for s in samples if _valid(s)]
        window = self._windows.get(node_id)
        if window is None or window.role != role:
            window = self._windows[node_id] = _Window(role, self.window)
        elif not new:
            return
        window.extend(new)
        self._node_fits.pop(node_id, None)
        self._role_fits.clear()
        self._count(node_id)
        self.version += 1

    def forget(self, node_id: str) -> None:
        if self._windows.pop(node_id, None) is not None:
            self._node_fits.pop(node_id, None)
            self._role_fits.clear()
            self._count(node_id)
            self.version += 1

    def _count(self, node_id: str) -> None:
        samples = self.num_samples(node_id)
        for members, least in ((self._sampled, 1), (self._fitted, self.min_samples)):
            if samples >= least:
                members.add(node_id)
            else:
                members.discard(node_id)

    def num_samples(self, node_id: str) -> int:
        window = self._windows.get(node_id)
        return 0 if window is None else len(window.sums)

    def coefficients(self, node_id: str, role: str) -> StepCoefficients:
        """The node's own fit once it has ``min_samples``, else its role's pooled one."""
        if self.num_samples(node_id) < self.min_samples:
            pooled = self._pooled(role)
            if pooled is not None:
                return pooled
        window = self._windows.get(node_id)
        if window is None:
            return self.prior_for(role)
        fitted = self._node_fits.get(node_id)
        if fitted is None:
            fitted = self._node_fits[node_id] = self._fit(window.moments, window.role)
        return fitted

    def settled(self, node_id: str, role: str) -> bool:
        """Whether ``coefficients`` answers for the node from a fit of at least ``min_samples``
        (its own or its role's pool), not from a few samples drawn towards the prior."""
        return self.num_samples(node_id) >= self.min_samples or self._pooled(role) is not None

    def shared(self, role: str) -> StepCoefficients:
        """What every node of ``role`` outside ``individual(role)`` is predicted by."""
        pooled = self._pooled(role)
        return pooled if pooled is not None else self.prior_for(role)

    def individual(self, role: str) -> set[str]:
        """The nodes ``coefficients`` may answer for with something else than
        ``shared(role)``: those with a fit of their own (read only)."""
        return self._fitted if self._pooled(role) is not None else self._sampled

    def _pooled(self, role: str) -> StepCoefficients | None:
        # Cached until samples change, including "too few to fit" (None).
        if role in self._role_fits:
            return self._role_fits[role]
        pool = Moments()
        for window in self._windows.values():
            if window.role == role:
                pool.merge(window.moments)
        fit = None if pool.count < self.min_samples else self._fit(pool, role)
        self._role_fits[role] = fit
        return fit

    def _fit(self, moments: Moments, role: str) -> StepCoefficients:
        return _coefficients(moments, self.prior_for(role), self.prior_weight)


def prefill_seconds(
    coef: StepCoefficients, num_tokens: int, num_context_tokens: int, max_batched_tokens: int
) -> float:
    """Time to compute ``num_tokens`` of one sequence after ``num_context_tokens`` cached ones,
    in chunks of at most ``max_batched_tokens`` per step. The attention of the chunks sums to
    that of one step, ``n * (context + n / 2)``; only the per-step base repeats."""
    if num_tokens <= 0:
        return 0.0
    steps = -(-num_tokens // max(max_batched_tokens, 1))
    attention = attention_work(1, num_tokens, num_context_tokens)
    return steps * coef.base_s + coef.per_token_s * num_tokens + coef.per_attention_s * attention


def queue_seconds(coef: StepCoefficients, queued_tokens: int, max_batched_tokens: int) -> float:
    """Time to work off ``queued_tokens`` of prompts already waiting on a node: full steps of
    ``max_batched_tokens``, each priced as a fresh chunk (their contexts are not reported)."""
    if queued_tokens <= 0:
        return 0.0
    step = max(max_batched_tokens, 1)
    full, rest = divmod(queued_tokens, step)
    return full * coef.step_seconds(1, step, 0) + (coef.step_seconds(1, rest, 0) if rest else 0.0)


def decode_step_seconds(coef: StepCoefficients, batch: int, context_tokens: int) -> float:
    """Predicted time between tokens: one decode step of ``batch`` sequences over
    ``context_tokens`` cached tokens in all."""
    # ``coef.step_seconds(batch, batch, context_tokens)``, the same operations in the same
    # order, inline: placement bounds every group of decode nodes with it.
    attention = batch * (context_tokens + batch / 2) / (batch if batch > 1 else 1)
    return coef.base_s + coef.per_token_s * batch + coef.per_attention_s * attention
