"""The stack's heartbeats as a test hears them, so that it waits for the beat it needs (a node
idle, a node computing, every node's metrics refreshed) instead of sleeping through a few
heartbeat intervals and hoping they passed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from shared import subjects
from shared.bus import NatsBus
from shared.cluster_messages import NodeStatus
from tests.e2e.stack import Stack
from tests.support.wait import wait_for_condition

Heard = dict[str, list[NodeStatus]]  # each node's statuses, in the order they arrived
TIMEOUT_S = 60.0  # heartbeats come every 0.5 s: this only bounds a hang


def nats_url(stack: Stack) -> str:
    """The NATS server of ``stack``, as `crescent up` lists it in stack.json."""
    url: str = json.loads((stack.data_dir / "stack.json").read_text())["nats_url"]
    return url


def model_nodes(stack: Stack) -> list[str]:
    """The prefill and decode nodes of ``stack``, from the services stack.json lists."""
    where = json.loads((stack.data_dir / "stack.json").read_text())
    return [name for name in where["metrics"] if name.startswith(("prefill-", "decode-"))]


async def heard_until(
    url: str, done: Callable[[Heard], bool], what: str, timeout_s: float = TIMEOUT_S
) -> Heard:
    """Listens to every heartbeat from now on until ``done`` holds for what was heard."""
    bus = await NatsBus.connect(url, "e2e-observer")
    heard: Heard = {}

    async def on_beat(status: NodeStatus) -> None:
        heard.setdefault(status.node_id, []).append(status)

    try:
        await bus.subscribe(subjects.HEARTBEATS_ALL, NodeStatus, on_beat)
        await wait_for_condition(lambda: done(heard), what, timeout_s)
    finally:
        await bus.close()
    return heard


def idle(status: NodeStatus) -> bool:
    return status.running_seqs == 0


def busy(status: NodeStatus) -> bool:
    return status.running_seqs > 0


async def fresh_heartbeats(url: str, nodes: Iterable[str]) -> dict[str, NodeStatus]:
    """Each of ``nodes``'s latest status once it has beaten twice from now on: the second
    beat was made after this call began, so it (and the metrics the node refreshed from it)
    counts everything done before."""
    wanted = list(nodes)

    def twice(heard: Heard) -> bool:
        return all(len(heard.get(node, [])) >= 2 for node in wanted)

    heard = await heard_until(url, twice, f"two heartbeats from each of {wanted}")
    return {node: heard[node][-1] for node in wanted}


async def next_beat(
    url: str, node: str, check: Callable[[NodeStatus], bool], what: str
) -> NodeStatus:
    """The first status of ``node`` heard from now on for which ``check`` holds."""

    def matched(heard: Heard) -> list[NodeStatus]:
        return [s for s in heard.get(node, []) if check(s)]

    heard = await heard_until(url, lambda h: bool(matched(h)), what)
    return matched(heard)[0]
