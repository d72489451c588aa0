"""Faults against a live stack, each injected for real, and what they cost the clients.

Starts ``crescent up --prefill 2 --decode 2 --schedulers 2`` (which restarts what dies), then
for each fault: runs greedy streaming requests, injects the fault mid-flight (SIGKILL,
SIGTERM, a restarted NATS server), waits until every request ended and the stack is whole
again, and runs the same requests once more without a fault. A request counts as completed
when it finished normally; its tokens are compared with the fault-free run's (duplicated or
missing tokens; where an output parts from the fault-free run's at a near tie, fp32 sums in
another order, it is compared up to there and counted under near ties); recovery is the longest
any stream waited for its next token.

    .venv/bin/python bench/chaos.py [--faults decode_killed prefill_killed ...] [--transfer ucx]

Prints one table row per fault (the table in docs/reliability.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openai import AsyncOpenAI

from bench.faults import Outcome, Stack, Tally, stream, tally
from shared import subjects
from shared.bus import NatsBus
from shared.cluster_messages import NodeStatus
from shared.tls import TlsSettings

NODES = ("prefill-0", "prefill-1", "decode-0", "decode-1")
STACK_ARGS = ("--prefill", "2", "--decode", "2", "--schedulers", "2")


def stack_env(cache_dir: Path, transfer: str) -> dict[str, str]:
    return {
        "CRESCENT_CACHE_DIR": str(cache_dir),
        "CRESCENT_TRANSFER": transfer,
        "CRESCENT_KV_CACHE_MB": "384",
        "CRESCENT_HEARTBEAT_INTERVAL_S": "0.5",
        "CRESCENT_DRAIN_TIMEOUT_S": "10",
        # The faults are injected into the disaggregated path (a prefill node that dies
        # mid-prefill, a hand-off cut off), so every request takes it.
        "CRESCENT_LOCAL_PREFILL": "false",
        "UCX_NET_DEVICES": "lo",
        "UCX_WARN_UNUSED_ENV_VARS": "n",
    }


class Beats:
    """The latest heartbeat of every node, heard as the stack's ``tools`` user."""

    def __init__(self) -> None:
        self.latest: dict[str, tuple[float, NodeStatus]] = {}
        self.bus: NatsBus | None = None

    async def start(
        self, stack: Stack, auth: dict[str, str] | None = None, tls: TlsSettings | None = None
    ) -> None:
        """Listens as the stack's ``tools`` user, or with ``auth`` (a NATS of one's own);
        ``tls``: the stack's TLS files (default: this process's environment)."""
        where = json.loads((stack.data_dir / "stack.json").read_text())
        if auth is None:
            password = (stack.data_dir / "secrets" / "nats-tools.password").read_text().strip()
            auth = {"user": "tools", "password": password, "inbox_prefix": "_INBOX.tools"}
        # NATS restarts are one of the faults: its reconnection errors are expected here.
        self.bus = await NatsBus.connect(
            where["nats_url"], "crescent-chaos", tls=tls, error_cb=_quiet, **auth
        )

        async def on_beat(status: NodeStatus) -> None:
            self.latest[status.node_id] = (time.monotonic(), status)

        await self.bus.subscribe(subjects.HEARTBEATS_ALL, NodeStatus, on_beat)

    def busiest(self, role: str, key: Callable[[NodeStatus], int]) -> str:
        nodes = [s for _, s in self.latest.values() if s.role == role]
        return max(nodes, key=key).node_id

    async def fresh(self, node_ids: Sequence[str], since: float, timeout_s: float = 120) -> None:
        """Waits until each node heartbeats as healthy after ``since``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._fresh(n, since) for n in node_ids):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"nodes did not come back: {node_ids}")

    def _fresh(self, node_id: str, since: float) -> bool:
        seen = self.latest.get(node_id)
        return seen is not None and seen[0] > since and seen[1].healthy and not seen[1].draining

    async def close(self) -> None:
        if self.bus is not None:
            await self.bus.close()


async def _quiet(exc: Exception) -> None:
    return


@dataclass
class Harness:
    stack: Stack
    client: AsyncOpenAI
    model: str
    beats: Beats
    tokens: Callable[[str], list[int]]

    async def run(self, prompts: Sequence[str], max_tokens: int) -> list[Outcome]:
        return list(await asyncio.gather(*(self.stream(p, max_tokens) for p in prompts)))

    async def stream(self, prompt: str, max_tokens: int) -> Outcome:
        return await stream(self.client, self.model, prompt, max_tokens)

    async def compare(
        self, fault: str, prompts: Sequence[str], outcomes: Sequence[Outcome], max_tokens: int
    ) -> Tally:
        """The outcomes against a fault-free run of the same prompts."""
        expected = await self.run(prompts, max_tokens)
        bad = [o.error for o in expected if not o.completed]
        if bad:
            raise RuntimeError(f"the fault-free run failed after {fault}: {bad}")
        return tally(fault, outcomes, expected, self.tokens)

    async def restarted(self, names: Sequence[str], since: float) -> None:
        nodes = [n for n in names if n in NODES]
        await self.beats.fresh(nodes, since)


def stories(count: int) -> list[str]:
    """Fresh prompts: a random tag keeps them out of every cache."""
    tag = random.randrange(10**9)
    topics = ("a cat", "a lighthouse", "a robot", "a river", "a violin", "a desert", "a train")
    return [
        f"[{tag}-{i}] Write a long story about {topics[i % len(topics)]}." for i in range(count)
    ]


def long_prompt() -> str:
    tag = random.randrange(10**9)
    facts = " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(120))
    return f"[{tag}] {facts} Which of these facts is the most surprising, and why?"


class Live:
    """Streams started at once, whose outcomes can be watched while they run."""

    def __init__(self, harness: Harness, prompt_list: Sequence[str], max_tokens: int) -> None:
        self.outcomes = [Outcome(started=time.monotonic()) for _ in prompt_list]
        self.tasks = [
            asyncio.create_task(self._one(harness, p, max_tokens, i))
            for i, p in enumerate(prompt_list)
        ]

    async def _one(self, harness: Harness, prompt: str, max_tokens: int, i: int) -> Outcome:
        out = await harness.stream(prompt, max_tokens)
        self.outcomes[i] = out
        return out

    async def done(self, timeout_s: float = 180) -> list[Outcome]:
        return list(await asyncio.wait_for(asyncio.gather(*self.tasks), timeout_s))


async def decode_killed(h: Harness) -> Tally:
    """SIGKILL of the decode node serving the most of four concurrent streams."""
    ps, max_tokens = stories(4), 96
    live = Live(h, ps, max_tokens)
    await asyncio.sleep(2.0)
    victim = h.beats.busiest("decode", lambda s: s.running_seqs)
    since = time.monotonic()
    h.stack.kill(victim)
    outcomes = await live.done()
    await h.restarted([victim], since)
    return await h.compare(f"decode node killed ({victim})", ps, outcomes, max_tokens)


async def prefill_killed(h: Harness) -> Tally:
    """SIGKILL of the prefill node computing a long prompt, beside two short requests."""
    ps, max_tokens = [long_prompt(), *stories(2)], 48
    live = Live(h, ps, max_tokens)
    victim = await _prefilling(h, min_tokens=800)
    since = time.monotonic()
    h.stack.kill(victim)
    outcomes = await live.done()
    await h.restarted([victim], since)
    return await h.compare(f"prefill node killed mid-prefill ({victim})", ps, outcomes, max_tokens)


async def _prefilling(h: Harness, min_tokens: int, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = [
            s.node_id
            for _, s in h.beats.latest.values()
            if s.role == "prefill" and s.queued_tokens >= min_tokens
        ]
        if busy:
            return busy[0]
        await asyncio.sleep(0.05)
    raise TimeoutError("no prefill node reported the long prompt")


async def scheduler_killed(h: Harness) -> Tally:
    """SIGKILL of one of two schedulers while requests keep arriving."""
    ps, max_tokens = stories(12), 24
    tasks, old = [], 0
    for i, prompt in enumerate(ps):
        tasks.append(asyncio.create_task(h.stream(prompt, max_tokens)))
        if i == 4:
            old = h.stack.kill("scheduler-0")
        await asyncio.sleep(0.2)
    outcomes = list(await asyncio.gather(*tasks))
    await asyncio.to_thread(h.stack.wait_replaced, "scheduler-0", old)
    return await h.compare("scheduler killed and restarted", ps, outcomes, max_tokens)


async def nats_restarted(h: Harness) -> Tally:
    """SIGKILL of the NATS server with four streams in flight (crescent up starts it again)."""
    ps, max_tokens = stories(4), 96
    live = Live(h, ps, max_tokens)
    await asyncio.sleep(2.0)
    since = time.monotonic()
    h.stack.kill("nats")
    outcomes = await live.done()
    await h.restarted(NODES, since)
    return await h.compare("NATS restarted mid-stream", ps, outcomes, max_tokens)


#: Streams the rolling restart's load keeps in flight at most.
ROLLING_IN_FLIGHT = 8


async def rolling_restart(h: Harness) -> Tally:
    """SIGTERM of every prefill and decode node in turn, each after the last came back,
    under a steady load of requests: one every 0.5 s, at most ``ROLLING_IN_FLIGHT`` at once
    (so a machine slower than the load does not pile up a backlog the fault did not cause)."""
    max_tokens = 48
    sent: list[str] = []
    tasks: list[asyncio.Task[Outcome]] = []
    stop = asyncio.Event()

    async def load() -> None:
        while not stop.is_set():
            if sum(not t.done() for t in tasks) >= ROLLING_IN_FLIGHT:
                await asyncio.sleep(0.1)
                continue
            (prompt,) = stories(1)
            sent.append(prompt)
            tasks.append(asyncio.create_task(h.stream(prompt, max_tokens)))
            await asyncio.sleep(0.5)

    loader = asyncio.create_task(load())
    for name in NODES:
        await asyncio.sleep(1.0)
        since = time.monotonic()
        h.stack.kill(name, signal.SIGTERM)
        await h.restarted([name], since)
    stop.set()
    await loader
    outcomes = list(await asyncio.gather(*tasks))
    return await h.compare("rolling restart of all nodes", sent, outcomes, max_tokens)


async def ucx_peer_killed(h: Harness) -> Tally:
    """SIGKILL of a prefill node the moment its first token is out, while the decode node
    pulls the long prompt's KV from it: the puller must live."""
    ps, max_tokens = [long_prompt(), long_prompt()], 32
    pullers = {n: pid for n, pid in h.stack.children().items() if n.startswith("decode")}
    live = Live(h, ps, max_tokens)
    victim = await _prefilling(h, min_tokens=800)
    while not any(o.arrivals for o in live.outcomes) and not all(t.done() for t in live.tasks):
        await asyncio.sleep(0.002)
    since = time.monotonic()
    h.stack.kill(victim)
    outcomes = await live.done()
    await h.restarted([victim], since)
    after = {n: pid for n, pid in h.stack.children().items() if n.startswith("decode")}
    if after != pullers:
        raise RuntimeError(f"a pulling decode node died with its peer: {pullers} -> {after}")
    return await h.compare(f"KV peer killed mid-pull ({victim})", ps, outcomes, max_tokens)


