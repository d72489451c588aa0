"""Attacks on a running `crescent up` stack (its own NATS, one user per node, two decode
nodes) with credentials the stack really hands out: the read-only tools user claiming a
node's connection name, and decode-1's own user forging what only decode-0, or a request's
assigned node, may say. None of it changes what clients get."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import nats
import pytest
from nats.aio.client import Client

from shared import subjects
from shared.cluster_messages import NodeStatus
from shared.messages import AbortRequest, TokenChunk, encode
from shared.secrets import read_secret_file
from tests.e2e.conftest import ALICE_KEY, stack_env
from tests.e2e.stack import Stack
from tests.support.wait import wait_for_condition

pytestmark = pytest.mark.slow
PROMPT = "Count from one to forty in words, separated by commas."
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Stack]:
    env = stack_env(cache_dir, "", "tcp")  # "": a NATS of its own, with its generated users
    running = Stack.start(tmp_path_factory.mktemp("identity"), env, ["--decode", "2"])
    try:
        yield running
    finally:
        running.stop()


@asynccontextmanager
async def as_user(stack: Stack, user: str, name: str) -> AsyncIterator[tuple[Client, list[str]]]:
    """A NATS connection with ``user``'s generated password and the connection ``name``;
    yields it with the errors the server reported to it."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    password = read_secret_file(stack.data_dir / "secrets" / f"nats-{user}.password")
    url = str(json.loads((stack.data_dir / "stack.json").read_text())["nats_url"])
    nc = await nats.connect(
        url,
        name=name,
        user=user,
        password=password,
        inbox_prefix=f"_INBOX.{user}",
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        yield nc, errors
    finally:
        await nc.close()


async def complete(client: httpx.AsyncClient, stream: bool = False) -> tuple[int, str]:
    """One greedy chat completion: its status and text."""
    body = {
        "model": await served_model(client),
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": stream,
    }
    if not stream:
        reply = await client.post("/v1/chat/completions", json=body)
        text = reply.json()["choices"][0]["message"]["content"] if reply.is_success else ""
        return reply.status_code, text
    text = ""
    async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue
            piece = json.loads(line[6:])["choices"]
            text += "".join(c["delta"].get("content") or "" for c in piece)
        return reply.status_code, text


async def migrations(client: httpx.AsyncClient) -> float:
    """How many times the gateway has moved a request to another node so far."""
    text = (await client.get("/metrics")).text
    name = "crescent_gateway_request_migrations_total "
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def served_model(client: httpx.AsyncClient) -> str:
    return str((await client.get("/v1/models")).json()["data"][0]["id"])


def client_for(stack: Stack) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=stack.base_url.removesuffix("/v1"),
        headers={"Authorization": f"Bearer {ALICE_KEY}"},
        timeout=120,
    )


def test_spoofed_disconnects_and_forged_heartbeats_change_nothing(stack: Stack) -> None:
    async def scenario() -> None:
        async with client_for(stack) as client:
            status, reference = await complete(client)
            assert status == 200 and reference
            stop = asyncio.Event()
            rounds = {"spoofed": 0, "forged": 0}  # how far each attack has got

            async def spoof_disconnects() -> None:
                while not stop.is_set():
                    for node in ("decode-0", "decode-1"):
                        async with as_user(stack, "tools", f"crescent-{node}"):
                            pass
                    rounds["spoofed"] += 1
                    await asyncio.sleep(0.1)  # the attack's pace: 10 a second while requests run

            async def forge_heartbeats() -> list[str]:
                async with as_user(stack, "decode-1", "crescent-decode-1") as (nc, errors):
                    forged = NodeStatus(node_id="decode-0", role="decode", epoch="x")
                    forged.draining = True
                    while not stop.is_set():
                        await nc.publish(subjects.heartbeats("decode", "decode-0"), encode(forged))
                        # Its own subject, another node's name: dropped by every receiver.
                        await nc.publish(subjects.heartbeats("decode", "decode-1"), encode(forged))
                        rounds["forged"] += 1
                        await asyncio.sleep(0.1)  # the attack's pace, not synchronisation
                    await nc.flush()
                    return errors

            attacks = [asyncio.create_task(spoof_disconnects())]
            heartbeats = asyncio.create_task(forge_heartbeats())
            moved = await migrations(client)
            await wait_for_condition(
                lambda: min(rounds.values()) >= 3, "both attacks under way for a few rounds"
            )
            try:
                for _ in range(3):
                    status, text = await complete(client, stream=True)
                    assert (status, text) == (200, reference)
                    ready = await client.get("/readyz")
                    assert ready.status_code == 200, ready.text
                assert await migrations(client) == moved
            finally:
                stop.set()
                await asyncio.gather(*attacks)
            errors = await heartbeats
            assert any("permissions violation" in e and "decode.decode-0" in e for e in errors)

    asyncio.run(scenario())


