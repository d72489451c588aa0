"""cachemeta's gRPC port: only callers with the deployment's token get through, no call's lists
exceed their caps, and the client splits what is longer."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from services.cachemeta.config import CacheMetaSettings
from services.cachemeta.database import create_engine
from shared.rpc import cachemeta_pb2 as pb
from shared.rpc import cachemeta_pb2_grpc as pb_grpc
from shared.rpc.client import (
    MAX_BLOCKS_PER_CALL,
    MAX_TOKENS_PER_BLOCK,
    CacheMetaClient,
    CacheMetaError,
)
from shared.rpc.types import BlockRecord, PrefixHolder
from tests.cachemeta.chains import ROOT, chain, hashes
from tests.cachemeta.conftest import Served, settings_for
from tests.support.loop import BackgroundLoop

TOKEN = "cachemeta-test-token-5c1f0e"
ROOT_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture
def guarded(bg_loop: BackgroundLoop, tmp_path: Path) -> Iterator[Served]:
    """cachemeta on SQLite with a token; its ``client`` presents the token."""
    settings = settings_for(f"sqlite+aiosqlite:///{tmp_path / 'cm.db'}", cachemeta_token=TOKEN)
    served = Served(bg_loop, settings).start()
    assert served.service is not None
    served.client = CacheMetaClient(f"127.0.0.1:{served.service.port}", timeout_s=10, token=TOKEN)
    yield served
    served.close()


def other_client(served: Served, token: str | None) -> CacheMetaClient:
    assert served.service is not None
    return CacheMetaClient(f"127.0.0.1:{served.service.port}", timeout_s=5, token=token)


@pytest.mark.parametrize("token", [None, "", "wrong-token-of-some-length", TOKEN + "x"])
def test_a_call_without_the_token_is_unauthenticated(guarded: Served, token: str | None) -> None:
    stranger = other_client(guarded, token)

    async def scenario() -> None:
        blocks = chain(list(range(8)))
        with pytest.raises(CacheMetaError, match="missing or wrong cachemeta token"):
            await stranger.register_blocks("n1", "dram", blocks)
        with pytest.raises(CacheMetaError, match="missing or wrong cachemeta token"):
            await stranger.match_prefix(hashes(blocks))
        await stranger.close()

    guarded.call(scenario())
    assert guarded.service is not None and guarded.service.servicer is not None
    calls = guarded.service.servicer.calls
    assert calls[("RegisterBlocks", "UNAUTHENTICATED")] == 1
    assert calls[("MatchPrefix", "UNAUTHENTICATED")] == 1
    assert ("RegisterBlocks", "OK") not in calls  # the servicer never saw the call


def test_the_code_is_unauthenticated_on_the_wire(guarded: Served) -> None:
    assert guarded.service is not None
    target = f"127.0.0.1:{guarded.service.port}"

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.CacheMetaStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Stats(pb.StatsRequest(), metadata=(("authorization", "Bearer no"),))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            reply = await stub.Stats(
                pb.StatsRequest(), metadata=(("authorization", f"Bearer {TOKEN}"),)
            )
            assert reply.num_blocks == 0

    guarded.call(scenario())


def test_the_right_token_gets_through(guarded: Served) -> None:
    client = guarded.client
    assert client is not None
    blocks = chain(list(range(12)))

    async def scenario() -> None:
        assert await client.register_blocks("n1", "dram", blocks) == 3
        assert await client.match_prefix(hashes(blocks)) == [PrefixHolder("n1", "dram", 3)]

    guarded.call(scenario())


def raw_call(served: Served, method: str, request: object) -> grpc.aio.AioRpcError:
    """Sends ``request`` past the client's own splitting; returns the server's refusal."""
    assert served.service is not None
    target = f"127.0.0.1:{served.service.port}"

    async def call() -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.CacheMetaStub(channel)
            try:
                await getattr(stub, method)(
                    request, metadata=(("authorization", f"Bearer {TOKEN}"),)
                )
            except grpc.aio.AioRpcError as exc:
                return exc
        raise AssertionError(f"{method} was accepted")

    error: grpc.aio.AioRpcError = served.call(call())
    return error


def block(i: int, num_tokens: int = 4) -> pb.Block:
    return pb.Block(
        block_hash=i.to_bytes(16, "big"),
        parent_hash=ROOT,
        token_ids=[1] * num_tokens,
        num_bytes=10,
        checksum=0,
    )


TOO_MANY = [i.to_bytes(16, "big") for i in range(MAX_BLOCKS_PER_CALL + 1)]
OVER_CAP = [
    (
        "RegisterBlocks",
        pb.RegisterBlocksRequest(
            node_id="n", tier="dram", blocks=[block(i) for i in range(MAX_BLOCKS_PER_CALL + 1)]
        ),
        "blocks has 8193 entries; at most 8192",
    ),
    (
        "RegisterBlocks",
        pb.RegisterBlocksRequest(
            node_id="n", tier="dram", blocks=[block(0, MAX_TOKENS_PER_BLOCK + 1)]
        ),
        "blocks[0].token_ids has 1025 ids; at most 1024",
    ),
    (
        "DropBlocks",
        pb.DropBlocksRequest(node_id="n", tier="dram", block_hashes=TOO_MANY),
        "block_hashes has 8193 entries",
    ),
    ("MatchPrefix", pb.MatchPrefixRequest(block_hashes=TOO_MANY), "block_hashes has 8193 entries"),
    (
        "MatchPrefix",
        pb.MatchPrefixRequest(block_hashes=TOO_MANY[:1], tiers=["dram"] * 4),
        "tiers has 4 entries; at most 3",
    ),
    ("TouchBlocks", pb.TouchBlocksRequest(block_hashes=TOO_MANY), "block_hashes has 8193 entries"),
    (
        "Heartbeat",
        pb.HeartbeatRequest(
            node_id="n", role="prefill", epoch="e", tiers=[pb.TierCapacity(tier="dram")] * 4
        ),
        "tiers has 4 entries",
    ),
]


@pytest.mark.parametrize(("method", "request_", "message"), OVER_CAP)
def test_a_list_over_its_cap_is_an_invalid_argument_naming_the_cap(
    guarded: Served, method: str, request_: object, message: str
) -> None:
    error = raw_call(guarded, method, request_)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(re.escape(message), error.details() or "")


def records(count: int, first: int = 0) -> list[BlockRecord]:
    return [
        BlockRecord((first + i).to_bytes(16, "big"), ROOT, [7, 8, 9, 10], 100, i)
        for i in range(count)
    ]


def test_the_client_splits_long_lists_into_calls_under_the_caps(guarded: Served) -> None:
    client = guarded.client
    assert client is not None and guarded.service is not None
    many = records(MAX_BLOCKS_PER_CALL + 5, first=10)
    chain_hashes = [r.block_hash for r in many]

    async def scenario() -> None:
        assert await client.register_blocks("n1", "dram", records(3)) == 3
        # Only the first call replaces: the old blocks go, every new one stays.
        assert await client.register_blocks("n1", "dram", many, replace=True) == len(many)
        assert (await client.stats()).num_replicas == len(many)
        assert await client.match_prefix(chain_hashes) == [
            PrefixHolder("n1", "dram", MAX_BLOCKS_PER_CALL)  # the first cap's worth matched
        ]
        assert await client.touch_blocks(chain_hashes) == len(many)
        assert await client.drop_blocks("n1", "dram", chain_hashes) == len(many)
        assert (await client.stats()).num_replicas == 0

    guarded.call(scenario(), timeout_s=120)
    calls = guarded.service.servicer.calls  # type: ignore[union-attr]
    assert calls[("RegisterBlocks", "OK")] == 3
    assert calls[("DropBlocks", "OK")] == calls[("TouchBlocks", "OK")] == 2
    assert not [key for key in calls if key[1] == "INVALID_ARGUMENT"]


def test_without_a_token_cachemeta_refuses_to_start_outside_development(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CRESCENT_DEV_MODE", "false")
    for name in ("CRESCENT_CACHEMETA_TOKEN", "CRESCENT_CACHEMETA_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValidationError, match="CRESCENT_CACHEMETA_TOKEN"):
        CacheMetaSettings()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("CRESCENT_CACHEMETA_TOKEN_FILE", str(token_file))
    assert CacheMetaSettings().cachemeta_token_value() == TOKEN
    monkeypatch.setenv("CRESCENT_DEV_MODE", "true")
    monkeypatch.delenv("CRESCENT_CACHEMETA_TOKEN_FILE")
    assert CacheMetaSettings().cachemeta_token_value() is None


def test_the_process_exits_with_the_reason_and_no_secret(tmp_path: Path) -> None:
    env = os.environ | {
        "CRESCENT_DEV_MODE": "false",
        "CRESCENT_CACHEMETA_TOKEN": "short",
        "CRESCENT_DB_URL": f"sqlite+aiosqlite:///{tmp_path / 'cm.db'}",
    }
    done = subprocess.run(
        [sys.executable, "-m", "services.cachemeta"],
        cwd=ROOT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "the cachemeta token is too short" in done.stderr
    assert "short\n" not in done.stderr and "'short'" not in done.stderr


def test_a_failed_statement_never_carries_its_parameters(
    tmp_path: Path, bg_loop: BackgroundLoop
) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'p.db'}")

    async def scenario() -> str:
        try:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT no_such_column, :tokens"), {"tokens": "98765432"})
        except DBAPIError as exc:
            return str(exc)
        finally:
            await engine.dispose()
        raise AssertionError("the statement ran")

    message = bg_loop.run(scenario())
    assert "no_such_column" in message and "98765432" not in message
