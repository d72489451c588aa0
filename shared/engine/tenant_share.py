"""Fair shares of a node's prompt computation between tenants.

Each tenant's recent service is the prompt tokens the node computed for it, decayed with a
half-life of ``HALF_LIFE_S``. When prompts of several tenants wait, they are taken in weighted
turns (``in_turns``), the least served tenant for its weight first and each tenant's own
prompts most urgent first: a tenant that sends four times another's load gets more of the node
only while the other leaves capacity unused, and cannot push the other's prompts back behind
its own backlog; a tenant's weight (``SamplingParams.tenant_weight``, from the gateway's
``CRESCENT_TENANT_WEIGHTS``) multiplies its share while both wait.

Turns decide who goes first once a step starts, but not how long a step already running
makes a newly arrived prompt wait. So while several tenants have been served lately, the
tenant served least for its weight (``TenantService.favoured``) computes as it would alone,
and the others' prompt tokens in a step are bounded to what the node computes in ``step_s``
less the favoured tenant's (``contended_budget``, ``favour``): one tenant's backlog cannot make
another's prompt wait for a long step of its own, nor share its steps. Pure but for the times
its callers give it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

#: How fast a tenant's past service is forgotten.
HALF_LIFE_S = 10.0
#: Tokens of service below which a tenant no longer counts as served lately.
ACTIVE_TOKENS = 1.0
#: The fewest prompt tokens a contended step computes, however slow the node.
MIN_CONTENDED_STEP_TOKENS = 16

T = TypeVar("T")


@dataclass(slots=True)
class TenantService:
    """Owns each tenant's decayed count of prompt tokens computed for it. Invariant: a count is
    as of ``_at[tenant]``; reading it at a later time decays it, never raises it."""

    half_life_s: float = HALF_LIFE_S
    _tokens: dict[Hashable, float] = field(default_factory=dict)
    _at: dict[Hashable, float] = field(default_factory=dict)
    _weight: dict[Hashable, float] = field(default_factory=dict)

    def served(self, tenant: Hashable, now: float) -> float:
        tokens = self._tokens.get(tenant, 0.0)
        if tokens == 0.0:
            return 0.0
        elapsed = max(now - self._at[tenant], 0.0)
        return tokens * 0.5 ** (elapsed / self.half_life_s)

    def active(self, now: float, waiting: Iterable[Hashable] = ()) -> set[Hashable]:
        """The tenants served lately (at least ``ACTIVE_TOKENS``, decayed) or ``waiting``."""
        lately = {t for t in self._tokens if self.served(t, now) >= ACTIVE_TOKENS}
        return lately.union(waiting)

    def favoured(self, tenants: Iterable[Hashable], now: float) -> Hashable | None:
        """Of ``tenants``, the one served least for its weight (the last weight it came with);
        None when there are none."""
        return min(
            tenants, key=lambda t: self.served(t, now) / self._weight.get(t, 1.0), default=None
        )

    def add(self, tenant: Hashable, tokens: int, now: float, weight: float = 1.0) -> None:
        if tokens <= 0:
            return
        self._tokens[tenant] = self.served(tenant, now) + tokens
        self._at[tenant] = now
        self._weight[tenant] = weight
        if len(self._tokens) > 4096:  # tenants long gone are forgotten
            self._forget_idle(now)

    def _forget_idle(self, now: float) -> None:
        for tenant in [t for t in self._tokens if self.served(t, now) < ACTIVE_TOKENS]:
            del self._tokens[tenant], self._at[tenant], self._weight[tenant]


def in_turns(
    prompts: Iterable[T],
    tenant: Callable[[T], Hashable],
    urgency: Callable[[T], float],
    served: Callable[[Hashable], float],
    size: Callable[[T], int] = lambda _: 1,
    weight: Callable[[T], float] = lambda _: 1.0,
) -> list[T]:
    """``prompts`` in tenants' weighted turns (start-time fair queueing): each prompt is
    tagged with its tenant's service so far plus the ``size`` of the tenant's more urgent
    prompts, over the prompt's ``weight``, and taken lowest tag first (ties: most urgent).
    A tenant of weight 2 is thus served twice the tokens of one of weight 1 while both wait;
    each tenant's own prompts keep their urgency order. With one tenant, most urgent first."""
    queues: dict[Hashable, list[T]] = {}
    for prompt in sorted(prompts, key=urgency):
        queues.setdefault(tenant(prompt), []).append(prompt)
    if len(queues) <= 1:
        return [p for q in queues.values() for p in q]
    tagged: list[tuple[float, float, int, T]] = []
    for t, queue in queues.items():
        ahead = served(t)
        for prompt in queue:
            tagged.append((ahead / weight(prompt), urgency(prompt), len(tagged), prompt))
            ahead += size(prompt)
    tagged.sort(key=lambda entry: entry[:3])
    return [entry[3] for entry in tagged]


def contended_budget(budget: int, active_tenants: int, step_s: float, token_s: float) -> int:
    """The prompt tokens of a step that the tenants other than the favoured one may share:
    ``budget``, or while two or more tenants are active, no more than take ``step_s`` seconds
    at ``token_s`` seconds a token (at least ``MIN_CONTENDED_STEP_TOKENS``). Unbounded while
    ``step_s`` is 0 (off) or the pace is not measured yet (``token_s`` 0)."""
    if active_tenants < 2 or step_s <= 0 or token_s <= 0:
        return budget
    return min(budget, max(MIN_CONTENDED_STEP_TOKENS, int(step_s / token_s)))


def favour(
    grants: list[int], tenants: Sequence[Hashable], favoured: Hashable, cap: int
) -> list[int]:
    """``grants`` (tokens per prompt, in turn order, of ``tenants``' prompts) with the prompts
    of tenants other than ``favoured`` trimmed, first ones first, to ``cap`` tokens in all
    less what the favoured tenant's prompts take (none when those take ``cap`` or more)."""
    left = max(cap - sum(g for g, t in zip(grants, tenants, strict=True) if t == favoured), 0)
    trimmed = []
    for grant, tenant in zip(grants, tenants, strict=True):
        if tenant != favoured:
            grant = min(grant, left)
            left -= grant
        trimmed.append(grant)
    return trimmed