def test_another_node_cannot_write_into_or_end_a_stream(stack: Stack) -> None:
    """decode-1 learns a stream's request id (its first chunk carries it) and publishes
    finished chunks with its own tokens; prefill-0, which may publish aborts, aborts it
    without the request's stream key: the client sees neither."""

    async def scenario() -> None:
        async with client_for(stack) as client:
            _, reference = await complete(client)
            body = {
                "model": await served_model(client),
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "stream": True,
            }
            text, forged = "", False
            async with (
                as_user(stack, "decode-1", "crescent-decode-1") as (nc, errors),
                as_user(stack, "prefill-0", "crescent-prefill-0") as (prefill, refused),
                client.stream("POST", "/v1/chat/completions", json=body) as reply,
            ):
                async for line in reply.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    text += "".join(c["delta"].get("content") or "" for c in event["choices"])
                    if not forged:
                        forged = True
                        request_id = f"{event['id']}-0"
                        for index in (0, 1, 2, 40):
                            fake = TokenChunk(
                                request_id=request_id,
                                index=index,
                                token_ids=[42, 42, 42],
                                finish_reason="stop",
                                node_id="decode-0",
                            )
                            await nc.publish(subjects.tokens(request_id), encode(fake))
                        for only_node in ("", "decode-0", "decode-1"):
                            abort = AbortRequest(request_id=request_id, only_node=only_node)
                            await prefill.publish(subjects.ABORTS, encode(abort))
                        await nc.flush()
                        await prefill.flush()
            assert forged and reply.status_code == 200
            assert text == reference
            assert not errors and not refused  # allowed to publish: refused by the tags

    asyncio.run(scenario())


def test_one_node_cannot_read_another_nodes_hand_offs(stack: Stack) -> None:
    async def scenario() -> None:
        async with as_user(stack, "decode-1", "crescent-decode-1") as (nc, errors):
            for subject in (
                subjects.decode_tasks("decode-0"),
                subjects.decode_tasks("*"),
                subjects.peer_pins("decode-0"),
                subjects.replays("decode-0"),
                subjects.lease_releases("prefill-0"),
                f"{subjects.PREFIX}.tokens.>",
            ):
                await nc.subscribe(subject)
            await nc.flush()
            await nc.flush()
            await wait_for_condition(lambda: len(errors) >= 6, "six refused subscriptions")
            assert len([e for e in errors if "permissions violation" in e]) == 6, errors

    asyncio.run(scenario())


def test_everything_the_stack_wrote_is_private(stack: Stack) -> None:
    """Secrets, catalogue (and its journal), block files, logs, the lock and stack.json: files
    0600 at most, folders 0700 at most, whoever wrote them (the launcher or a child)."""
    loose = []
    for path in [stack.data_dir, *stack.data_dir.rglob("*")]:
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            continue
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            loose.append(f"{path.relative_to(stack.data_dir)}: {mode:o}")
    assert not loose, loose
