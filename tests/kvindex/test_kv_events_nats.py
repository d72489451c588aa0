"""kvindex on a real NATS server: a publisher written from vLLM's documented format (not
Crescent's classes) sends numbered frames, the index folds them, asks for a resend after a
gap, and answers prefix queries over HTTP; bad queries get a clear 400. A publisher is its
role and id: a frame naming another than its subject is dropped, and one id under two roles
is two publishers."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg

from services.kvindex.main import KvIndexService
from shared import subjects
from tests.kvindex.conftest import running_index
from tests.kvindex.vllm_format import AllBlocksCleared, BlockRemoved, BlockStored, frame
from tests.support.wait import wait_for_condition

# Unique per run: the NATS server may be shared with other tests.
VLLM = f"vllm-{uuid.uuid4().hex[:8]}"
EXTERNAL = "external"
#: What the answers call the relayed engine: its role, then its id.
NAME = f"{EXTERNAL}.{VLLM}"


def gpu(keys: list[int], parent: int | None, medium: str = "GPU") -> BlockStored:
    return BlockStored(
        list[bytes | int](keys), parent, list(range(16 * len(keys))), 16, None, medium
    )


def folded(service: KvIndexService, publisher: str) -> int:
    """The last frame of ``publisher`` the index folded (-1: none)."""
    view = service.index.publishers.get(publisher)
    return -1 if view is None else view.last_seq


def held(body: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per instance, leading blocks per tier and across tiers (``*``)."""
    return {
        name: {t: m["blocks"] for t, m in inst["tiers"].items()} | {"*": inst["matched_blocks"]}
        for name, inst in body["instances"].items()
    }


def test_a_vllm_publishers_frames_are_indexed_and_queried_per_tier(nats_url: str) -> None:
    async def scenario() -> None:
        async with running_index(nats_url) as (service, http):
            nc = await nats.connect(nats_url)
            try:
                subject = subjects.kv_events(EXTERNAL, VLLM)
                first = [gpu([11, 12, 13], None)]
                await nc.publish(subject, frame(EXTERNAL, VLLM, "run1", 0, first))
                batch = [BlockRemoved([13], "GPU"), gpu([21], 12, medium="CPU")]
                await nc.publish(subject, frame(EXTERNAL, VLLM, "run1", 1, batch))
                await wait_for_condition(lambda: folded(service, NAME) == 1, "both frames folded")
                reply = await http.post("/v1/kv/query", json={"block_hashes": [11, 12, 13]})
                assert reply.status_code == 200
                assert reply.json() == {
                    "num_blocks": 3,
                    "instances": {
                        NAME: {
                            "longest_matched": 32,
                            "matched_blocks": 2,
                            "complete": True,
                            "tiers": {"gpu": {"blocks": 2, "tokens": 32}},
                        }
                    },
                }
                # The CPU copy continues the GPU prefix: three blocks across the two tiers.
                reply = await http.post("/v1/kv/query", json={"block_hashes": [11, 12, 21]})
                assert held(reply.json()) == {NAME: {"gpu": 2, "*": 3}}
                listing = (await http.get("/v1/kv/publishers")).json()["publishers"]
                assert listing[NAME]["tiers"] == {"cpu": 1, "gpu": 2}
                assert listing[NAME]["last_seq"] == 1
            finally:
                await nc.close()

    asyncio.run(scenario())


def test_a_gap_drops_the_view_and_asks_the_publisher_to_resend(nats_url: str) -> None:
    async def scenario() -> None:
        async with running_index(nats_url) as (service, http):
            nc = await nats.connect(nats_url)
            asked: list[dict[str, Any]] = []

            async def on_request(msg: Msg) -> None:
                asked.append(json.loads(msg.data))

            await nc.subscribe(subjects.kv_resyncs(EXTERNAL, VLLM), cb=on_request)
            await nc.flush()
            subject = subjects.kv_events(EXTERNAL, VLLM)
            query = {"block_hashes": [1, 2]}
            try:
                await nc.publish(subject, frame(EXTERNAL, VLLM, "run2", 0, [gpu([1, 2], None)]))
                lost_one = frame(EXTERNAL, VLLM, "run2", 2, [gpu([3], 2)])  # 1 is lost
                await nc.publish(subject, lost_one)
                await wait_for_condition(lambda: bool(asked), "a resend request")
                assert (asked[0]["role"], asked[0]["publisher"]) == (EXTERNAL, VLLM)
                assert "missed" in asked[0]["reason"]
                assert (await http.post("/v1/kv/query", json=query)).json()["instances"] == {}
                # vLLM's resend is a clear (of every medium) and its blocks again.
                resend = [AllBlocksCleared(), gpu([1, 2], None)]
                await nc.publish(subject, frame(EXTERNAL, VLLM, "run2", 3, resend))
                await wait_for_condition(lambda: folded(service, NAME) == 3, "the resend folded")
                body = (await http.post("/v1/kv/query", json=query)).json()
                assert held(body) == {NAME: {"gpu": 2, "*": 2}}
                assert body["instances"][NAME]["complete"] is True
            finally:
                await nc.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("sent_as", "claimed"),
    [
        # Another publisher of the same role.
        ((EXTERNAL, f"{VLLM}-intruder"), (EXTERNAL, f"{VLLM}-victim")),
        # The same id, another role: a role's shared user speaking for a node.
        (("tierd", VLLM), ("prefill", VLLM)),
        ((EXTERNAL, VLLM), ("decode", VLLM)),
    ],
)
def test_a_frame_naming_another_publisher_than_its_subject_is_dropped(
    nats_url: str, sent_as: tuple[str, str], claimed: tuple[str, str]
) -> None:
    async def scenario() -> None:
        async with running_index(nats_url) as (service, _):
            nc = await nats.connect(nats_url)
            try:
                forged = frame(*claimed, "e", 0, [gpu([5], None)])
                await nc.publish(subjects.kv_events(*sent_as), forged)
                await wait_for_condition(
                    lambda: service.handlers.frames["misaddressed"] == 1, "the forged frame seen"
                )
                assert not any(VLLM in p for p in service.index.publishers)
            finally:
                await nc.close()

    asyncio.run(scenario())


