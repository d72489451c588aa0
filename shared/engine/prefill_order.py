"""Which prompts an engine step computes first, and how the step's tokens are shared by them.

A prompt's urgency is the time its first token is due: its TTFT deadline, or, without one, its
arrival plus ``DEFAULT_TTFT_S``, moved later by ``PRIORITY_STEP_S`` per unit of its priority
(vLLM's convention: a lower value is served sooner). Urgencies are absolute times, so waiting
ages every prompt: a low-priority one comes before prompts that arrive long enough after it,
and nothing starves. A step first gives every prompt that can finish within an equal share of
its budget (at least ``min_share`` tokens, or half the budget) all it has left, then the rest
to the others, most urgent first, no more of it than the finishing prompts take. So a short
prompt that arrives behind a long one finishes within a short step while the long one goes on
(at half speed at worst, so a stream of short prompts cannot starve it), and long prompts are
computed one after another in deadline order rather than all slowed down together (which
would delay every first token to the time of the last).

A prompt that cannot meet its due time any more, at the node's measured pace, yields to those
that still can (``feasible_first``): under overload, earliest-deadline-first would otherwise
spend the node on a prompt already late and make every prompt behind it late too (the domino
effect of EDF). It yields for at most ``LATE_GRACE_S`` past its due time, then takes its place
again, first by then, so a stream of feasible prompts cannot starve it. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

#: When a prompt without a deadline is due, after it arrived.
DEFAULT_TTFT_S = 10.0
#: How much later one unit of priority makes a prompt due.
PRIORITY_STEP_S = 1.0
#: The smallest share of a step a prompt is given while others wait beside it.
MIN_PREFILL_SHARE = 128
#: How long past its due time a prompt that cannot meet it yields to those that can.
LATE_GRACE_S = DEFAULT_TTFT_S
#: Added to the urgency of a prompt that yields: after every prompt that does not.
YIELDED_S = 1e9


def urgency(priority: int, deadline: float, arrival: float) -> float:
    """When the prompt's first token is due (Unix seconds), moved by its priority."""
    due = deadline if deadline > 0 else arrival + DEFAULT_TTFT_S
    return due + priority * PRIORITY_STEP_S


def feasible_first(due: float, left_tokens: int, now: float, token_s: float) -> float:
    """The prompt's place in the order, given when it is ``due``: that time, unless its
    ``left_tokens`` cannot be computed by then at ``token_s`` seconds a token (0: not measured
    yet, so every prompt is taken to make it) while it is less than ``LATE_GRACE_S`` late;
    then after every prompt that can, in due order among those that yield."""
    if token_s <= 0 or now >= due + LATE_GRACE_S or now + left_tokens * token_s <= due:
        return due
    return due + YIELDED_S


def share_budget(remaining: Sequence[int], budget: int, min_share: int) -> list[int]:
    """The tokens each prompt computes this step, ``remaining`` being what each has left, most
    urgent first: all of it for those whose rest fits an equal share (at least ``min_share``,
    or half the budget if that is less), in that order while the budget lasts; then the rest
    to the others, most urgent first, but in a step where some prompt finishes and not all
    can, no more in all than the finishing ones take (at least that minimum): a step lasts
    about as long as its tokens, and a short prompt's first token should not wait for a long
    prompt's whole chunk.
    With ``min_share`` 0, all in order. Never more than a prompt has left, nor in all more
    than ``budget``."""
    grants = [0] * len(remaining)
    if not remaining or budget <= 0:
        return grants
    if not min_share:  # no prompt goes out of its turn
        return _in_order(remaining, grants, budget)
    floor = max(min(min_share, budget // 2), 1)
    share = max(floor, budget // len(remaining))
    left = budget
    for i, need in enumerate(remaining):
        if need <= min(share, left):
            grants[i] = need
            left -= need
    finishing = budget - left
    if finishing and sum(remaining) > budget:  # else every prompt finishes in this step
        left = min(left, max(floor, finishing))
    return _in_order(remaining, grants, left)


def _in_order(remaining: Sequence[int], grants: list[int], left: int) -> list[int]:
    """``grants`` topped up from ``left`` tokens, the first prompts first."""
    for i, need in enumerate(remaining):
        if left <= 0:
            break
        extra = min(need - grants[i], left)
        grants[i] += extra
        left -= extra
    return grants
