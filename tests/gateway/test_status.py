"""The gateway's status document and page: every service's heartbeat (the fake engine's
scheduler, prefill and decode node), the gateway itself, and the requests it served."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from services.gateway.metrics import Served
from services.gateway.status import HISTORY_STEP_S, StatusBoard, cache_history
from shared.cluster_messages import NodeStatus
from tests.support.fake_engine import NODE
from tests.support.gateway import ServedGateway
from tests.support.wait import wait_until


def test_status_lists_the_services_and_the_requests_served(
    client: openai.OpenAI, model_name: str, http: httpx.Client, gateway: ServedGateway
) -> None:
    client.completions.create(model=model_name, prompt="status page", max_tokens=3)
    pages: list[dict[str, Any]] = []

    def every_role_listed() -> bool:
        pages.append(http.get("/status").json())
        roles = {n["role"] for n in pages[-1]["nodes"]}
        return {"scheduler", "prefill", "decode", "gateway"} <= roles

    wait_until(every_role_listed, "every role on the status page")
    status = pages[-1]
    assert status["gateway"]["id"] == gateway.service.gateway_id
    assert status["gateway"]["model"] == model_name
    # Other tests' gateways and backends share the NATS server: look at this one's own.
    health = {n["id"]: n["health"] for n in status["nodes"]}
    ours = (gateway.service.gateway_id, "fake-scheduler", NODE, "fake-decode")
    assert [health.get(node) for node in ours] == ["ok"] * 4, health
    latest = status["requests"][0]
    assert latest["prompt_tokens"] > 0 and latest["e2e_ms"] >= latest["ttft_ms"] > 0
    assert status["cache"]["prompt_tokens"] >= latest["prompt_tokens"]
    page = http.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'fetch("status"' in page.text


def test_the_board_reports_pools_tiers_and_silence() -> None:
    board = StatusBoard(heartbeat_timeout_s=3.0)
    board.beat(NodeStatus(node_id="d0", role="decode", total_blocks=200, free_blocks=150), 10.0)
    board.beat(NodeStatus(node_id="p0", role="prefill", healthy=False), 10.0)
    tierd = NodeStatus(node_id="tierd-h", role="tierd", tiers={"nvme": (1000, 250)})
    board.beat(tierd, 13.5)
    snap = board.snapshot(14.0, 1e9, [], {"id": "g"})
    nodes = {n["id"]: n for n in snap["nodes"]}
    assert [n["id"] for n in snap["nodes"]] == ["p0", "d0", "tierd-h"]  # by role
    assert nodes["d0"]["pool_use"] == 0.25 and nodes["d0"]["pool_used_blocks"] == 50
    assert nodes["d0"]["health"] == "silent" and nodes["p0"]["health"] == "silent"
    assert nodes["tierd-h"]["health"] == "ok" and nodes["tierd-h"]["pool_use"] is None
    assert snap["tiers"] == [
        {"node": "tierd-h", "tier": "nvme", "used_bytes": 250, "capacity_bytes": 1000,
         "use": 0.25}
    ]  # fmt: skip
    later = board.snapshot(400.0, 1e9, [], {})
    assert later["nodes"] == []  # forgotten after five minutes of silence


def test_the_hit_ratio_history_adds_up_per_step() -> None:
    now = 1_000_000.0
    served = [
        Served(now - 25, 0.1, 0.01, 0.5, prompt_tokens=100, cached_tokens=0),
        Served(now - 21, 0.1, 0.01, 0.5, prompt_tokens=100, cached_tokens=96),
        Served(now - 5, 0.1, None, 0.2, prompt_tokens=64, cached_tokens=64),
        Served(now - 10_000, 0.1, None, 0.2, prompt_tokens=50, cached_tokens=0),  # too old
    ]
    cache = cache_history(served, now)
    assert [p["hit_ratio"] for p in cache["history"]] == [0.48, 1.0]
    assert cache["history"][0]["t"] % HISTORY_STEP_S == 0
    assert (cache["prompt_tokens"], cache["cached_tokens"]) == (264, 160)
    assert cache["hit_ratio"] == round(160 / 264, 4)
    assert cache_history([], now)["hit_ratio"] is None


def test_the_board_shows_the_saturation_the_latest_scheduler_reports() -> None:
    board = StatusBoard(heartbeat_timeout_s=3.0)
    board.beat(NodeStatus(node_id="p0", role="prefill"), 10.0)
    board.beat(NodeStatus(node_id="d0", role="decode"), 10.0)
    old = NodeStatus(node_id="s-old", role="scheduler", saturation={"p0": 0.9},
                     role_saturation={"prefill": 0.9})  # fmt: skip
    board.beat(old, 9.0)
    board.beat(NodeStatus(node_id="s0", role="scheduler", saturation={"p0": 1.23456, "d0": 0.2},
                          role_saturation={"prefill": 1.23456, "decode": 0.2}), 10.0)  # fmt: skip
    snap = board.snapshot(11.0, 1e9, [], {})
    assert snap["saturation"] == {"prefill": 1.2346, "decode": 0.2}
    ratios = {n["id"]: n["saturation"] for n in snap["nodes"]}
    assert ratios == {"s-old": None, "s0": None, "p0": 1.2346, "d0": 0.2}
    # Once every scheduler is silent, its figures are of a cluster gone by: none are shown.
    later = board.snapshot(14.0, 1e9, [], {})
    assert later["saturation"] == {"prefill": None, "decode": None}
    assert {n["saturation"] for n in later["nodes"]} == {None}