async def gateway_killed(h: Harness) -> float:
    """SIGKILL of the gateway with four long streams in flight: the seconds until no node
    runs them any more (nobody is left to read their tokens)."""
    ps = stories(4)
    tasks = [asyncio.create_task(h.stream(p, 400)) for p in ps]
    await asyncio.sleep(2.0)
    old = h.stack.kill("gateway")
    killed = time.monotonic()
    await asyncio.gather(*tasks)
    while any(s.running_seqs for _, s in h.beats.latest.values() if s.role == "decode"):
        if time.monotonic() - killed > 60:
            raise TimeoutError("the nodes still run the dead gateway's requests")
        await asyncio.sleep(0.1)
    stopped = time.monotonic() - killed
    await asyncio.to_thread(h.stack.wait_replaced, "gateway", old)
    await _ready(h)
    return stopped


async def _ready(h: Harness, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            await h.client.models.list()
            return
        except Exception:
            await asyncio.sleep(0.2)
    raise TimeoutError("the gateway did not come back")


FAULTS: dict[str, Callable[[Harness], Awaitable[Tally]]] = {
    "decode_killed": decode_killed,
    "prefill_killed": prefill_killed,
    "scheduler_killed": scheduler_killed,
    "nats_restarted": nats_restarted,
    "rolling_restart": rolling_restart,
    "ucx_peer_killed": ucx_peer_killed,
}


async def open_harness(
    stack: Stack,
    nodes: Sequence[str] = NODES,
    nats_auth: dict[str, str] | None = None,
    tls: TlsSettings | None = None,
) -> Harness:
    from shared.model.files import resolve_model
    from shared.model.tokenizer import Tokenizer

    cache_dir = Path(os.environ.get("CRESCENT_CACHE_DIR", Path.home() / ".cache" / "crescent"))
    tokenizer = Tokenizer.from_dir(resolve_model(None, cache_dir).path)
    client = AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=180)
    model = (await client.models.list()).data[0].id
    beats = Beats()
    await beats.start(stack, nats_auth, tls)
    await beats.fresh(nodes, 0.0)

    def tokens(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    return Harness(stack, client, model, beats, tokens)


def table(rows: Sequence[Tally]) -> str:
    head = (
        "| fault | sent | completed | failed | duplicated tokens | missing tokens | near ties "
        "| recovery |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for t in rows:
        lines.append(
            f"| {t.fault} | {t.sent} | {t.completed} | {t.failed} | {t.duplicated} | "
            f"{t.missing} | {t.ties} | {t.recovery_s:.2f} s |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    cache_dir = Path(os.environ.get("CRESCENT_CACHE_DIR", Path.home() / ".cache" / "crescent"))
    with tempfile.TemporaryDirectory(prefix="crescent-chaos-") as tmp:
        env = stack_env(cache_dir, args.transfer)
        stack = Stack.start(Path(tmp), env, STACK_ARGS)
        harness = await open_harness(stack)
        rows, notes = [], []
        try:
            for name in args.faults:
                if name == "gateway_killed":
                    seconds = await gateway_killed(harness)
                    notes.append(
                        f"gateway killed: its requests stopped on the nodes in {seconds:.2f} s"
                    )
                    print(notes[-1], flush=True)
                    continue
                row = await FAULTS[name](harness)
                rows.append(row)
                print(table([row]).splitlines()[-1], *row.errors, flush=True)
        finally:
            await harness.beats.close()
            await harness.client.close()
            stack.stop()
    print()
    print(table(rows))
    for note in notes:
        print(note)
    return 0 if all(r.clean for r in rows) else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    every = [*FAULTS, "gateway_killed"]
    parser.add_argument("--faults", nargs="+", default=every, choices=every)
    parser.add_argument("--transfer", default="ucx", choices=("ucx", "tcp"))
    sys.exit(asyncio.run(main_async(parser.parse_args())))


if __name__ == "__main__":
    main()
