"""A real publisher's KV events against the catalogue it feeds: a decode node on the real
model serves prompts over a real NATS server and registers its pool in a real cachemeta
(Postgres). A consumer built only from the published format rebuilds, from the events alone,
the per-tier view cachemeta holds of the node, and kvindex's HTTP prefix query agrees with
cachemeta's own gRPC answer on the same prompts."""

from __future__ import annotations

import random
import uuid
from typing import Any

import asyncpg
import nats
import pytest
from nats.aio.msg import Msg

from services.decode.config import DecodeSettings
from services.decode.main import DecodeService
from shared import subjects
from shared.bus import NatsBus
from shared.cluster_messages import PrefillTask, TaskAck
from shared.kv.hashing import hash_full_blocks, root_hash, scope_salt
from shared.messages import GatewayCheck, GatewayCheckReply, TokenChunk
from tests.cachemeta.conftest import Postgres, Served, settings_for
from tests.conftest import RealEngineFactory
from tests.kvindex.conftest import running_index
from tests.kvindex.vllm_format import Rebuilt
from tests.node.cluster import GATEWAY, SECRET, Stream, node_settings, request
from tests.support.loop import BackgroundLoop
from tests.support.wait import wait_for_condition

BLOCK_SIZE = 16
TENANT = "alice"  # what tests.node.cluster.request sends


def prompts(count: int, seed: int = 7) -> list[list[int]]:
    """Prompts of four to six blocks; every other one extends the one before it."""
    rng = random.Random(seed)
    out: list[list[int]] = []
    for i in range(count):
        if i % 2 and out:
            out.append(out[-1] + [rng.randrange(100, 20000) for _ in range(BLOCK_SIZE * 2)])
        else:
            out.append([rng.randrange(100, 20000) for _ in range(BLOCK_SIZE * 4 + 3)])
    return out


async def catalogue_view(pg: Postgres, node: str) -> dict[bytes, bytes]:
    """cachemeta's record of ``node``'s DRAM blocks, from its database: hash -> parent."""
    conn = await asyncpg.connect(f"postgresql://{pg.url.split('://', 1)[1]}", timeout=5)
    try:
        rows = await conn.fetch(
            "SELECT b.hash, b.parent_hash FROM replicas r JOIN blocks b ON b.hash = r.block_hash "
            "WHERE r.node_id = $1 AND r.tier = 'dram'",
            node,
        )
    finally:
        await conn.close()
    return {bytes(r["hash"]): bytes(r["parent_hash"]) for r in rows}


async def serve_prompt(bus: NatsBus, node: str, rid: str, prompt: list[int]) -> None:
    stream = Stream()
    await bus.subscribe(subjects.tokens(rid), TokenChunk, stream.on_chunk)
    task = PrefillTask(request=request(rid, prompt), decode_nodes=[node])
    ack = await bus.request(subjects.local_tasks(node), task, TaskAck, 10.0)
    assert ack.accepted, ack
    await stream.wait(lambda s: s.ended, timeout_s=60.0)
    assert not any(c.error for c in stream.chunks)


@pytest.mark.slow
def test_events_rebuild_the_catalogues_view_and_queries_agree_with_its_grpc_answer(
    bg_loop: BackgroundLoop,
    postgres: Postgres,
    nats_url: str,
    make_real_engine: RealEngineFactory,
) -> None:
    postgres.truncate()
    served = Served(bg_loop, settings_for(postgres.url)).start()
    node = f"d-{uuid.uuid4().hex[:8]}"
    engine = make_real_engine(block_size=BLOCK_SIZE, num_kv_blocks=16)
    rebuilt = Rebuilt()

    async def on_frame(msg: Msg) -> None:
        if msg.subject == subjects.kv_events("decode", node):
            rebuilt.take(msg.data)

    async def scenario() -> None:
        outsider = await nats.connect(nats_url)
        await outsider.subscribe(f"{subjects.PREFIX}.kv.events.>", cb=on_frame)
        await outsider.flush()
        async with running_index(nats_url, cache_secret=SECRET) as (index, http):
            test_bus = await NatsBus.connect(nats_url, "crescent-tools")

            async def check(_: GatewayCheck) -> GatewayCheckReply:
                return GatewayCheckReply(unknown=[])

            await test_bus.serve(subjects.gateway_checks(GATEWAY), GatewayCheck, check)
            settings = node_settings(
                DecodeSettings,
                node,
                cachemeta_url=f"127.0.0.1:{served.service.port if served.service else 0}",
                catalogue_sync_s=0.05,
            )
            node_bus = await NatsBus.connect(nats_url, f"crescent-{node}")
            service = DecodeService(settings, engine, node_bus)
            await service.start()
            await node_bus.flush()  # its subscriptions reach the server before the tasks
            try:
                sent = prompts(8)
                for i, prompt in enumerate(sent):
                    await serve_prompt(test_bus, node, f"r{i}-{node}", prompt)
                scope = (engine.model_id, engine.config.kv_dtype)
                await agree(
                    index.index.publishers, node, http, sent, scope, served, postgres, rebuilt
                )
            finally:
                await service.stop()
                await test_bus.close()
        await outsider.close()

    try:
        bg_loop.run(scenario(), timeout_s=300)
    finally:
        served.close()
    assert rebuilt.gaps == 0
    assert rebuilt.removed > 0, "the pool evicted blocks, so the events carried removals"


async def agree(
    views: dict[str, Any],
    node: str,
    http: Any,
    sent: list[list[int]],
    scope: tuple[str, str],
    served: Served,
    pg: Postgres,
    rebuilt: Rebuilt,
) -> None:
    """Waits for the events' view to equal the catalogue's, then compares the two answers."""

    async def same() -> bool:
        return rebuilt.views.get((node, "DRAM"), {}) == await catalogue_view(pg, node)

    await wait_for_condition(same, "the rebuilt view to equal cachemeta's")
    assert len(rebuilt.views[(node, "DRAM")]) > 0
    name = subjects.kv_publisher("decode", node)
    await wait_for_condition(lambda: name in views, "kvindex to know the node")
    assert served.client is not None
    model_id, kv_dtype = scope
    root = root_hash(model_id, BLOCK_SIZE, kv_dtype, scope_salt(SECRET.encode(), TENANT))
    seen_hits = 0
    for prompt in sent:
        hashes = hash_full_blocks(prompt, BLOCK_SIZE, root)
        holders = await served.client.match_prefix(hashes)
        by_grpc = {(h.node_id, h.tier): h.num_blocks for h in holders if h.node_id == node}
        body = (
            await http.post("/v1/kv/query", json={"block_hashes": [x.hex() for x in hashes]})
        ).json()
        tiers = body["instances"].get(name, {}).get("tiers", {})
        by_http = {(node, t): m["blocks"] for t, m in tiers.items()}
        assert by_http == by_grpc, prompt
        by_tokens = {
            "token_ids": prompt, "block_size": BLOCK_SIZE, "model": model_id,
            "kv_dtype": kv_dtype, "tenant_id": TENANT,
        }  # fmt: skip
        again = (await http.post("/v1/kv/query", json=by_tokens)).json()
        assert again["instances"].get(name, {}).get("tiers", {}) == tiers
        seen_hits += bool(by_grpc)
    assert seen_hits > 0, "some prompt's blocks are still in the pool"
