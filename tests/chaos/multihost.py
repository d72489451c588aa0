"""Hosts made on one machine for ``test_multihost.py``: host A is this network namespace, hosts
B, C and D are namespaces of their own, each joined to a bridge on host A by a veth pair, so
everything between two hosts crosses a link that can be cut (``bench/netns.py``).

Every service is started as an operator would on its host: ``crescent serve ROLE`` with the
deployment's secrets folder (``crescent serve secrets``), the addresses of host A's servers and
the host's own address, inside ``ip netns exec`` for B, C and D. The names and the 10.78.0.0/24
subnet are this test's own (``bench/partition.py`` uses others, so both can run at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from openai import AsyncOpenAI

from bench import netns
from bench.faults import collect_logs
from shared import subjects
from shared.bus import NatsBus
from shared.cluster_messages import NodeStatus
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams
from shared.tls import TlsSettings
from tests.conftest import RealEngineFactory
from tests.support.nats import free_port, nats_server_binary
from tests.support.wait import wait_for_condition, wait_until

BRIDGE = "cr-mh-br"
HOST_A = "10.78.0.1"
PROBE = "crescent-mh-probe"


@dataclass(frozen=True)
class Host:
    """A host in a namespace: its name (also its host id) and its address on the bridge."""

    name: str
    address: str

    @property
    def namespace(self) -> str:
        return f"crescent-mh-{self.name}"

    @property
    def link(self) -> str:
        """The host end of its veth pair: down, the host is cut off."""
        return f"cr-mh-{self.name}"

    @property
    def interface(self) -> str:
        """Its end of the pair, the one interface UCX may use there."""
        return f"cr-mh-{self.name}-in"


HOSTS = {name: Host(name, f"10.78.0.{i}") for i, name in enumerate("bcd", start=2)}


@contextlib.contextmanager
def network() -> Iterator[None]:
    """The bridge on host A (``HOST_A``) and hosts B, C and D linked to it."""
    with netns.bridge(BRIDGE, f"{HOST_A}/24"), contextlib.ExitStack() as links:
        for host in HOSTS.values():
            links.enter_context(netns.namespace(host.namespace))
            netns.veth(
                host.link, host.namespace, host.interface, f"{host.address}/24",
                outer=f"bridge:{BRIDGE}",
            )  # fmt: skip
            # Deleting a namespace frees its links only later: the host ends go first, now.
            links.callback(netns.remove_link, host.link)
        yield


@dataclass
class Services:
    """The processes of every host, each logging to ``root/logs/<name>.log``. Invariant: a
    process started here is stopped by ``stop`` (SIGTERM, then SIGKILL)."""

    root: Path
    secrets: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with (self.root / "logs" / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                argv, env=self.env | (env or {}), stdout=log, stderr=subprocess.STDOUT
            )

    def serve(
        self,
        name: str,
        role: str,
        host: Host | None,
        *flags: str,
        env: dict[str, str] | None = None,
    ) -> None:
        """``crescent serve role`` on ``host`` (None: host A) with the secrets folder."""
        argv = [sys.executable, "-m", "crescent", "serve", role, "--secrets", str(self.secrets)]
        argv += [*flags, "--data-dir", str(self.root / (host.name if host else "a"))]
        self.start(name, netns.inside(host.namespace, argv) if host else argv, env)

    def nats(self) -> str:
        """NATS with the folder's configuration, on host A's bridge address (the machine's
        own server keeps 4222); returns its URL."""
        port = free_port()
        config = str(self.secrets / "nats-config")
        argv = [str(nats_server_binary()), "-c", config, "-a", HOST_A, "-p", str(port)]
        self.start("nats", [*argv, "-m", str(free_port())])
        self.listening("nats", HOST_A, port)
        return f"nats://{HOST_A}:{port}"

    def running(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def listening(self, name: str, host: str, port: int, timeout_s: float = 300) -> None:
        """Waits until ``name`` accepts connections at ``host:port``; fails at once, with the
        logs, if it exits first (``crescent serve`` refusing a setting, say)."""

        def up_or_gone() -> bool:
            return _listens(host, port) or not self.running(name)

        wait_until(up_or_gone, f"{name} listening at {host}:{port}", timeout_s)
        assert self.running(name), f"{name} exited\n{self.logs()}"

    def stop(self, *names: str) -> None:
        chosen = names or tuple(reversed(self.procs))
        for name in chosen:
            self.procs[name].send_signal(signal.SIGTERM)
        for name in chosen:
            proc = self.procs.pop(name)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def logs(self) -> str:
        return collect_logs(self.root)


def _listens(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


class Beats:
    """The latest heartbeat of every service, heard as the folder's ``tools`` user."""

    def __init__(self) -> None:
        self.latest: dict[str, NodeStatus] = {}
        self._bus: NatsBus | None = None

    async def start(self, url: str, secrets: Path) -> None:
        tls = secrets / "tls"
        settings = TlsSettings(
            tls="on", tls_ca_file=tls / "ca.pem", tls_cert_file=tls / "kvindex.pem",
            tls_key_file=tls / "kvindex.key", tls_server_name="crescent-internal",
        )  # fmt: skip
        password = (secrets / "nats-tools-password").read_text().strip()
        auth = {"user": "tools", "password": password, "inbox_prefix": "_INBOX.tools"}
        self._bus = await NatsBus.connect(url, "crescent-multihost", tls=settings, **auth)

        async def on_beat(status: NodeStatus) -> None:
            self.latest[status.node_id] = status

        await self._bus.subscribe(subjects.HEARTBEATS_ALL, NodeStatus, on_beat)

    def value(self, node_id: str, read: Callable[[NodeStatus], int]) -> int:
        status = self.latest.get(node_id)
        return 0 if status is None else read(status)

    async def until(
        self, node_id: str, holds: Callable[[NodeStatus], bool], what: str, timeout_s: float = 120
    ) -> None:
        """Waits for a heartbeat of ``node_id`` for which ``holds`` is true."""
        self.latest.pop(node_id, None)  # a beat from before the wait does not count

        def seen() -> bool:
            status = self.latest.get(node_id)
            return status is not None and holds(status)

        await wait_for_condition(seen, f"{node_id}: {what}", timeout_s)

    async def busiest(self, node_ids: Iterable[str], what: str, timeout_s: float = 120) -> str:
        """Waits until one of ``node_ids`` runs a sequence; returns the one running most."""
        nodes = list(node_ids)
        for node_id in nodes:
            self.latest.pop(node_id, None)

        def running() -> int:
            return sum(self.value(n, lambda s: s.running_seqs) for n in nodes)

        await wait_for_condition(lambda: running() > 0, what, timeout_s)
        return max(nodes, key=lambda n: self.value(n, lambda s: s.running_seqs))

    async def close(self) -> None:
        if self._bus is not None:
            await self._bus.close()