def test_one_id_under_two_roles_is_two_publishers(nats_url: str) -> None:
    """A tierd frame naming a node's id lands in a view of its own: it neither shows as the
    node's blocks nor clears them."""

    async def scenario() -> None:
        async with running_index(nats_url) as (service, http):
            nc = await nats.connect(nats_url)
            node = f"prefill-{uuid.uuid4().hex[:8]}"
            try:
                stored = [gpu([7, 8], None, medium="DRAM")]
                await nc.publish(
                    subjects.kv_events("prefill", node), frame("prefill", node, "n", 0, stored)
                )
                impostor = [AllBlocksCleared(), gpu([7], None, medium="NVME")]
                await nc.publish(
                    subjects.kv_events("tierd", node), frame("tierd", node, "t", 0, impostor)
                )
                views = service.index.publishers
                await wait_for_condition(lambda: len(views) == 2, "both publishers folded")
                reply = await http.post("/v1/kv/query", json={"block_hashes": [7, 8]})
                assert held(reply.json()) == {
                    f"prefill.{node}": {"dram": 2, "*": 2},
                    f"tierd.{node}": {"nvme": 1, "*": 1},
                }
            finally:
                await nc.close()

    asyncio.run(scenario())


BAD_QUERIES = [
    ({}, "give either block_hashes or token_ids"),
    ({"block_hashes": [1], "token_ids": [1]}, "give either block_hashes or token_ids"),
    ({"block_hashes": ["zz"]}, "is not hex"),
    ({"block_hashes": [True]}, "block_hashes.0"),
    ({"block_hashes": [1 << 70]}, "outside 64 bits"),
    ({"token_ids": [1, 2]}, "token_ids need block_size"),
    ({"token_ids": [1, 2], "block_size": 2}, "need root_hash, or model, kv_dtype and tenant_id"),
    ({"token_ids": [-1], "block_size": 1, "root_hash": "00" * 16}, "unsigned 32-bit"),
    ({"token_ids": [1], "block_size": 1, "root_hash": "00" * 8}, "root_hash is 16 bytes"),
    ({"block_hashes": [1], "tiers": ["dram"]}, "tiers: Extra inputs are not permitted"),
]


@pytest.mark.parametrize(("body", "message"), BAD_QUERIES)
def test_a_bad_query_gets_a_400_that_says_what_is_wrong(
    nats_url: str, body: dict[str, Any], message: str
) -> None:
    async def scenario() -> None:
        async with running_index(nats_url) as (_, http):
            reply = await http.post("/v1/kv/query", json=body)
            assert reply.status_code == 400
            error = reply.json()["error"]
            assert message in error["message"] and error["code"] == 400
            reply = await http.post("/v1/kv/query", content=b"{not json")
            assert reply.status_code == 400 and reply.json()["error"]["message"] == (
                "the body is not JSON"
            )

    asyncio.run(scenario())


def test_queries_need_the_token_once_one_is_configured(nats_url: str) -> None:
    token = "kvindex-test-token-0123456789abcdef"

    async def scenario() -> None:
        async with running_index(nats_url, cachemeta_token=token) as (_, http):
            query = {"block_hashes": [1]}
            assert (await http.post("/v1/kv/query", json=query)).status_code == 401
            wrong = {"authorization": "Bearer not-it"}
            assert (await http.get("/v1/kv/publishers", headers=wrong)).status_code == 401
            right = {"authorization": f"Bearer {token}"}
            reply = await http.post("/v1/kv/query", json=query, headers=right)
            assert reply.status_code == 200 and reply.json()["instances"] == {}

    asyncio.run(scenario())


def test_a_taken_port_falls_back_only_when_asked_and_the_port_taken_is_written(
    nats_url: str, tmp_path: Path
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        port_file = tmp_path / "run" / "kvindex.port"

        async def scenario() -> None:
            with pytest.raises(OSError, match="in use"):
                async with running_index(nats_url, kvindex_port=taken):
                    pass
            fallback = {"kvindex_port_fallback": True, "kvindex_port_file": port_file}
            async with running_index(nats_url, kvindex_port=taken, **fallback) as (service, http):
                assert service.port != taken
                assert port_file.read_text() == f"{service.port}\n"
                assert (await http.get("/v1/kv/publishers")).status_code == 200

        asyncio.run(scenario())
