"""kvindex as `crescent up` runs it: on its own NATS with one user per service, every node and
tierd publishing its KV events as itself, under its role. After the gateway served a prompt
given as token ids, kvindex's prefix query on those ids (hashed as the nodes hash them, with
the tenant's salt) names the node that computed the prompt, under its role, with the
prompt's blocks in its DRAM pool; the same ids of another tenant match nothing; the gateway's
status lists kvindex by its heartbeat; and no service's log, nor the NATS server's, shows a
permissions violation."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared import subjects
from shared.bus import NatsBus
from shared.cluster_messages import NodeStatus
from shared.secrets import read_secret_file
from tests.e2e.conftest import ALICE_KEY, stack_env
from tests.e2e.stack import Stack
from tests.support.wait import wait_for_condition

pytestmark = pytest.mark.slow
FULL_BLOCKS = 4


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Stack]:
    env = stack_env(cache_dir, "", "tcp")  # "": a NATS of its own, with its generated users
    running = Stack.start(tmp_path_factory.mktemp("kvindex"), env)
    try:
        yield running
    finally:
        running.stop()


def where(stack: Stack) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((stack.data_dir / "stack.json").read_text())
    return found


async def node_scope(stack: Stack) -> NodeStatus:
    """A model node's heartbeat, which names the model, block size and KV dtype it hashes
    with; heard as the stack's read-only ``tools`` user."""
    secrets = stack.data_dir / "secrets"
    auth: dict[str, Any] = {
        "user": "tools",
        "password": read_secret_file(secrets / "nats-tools.password"),
        "inbox_prefix": "_INBOX.tools",
    }
    bus = await NatsBus.connect(where(stack)["nats_url"], "crescent-tools", **auth)
    heard: list[NodeStatus] = []

    async def on_beat(status: NodeStatus) -> None:
        if status.role in ("prefill", "decode") and status.model_id:
            heard.append(status)

    try:
        await bus.subscribe(subjects.HEARTBEATS_ALL, NodeStatus, on_beat)
        await wait_for_condition(lambda: bool(heard), "a model node's heartbeat", 60)
    finally:
        await bus.close()
    return heard[0]


def serve(stack: Stack, prompt: list[int]) -> str:
    """Completes ``prompt`` (token ids) as alice; returns the node the scheduler placed its
    prefill on, as the gateway's debug view of the request tells."""
    base = stack.base_url.removesuffix("/v1")
    headers = {"authorization": f"Bearer {ALICE_KEY}"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
        reply = client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        view = client.get(f"/debug/requests/{reply.json()['id']}")
        assert view.status_code == 200, view.text
    placed: str = view.json()["placed"]["prefill_node"]
    return placed


def test_kvindex_finds_the_served_prompt_in_the_dram_of_the_node_that_computed_it(
    stack: Stack,
) -> None:
    scope = asyncio.run(node_scope(stack))
    rng = random.Random()  # a prompt no earlier request of the stack could have cached
    prompt = [rng.randrange(100, 20000) for _ in range(FULL_BLOCKS * scope.block_size + 5)]
    node = serve(stack, prompt)
    token = read_secret_file(stack.data_dir / "secrets" / "cachemeta.token")
    query = {
        "token_ids": prompt, "block_size": scope.block_size, "model": scope.model_id,
        "kv_dtype": scope.kv_dtype, "tenant_id": "alice",
    }  # fmt: skip
    answers: list[dict[str, Any]] = []
    with httpx.Client(
        base_url=where(stack)["kvindex"], headers={"authorization": f"Bearer {token}"}
    ) as kvindex:

        def found() -> bool:
            reply = kvindex.post("/v1/kv/query", json=query)
            assert reply.status_code == 200, reply.text
            answers.append(reply.json())
            dram = holding(answers[-1], node).get("tiers", {}).get("dram", {})
            return dram.get("blocks") == FULL_BLOCKS

        try:
            asyncio.run(wait_for_condition(found, f"{node}'s blocks in kvindex", 60))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; kvindex last said {answers[-1:]}") from None
        assert answers[-1]["num_blocks"] == FULL_BLOCKS
        assert holding(answers[-1], node)["longest_matched"] == FULL_BLOCKS * scope.block_size
        bob = kvindex.post("/v1/kv/query", json=query | {"tenant_id": "bob"}).json()
        assert bob["instances"] == {}, bob
        stranger = httpx.post(f"{where(stack)['kvindex']}/v1/kv/query", json=query)
        assert stranger.status_code == 401
    metrics = httpx.get(where(stack)["kvindex_metrics"], timeout=10).text
    assert 'crescent_kvindex_frames_total{outcome="folded"}' in metrics
    status = httpx.get(stack.base_url.removesuffix("/v1") + "/status", timeout=10).json()
    assert [(n["id"], n["health"]) for n in status["nodes"] if n["role"] == "kvindex"] == [
        ("kvindex", "ok")
    ]
    assert violations(stack.data_dir / "logs") == {}


def holding(answer: dict[str, Any], node: str) -> dict[str, Any]:
    """What a query's answer says ``node`` holds: kvindex names a publisher by role and id,
    and a node placed to prefill may be a prefill node or a decode node prefilling itself."""
    instances = answer["instances"]
    found: dict[str, Any] = instances.get(f"prefill.{node}") or instances.get(f"decode.{node}", {})
    return found


def violations(log_dir: Path) -> dict[str, list[str]]:
    """The lines of each log that report a refused publish or subscription: nats-server's
    ("Publish Violation") and a client's ("Permissions Violation"), whole logs read."""
    logs = sorted(log_dir.glob("*.log"))
    assert {"nats.log", "kvindex.log", "prefill-0.log", "decode-0.log", "tierd.log"} <= {
        p.name for p in logs
    }
    found = {}
    for path in logs:
        lines = [
            x for x in path.read_text(errors="replace").splitlines() if "violation" in x.lower()
        ]
        if lines:
            found[path.name] = lines[:5]
    return found
