"""The cluster as the status page and `crescent status` show it: every service's last
heartbeat (role, load, pool use, health), each node's saturation and each role's (as the
freshest scheduler's heartbeat gives them), the tiers' occupancy, the cache hit ratio over
time and the latencies of the last requests this gateway served. Pure: the caller feeds it
heartbeats and asks with its own clocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.gateway.metrics import Served
from shared.cluster_messages import NodeStatus

#: Width of one point of the hit-ratio history, and how many points are kept.
HISTORY_STEP_S = 10.0
HISTORY_POINTS = 60
#: Latest requests listed with their latencies.
RECENT_REQUESTS = 20
#: A service not heard from for this long is dropped from the view (it left).
FORGET_AFTER_S = 300.0


@dataclass(slots=True)
class Heard:
    status: NodeStatus
    at: float  # monotonic


@dataclass(slots=True)
class StatusBoard:
    """Owns the last heartbeat of every service this gateway heard. Invariant: at most one
    entry per service id, none older than ``FORGET_AFTER_S``."""

    heartbeat_timeout_s: float = 3.0
    heard: dict[str, Heard] = field(default_factory=dict)

    def beat(self, status: NodeStatus, now: float) -> None:
        self.heard[status.node_id] = Heard(status, now)

    def snapshot(
        self, now: float, wall_now: float, served: Sequence[Served], gateway: dict[str, Any]
    ) -> dict[str, Any]:
        """The status document (``now`` monotonic, ``wall_now`` seconds since the epoch)."""
        for node_id in [n for n, h in self.heard.items() if now - h.at > FORGET_AFTER_S]:
            del self.heard[node_id]
        heard = sorted(self.heard.values(), key=lambda h: (_ROLES.get(h.status.role, 9),
                                                            h.status.node_id))  # fmt: skip
        ratios, figures = self._saturation(now)
        return {
            "generated_at": round(wall_now, 3),
            "gateway": gateway,
            "saturation": {role: _ratio(figures.get(role)) for role in _SCALED},
            "nodes": [self._node(h, now, ratios) for h in heard],
            "tiers": [t for h in heard for t in _tiers(h.status)],
            "cache": cache_history(served, wall_now),
            "requests": [_request(s) for s in list(served)[-RECENT_REQUESTS:][::-1]],
        }

    def _saturation(self, now: float) -> tuple[dict[str, float], dict[str, float]]:
        """The nodes' and the roles' saturation as the scheduler heard last says them, unless
        it is silent (then none: its figures would be of a cluster gone by)."""
        schedulers = [
            h
            for h in self.heard.values()
            if h.status.role == "scheduler" and now - h.at <= self.heartbeat_timeout_s
        ]
        latest = max(schedulers, key=lambda h: h.at, default=None)
        if latest is None:
            return {}, {}
        return latest.status.saturation, latest.status.role_saturation

    def _node(self, heard: Heard, now: float, ratios: dict[str, float]) -> dict[str, Any]:
        s, silent = heard.status, now - heard.at
        used = max(s.total_blocks - s.free_blocks, 0)
        return {
            "id": s.node_id,
            "role": s.role,
            "health": _health(s, silent > self.heartbeat_timeout_s),
            "last_seen_s": round(silent, 1),
            "running_seqs": s.running_seqs,
            "queued_tokens": s.queued_tokens,
            "pool_used_blocks": used,
            "pool_total_blocks": s.total_blocks,
            "pool_use": round(used / s.total_blocks, 4) if s.total_blocks else None,
            "saturation": _ratio(ratios.get(s.node_id)),
        }


#: The roles with a saturation figure.
_SCALED = ("prefill", "decode")
_ROLES = {"gateway": 0, "scheduler": 1, "prefill": 2, "decode": 3, "tierd": 4, "kvindex": 5}


def _ratio(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _health(status: NodeStatus, silent: bool) -> str:
    if silent:
        return "silent"
    if not status.healthy:
        return "unhealthy"
    return "draining" if status.draining else "ok"


def _tiers(status: NodeStatus) -> list[dict[str, Any]]:
    out = []
    for tier, (capacity, used) in sorted(status.tiers.items()):
        out.append(
            {
                "node": status.node_id,
                "tier": tier,
                "used_bytes": used,
                "capacity_bytes": capacity,
                "use": round(used / capacity, 4) if capacity else None,
            }
        )
    return out


def cache_history(served: Sequence[Served], wall_now: float) -> dict[str, Any]:
    """The share of prompt tokens found in the cache, overall and per ``HISTORY_STEP_S`` of the
    last ``HISTORY_POINTS`` steps (steps without requests are left out)."""
    oldest = wall_now - HISTORY_STEP_S * HISTORY_POINTS
    points: dict[int, list[int]] = {}
    for s in served:
        if s.ended_at < oldest:
            continue
        step = int(s.ended_at // HISTORY_STEP_S)
        sums = points.setdefault(step, [0, 0])
        sums[0] += s.prompt_tokens
        sums[1] += s.cached_tokens
    history = [
        {"t": step * HISTORY_STEP_S, "prompt_tokens": p, "cached_tokens": c,
         "hit_ratio": round(c / p, 4) if p else 0.0}
        for step, (p, c) in sorted(points.items())
    ]  # fmt: skip
    prompt = sum(p["prompt_tokens"] for p in history)
    cached = sum(p["cached_tokens"] for p in history)
    return {
        "step_s": HISTORY_STEP_S,
        "window_s": HISTORY_STEP_S * HISTORY_POINTS,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_ratio": round(cached / prompt, 4) if prompt else None,
        "history": history,
    }


def _request(s: Served) -> dict[str, Any]:
    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000, 1)

    return {
        "ended_at": round(s.ended_at, 3),
        "ttft_ms": ms(s.ttft_s),
        "tpot_ms": ms(s.tpot_s),
        "e2e_ms": ms(s.e2e_s),
        "prompt_tokens": s.prompt_tokens,
        "cached_tokens": s.cached_tokens,
    }
