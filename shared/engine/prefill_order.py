"""Which prompts an engine step computes first, and how the step's tokens are shared by them.

A prompt's urgency is the time its first token is due: its TTFT deadline, or, without one, its
arrival plus ``DEFAULT_TTFT_S``, moved later by ``PRIORITY_STEP_S`` per unit of its priority
(vLLM's convention: a lower value is served sooner). Urgencies are absolute times, so waiting
ages every prompt: a low-priority one comes before prompts that arrive long enough after it,
and nothing starves. A step first gives every prompt that can finish within an equal share of
its budget (at least ``min_share`` tokens, or half the budget) all it has left, then the rest
to the others, most urgent first. So a short prompt that arrives behind a long one finishes
within the step while the long one goes on, and long prompts are computed one after another
in deadline order rather than all slowed down together (which would delay every first token
to the time of the last). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

#: When a prompt without a deadline is due, after it arrived.
DEFAULT_TTFT_S = 10.0
#: How much later one unit of priority makes a prompt due.
PRIORITY_STEP_S = 1.0
#: The smallest share of a step a prompt is given while others wait beside it.
MIN_PREFILL_SHARE = 128


def urgency(priority: int, deadline: float, arrival: float) -> float:
    """When the prompt's first token is due (Unix seconds), moved by its priority."""
    due = deadline if deadline > 0 else arrival + DEFAULT_TTFT_S
    return due + priority * PRIORITY_STEP_S


def share_budget(remaining: Sequence[int], budget: int, min_share: int) -> list[int]:
    """The tokens each prompt computes this step, ``remaining`` being what each has left, most
    urgent first: all of it for those whose rest fits an equal share (at least ``min_share``,
    or half the budget if that is less), in that order while the budget lasts, then what is
    left to the others, most urgent first; with ``min_share`` 0, all in order. Never more than
    a prompt has left, nor in all more than ``budget``."""
    grants = [0] * len(remaining)
    if not remaining or budget <= 0:
        return grants
    # With no minimum share, no prompt goes out of its turn.
    share = max(min(min_share, budget // 2), budget // len(remaining), 1) if min_share else 0
    left = budget
    for i, need in enumerate(remaining):
        if need <= min(share, left):
            grants[i] = need
            left -= need
    for i, need in enumerate(remaining):
        if left <= 0:
            break
        extra = min(need - grants[i], left)
        grants[i] += extra
        left -= extra
    return grants