@dataclass
class Reply:
    """One streamed chat completion as its client saw it."""

    id: str = ""
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None


async def chat(client: AsyncOpenAI, model: str, prompt: str, max_tokens: int) -> Reply:
    """A greedy streamed chat completion; never raises (the error is in the reply)."""
    reply = Reply()
    try:
        chunks = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
            temperature=0, stream=True,
        )  # fmt: skip
        async for chunk in chunks:
            reply.id = chunk.id
            for choice in chunk.choices:
                reply.text += choice.delta.content or ""
                reply.finish_reason = choice.finish_reason or reply.finish_reason
    except Exception as exc:
        reply.error = f"{type(exc).__name__}: {exc}"
    return reply


async def chats(
    client: AsyncOpenAI, model: str, prompts: list[str], max_tokens: int
) -> list[Reply]:
    return list(await asyncio.gather(*(chat(client, model, p, max_tokens) for p in prompts)))


def stories(count: int) -> list[str]:
    """Prompts no cache holds yet: a random tag opens each."""
    tag = random.randrange(10**9)
    topics = ("a lighthouse", "a violin", "a desert", "a robot", "a river", "a train")
    return [f"[{tag}-{i}] Tell me a story about {topics[i % len(topics)]}." for i in range(count)]


def one_host(
    make_engine: RealEngineFactory, tokenizer: Tokenizer, prompts: list[str], max_tokens: int
) -> list[str]:
    """Each prompt's greedy answer from one engine on this host, one request at a time."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    answers = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        out = make_engine().generate([ids], params)[0]
        answers.append(tokenizer.decode(out.output_token_ids))
    return answers
