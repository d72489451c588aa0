"""What the scheduler hears of the cluster, fed into its view: heartbeats (each on the subject
NATS lets only its node publish on) and the NATS server's disconnect advisories (by the
authenticated user, which is the node id)."""

from __future__ import annotations

import logging
import time

from services.scheduler.cluster import TIERD, ClusterView
from services.scheduler.recent import RecentPlacements
from services.scheduler.saturation import DecodeSteps
from services.scheduler.wire import node_load
from shared import subjects
from shared.cluster_messages import NodeStatus
from shared.nats_events import disconnected_node

log = logging.getLogger(__name__)
#: The roles whose heartbeats the view takes: prefill and decode nodes take work and serve
#: pulls from their pools; a tierd only serves pulls from its tiers.
VIEWED_ROLES = ("prefill", "decode", TIERD)


class ClusterFeed:
    """Keeps the view (and the recent placements) in step with what the bus says.

    Owns the set of nodes already warned about a different cache secret, and the decode
    nodes' recent steps (``steps``: their time between tokens, for the saturation gauges).
    Invariant: a heartbeat counts only when its node id and role are the ones its subject
    names.
    """

    def __init__(
        self, view: ClusterView, recent: RecentPlacements, secret_fingerprint: str = ""
    ) -> None:
        self.view = view
        self.recent = recent
        self.secret_fingerprint = secret_fingerprint
        self._warned_secret: set[str] = set()
        self.steps = DecodeSteps()

    async def on_heartbeat(self, subject: str, status: NodeStatus) -> None:
        if status.role not in VIEWED_ROLES:
            return
        if subject != subjects.heartbeats(status.role, status.node_id):
            log.warning("dropped a heartbeat of %s sent on %s", status.node_id, subject)
            return
        self._check_secret(status)
        now = time.monotonic()
        known = self.view.nodes.get(status.node_id)
        if known is not None and known.epoch != status.epoch:
            self.recent.forget(status.node_id)  # a restarted node's pool starts empty
        self.view.update(node_load(status, now), status.arrived if status.role == "decode" else ())
        if status.role != TIERD:  # a tierd runs no engine: no steps to time, no TTFTs
            self.view.timing.add(status.node_id, status.role, status.step_samples)
            self.view.calibration.add(status.node_id, status.ttft_samples, now)
        if status.role == "decode":
            self.view.handoffs.add(status.handoff_samples)
            self.steps.add(status.node_id, status.step_samples, now)
        self.view.forget_dead(now)

    def _check_secret(self, status: NodeStatus) -> None:
        mine, theirs = self.secret_fingerprint, status.secret_fingerprint
        if mine and theirs and mine != theirs and status.node_id not in self._warned_secret:
            self._warned_secret.add(status.node_id)
            log.error(
                "node %s uses another cache secret than this scheduler: its blocks will never "
                "match the prefixes placements look up (set the same CRESCENT_CACHE_SECRET)",
                status.node_id,
            )

    async def on_disconnect(self, data: bytes) -> None:
        """A node's NATS connection closed: it takes no work from now on (a restarted node
        comes back with its next heartbeat)."""
        node_id = disconnected_node(data)
        node = self.view.nodes.get(node_id) if node_id else None
        if node is not None:
            log.warning("node %s disconnected from NATS", node_id)
            self.recent.forget(node.node_id)
            node.disconnected = True
            node.last_seen = min(
                node.last_seen, time.monotonic() - self.view.heartbeat_timeout_s - 1
            )
