"""Several hosts without Kubernetes, each a network namespace (``tests/chaos/multihost.py``):
host A runs NATS, cachemeta on Postgres, kvindex, the scheduler and the gateway; host B a
prefill node and its tierd; host C a decode node and its tierd; host D a second decode node.
Every service is started with ``crescent serve`` from one secrets folder, as docs/operations.md
lays out, once with KV moving over UCX (its TCP transport on the veth links) and once over
Crescent's TCP transport.

Requests come back as one engine computes them on one host; their KV crossed the links (the
decode nodes' received bytes grow, the links carried at least as much, and the gateway saw each
hand-off); and a decode host whose link is cut mid-stream is a dead node: every stream finishes
on the other decode host as a fault-free run does.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from bench import netns
from bench.faults import Outcome, stream, tally
from shared.cluster_messages import NodeStatus
from shared.model.tokenizer import Tokenizer
from tests.chaos import multihost
from tests.chaos.multihost import (
    HOST_A,
    HOSTS,
    Beats,
    Host,
    Reply,
    Services,
    chats,
    one_host,
    stories,
)
from tests.conftest import RealEngineFactory
from tests.e2e.disaggregated import scrape, total
from tests.support.loop import BackgroundLoop
from tests.support.nats import free_port
from tests.support.postgres import fresh_database, reachable, sqlalchemy_url
from tests.support.wait import wait_until

_WHY = netns.supported(multihost.PROBE)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_WHY is not None, reason=str(_WHY)),
]

B, C, D = HOSTS["b"], HOSTS["c"], HOSTS["d"]
#: Each model node: its role and its host. Hosts B and C run a tierd too.
NODES = {"prefill-0": ("prefill", B), "decode-0": ("decode", C), "decode-1": ("decode", D)}
DECODE_NODES = ("decode-0", "decode-1")
TIERD_HOSTS = (B, C)
SLOTS = {
    "CRESCENT_GATEWAY_SLOTS": "1",
    "CRESCENT_SCHEDULER_SLOTS": "1",
    "CRESCENT_PREFILL_SLOTS": "1",
    "CRESCENT_DECODE_SLOTS": "2",
}


def settings(cache_dir: Path) -> dict[str, str]:
    """What every service of the test shares: production mode (the folder's secrets are
    checked as a deployment's), one model cache, quick heartbeats, and every request
    prefilled on host B and handed over, so its KV crosses a link."""
    return {
        "CRESCENT_DEV_MODE": "false",
        "CRESCENT_CACHE_DIR": str(cache_dir),
        "CRESCENT_KV_CACHE_MB": "256",
        "CRESCENT_HEARTBEAT_INTERVAL_S": "0.5",
        "CRESCENT_DRAIN_TIMEOUT_S": "5",
        # The machine is shared with other work that may starve these processes for seconds:
        # bounds wide enough that only the cut link makes a node dead.
        "CRESCENT_HEARTBEAT_TIMEOUT_S": "10",
        "CRESCENT_HANDOFF_TIMEOUT_S": "10",
        "CRESCENT_GATEWAY_CHECK_S": "5",
        "CRESCENT_LOCAL_PREFILL": "false",
        # UCX over TCP alone: between namespaces of one machine its shared memory would
        # reach across, and the KV would never cross a link.
        "UCX_TLS": "tcp,self",
        "UCX_WARN_UNUSED_ENV_VARS": "n",
    }


@dataclass
class HostA:
    """Host A's servers, and a client and a heartbeat listener of the deployment."""

    services: Services
    nats_url: str
    cachemeta_url: str
    api: str
    loop: BackgroundLoop
    beats: Beats
    client: AsyncOpenAI
    model: str

    def run(self, coro: Any, timeout_s: float = 300) -> Any:
        try:
            return self.loop.run(coro, timeout_s)
        except Exception as exc:
            exc.add_note(self.services.logs())
            raise


@pytest.fixture(scope="module")
def host_a(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[HostA]:
    if not reachable():
        pytest.skip("no Postgres on 127.0.0.1:5432")
    root = tmp_path_factory.mktemp("multihost")
    env = dict(os.environ) | settings(cache_dir)
    make = [sys.executable, "-m", "crescent", "serve", "secrets", str(root / "secrets")]
    subprocess.run(make, env=env | SLOTS, check=True, capture_output=True)
    with multihost.network(), fresh_database("crescent_multihost") as database:
        services = Services(root, root / "secrets", env)
        loop, beats = BackgroundLoop(), Beats()
        try:
            yield _start_host_a(services, loop, beats, sqlalchemy_url(database))
        finally:
            loop.run(beats.close())
            services.stop()
            loop.close()


def _start_host_a(services: Services, loop: BackgroundLoop, beats: Beats, db_url: str) -> HostA:
    nats_url = services.nats()
    port = free_port()
    own = {"CRESCENT_CACHEMETA_PORT": str(port), "CRESCENT_DB_URL": db_url}
    services.serve("cachemeta", "cachemeta", None, "--address", HOST_A, env=own)
    services.listening("cachemeta", HOST_A, port)
    cachemeta_url = f"{HOST_A}:{port}"
    dial = ("--nats-url", nats_url, "--cachemeta-url", cachemeta_url)
    kvindex = {"CRESCENT_KVINDEX_PORT": str(free_port())}
    services.serve("kvindex", "kvindex", None, "--nats-url", nats_url, env=kvindex)
    services.serve("scheduler-0", "scheduler", None, *dial)
    api_port = free_port()
    gateway = ("--nats-url", nats_url, "--address", "127.0.0.1")
    services.serve("gateway-0", "gateway", None, *gateway, env={"CRESCENT_PORT": str(api_port)})
    loop.run(beats.start(nats_url, services.secrets))
    services.listening("gateway-0", "127.0.0.1", api_port)
    api = f"http://127.0.0.1:{api_port}"
    key = (services.secrets / "api-key").read_text().strip()
    client = AsyncOpenAI(base_url=f"{api}/v1", api_key=key, max_retries=0, timeout=300)
    model = loop.run(_model_name(client))
    return HostA(services, nats_url, cachemeta_url, api, loop, beats, client, model)


async def _model_name(client: AsyncOpenAI) -> str:
    return (await client.models.list()).data[0].id


@pytest.fixture(scope="module", params=["ucx", "tcp"])
def transfer(request: pytest.FixtureRequest, host_a: HostA) -> Iterator[str]:
    """Hosts B, C and D serving, their KV moving by ``request.param``."""
    kind: str = request.param
    services = host_a.services
    dial = ("--nats-url", host_a.nats_url, "--cachemeta-url", host_a.cachemeta_url)
    started = []
    for host in TIERD_HOSTS:
        started.append(f"tierd-{host.name}-{kind}")
        flags = ("--host-id", host.name, "--address", host.address, *dial)
        services.serve(started[-1], "tierd", host, *flags, env=_host_env(host, kind))
    for node, (role, host) in NODES.items():
        started.append(f"{node}-{kind}")
        flags = ("--node-id", node, "--host-id", host.name, "--address", host.address, *dial)
        services.serve(started[-1], role, host, *flags, env=_host_env(host, kind))
    try:
        for node in NODES:
            host_a.run(host_a.beats.until(node, _serving(kind), f"serving over {kind}"), 300)
        wait_until(lambda: _ready(host_a.api), "the gateway ready", 300)
        yield kind
    finally:
        for host in (B, C, D):
            netns.set_link(host.link, up=True)
        services.stop(*started)


def _host_env(host: Host, kind: str) -> dict[str, str]:
    return {"CRESCENT_TRANSFER": kind, "UCX_NET_DEVICES": host.interface}


def _serving(kind: str) -> Callable[[NodeStatus], bool]:
    return lambda s: s.healthy and not s.draining and s.transfer_kind == kind


def _ready(api: str) -> bool:
    try:
        return httpx.get(f"{api}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def debug_view(host_a: HostA, reply: Reply) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {host_a.client.api_key}"}
    got = httpx.get(f"{host_a.api}/debug/requests/{reply.id}", headers=headers, timeout=10)
    got.raise_for_status()
    view: dict[str, Any] = got.json()
    return view


def test_requests_are_served_as_on_one_host_with_their_kv_pulled_across_hosts(
    transfer: str, host_a: HostA, make_real_engine: RealEngineFactory, tokenizer: Tokenizer
) -> None:
    prompts, max_tokens = stories(4), 24
    expected = one_host(make_real_engine, tokenizer, prompts, max_tokens)
    beats = host_a.beats
    received = {n: beats.value(n, lambda s: s.kv_bytes_received) for n in NODES}
    carried = {n: netns.link_bytes(host.link, "tx") for n, (_, host) in NODES.items()}

    replies = host_a.run(chats(host_a.client, host_a.model, prompts, max_tokens))

    assert [r.error for r in replies] == [None] * len(prompts), host_a.services.logs()
    assert [r.text for r in replies] == expected
    views = [debug_view(host_a, r) for r in replies]
    for view in views:
        assert view["placed"]["prefill_node"] == "prefill-0", view
        assert view["placed"]["decode_node"] in ("decode-0", "decode-1"), view
        assert "kv_handoff" in view["phases_s"], view
    for node in {v["placed"]["decode_node"] for v in views}:
        before = received[node]
        more = f"KV bytes received over {transfer} beyond {before}"
        host_a.run(beats.until(node, lambda s, b=before: s.kv_bytes_received > b, more))
        pulled = beats.value(node, lambda s: s.kv_bytes_received) - before
        # What the node pulled came in over its host's link (the bridge's end sends it).
        assert netns.link_bytes(NODES[node][1].link, "tx") - carried[node] >= pulled


#: Streams in flight when a decode host's link goes down: long enough to be mid-way then.
CUT_STREAMS, CUT_TOKENS = 6, 160
MIGRATIONS = "crescent_gateway_request_migrations_total"


def test_a_cut_link_is_a_dead_node_whose_streams_finish_on_the_other_decode_host(
    transfer: str, host_a: HostA, tokenizer: Tokenizer
) -> None:
    prompts, beats = stories(CUT_STREAMS), host_a.beats
    moved_before = total(scrape(f"{host_a.api}/metrics")[1], MIGRATIONS)
    cut: list[Host] = []

    async def cut_the_busiest() -> int:
        busiest = await beats.busiest(DECODE_NODES, "streams on a decode host")
        cut.append(NODES[busiest][1])
        netns.set_link(cut[0].link, up=False)  # nothing closes: the host just goes silent
        return beats.value(busiest, _running)

    async def streams_through_a_cut() -> tuple[list[Outcome], int]:
        client, model = host_a.client, host_a.model
        live = [stream(client, model, p, CUT_TOKENS) for p in prompts]
        *outcomes, were_on_it = await asyncio.gather(*live, cut_the_busiest())
        return outcomes, were_on_it

    try:
        outcomes, were_on_it = host_a.run(streams_through_a_cut())
    finally:
        for host in cut:
            netns.set_link(host.link, up=True)
    moved = total(scrape(f"{host_a.api}/metrics")[1], MIGRATIONS) - moved_before
    fault_free = host_a.run(_fault_free(host_a, prompts))

    got = tally(f"{cut[0].name} cut off ({transfer})", outcomes, fault_free, _ids(tokenizer))
    assert got.errors == () and got.completed == got.sent == CUT_STREAMS, got
    assert (got.duplicated, got.missing) == (0, 0), got
    # Every stream the silent host ran moved to the other decode host.
    assert moved >= were_on_it > 0


def _running(status: NodeStatus) -> int:
    return status.running_seqs


async def _fault_free(host_a: HostA, prompts: list[str]) -> list[Outcome]:
    client, model = host_a.client, host_a.model
    outcomes = await asyncio.gather(*(stream(client, model, p, CUT_TOKENS) for p in prompts))
    assert all(o.completed for o in outcomes), [o.error for o in outcomes]
    return list(outcomes)


def _ids(tokenizer: Tokenizer) -> Any:
    return lambda text: tokenizer.encode(text, add_special_tokens=False)
