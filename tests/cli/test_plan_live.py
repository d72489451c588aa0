"""``crescent plan --live`` against a gateway stand-in that serves the gateway's own metrics and
status code over HTTP: it observes a window, plans for it and prints (or, with ``--apply``,
runs) the scaling lines."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from crescent.cli import main
from services.gateway.metrics import GatewayMetrics, Served
from services.gateway.status import StatusBoard
from shared.cluster_messages import NodeStatus

#: Requests the stand-in serves between two scrapes of its /metrics.
PER_SCRAPE = 25


class _Pages(BaseHTTPRequestHandler):
    """Answers a GET with what its server's ``pages`` gives for the path (None: 404)."""

    server: _PageServer

    def do_GET(self) -> None:
        body = self.server.pages(self.path)
        self.send_response(404 if body is None else 200)
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the test's output is the command's


class _PageServer(ThreadingHTTPServer):
    def __init__(self, pages: Callable[[str], bytes | None]) -> None:
        super().__init__(("127.0.0.1", 0), _Pages)
        self.pages = pages


@pytest.fixture
def busy_gateway() -> Iterator[str]:
    """A gateway whose counters grow by ``PER_SCRAPE`` requests at each scrape, running one
    prefill and one decode node."""
    metrics, board, lock = GatewayMetrics(), StatusBoard(), threading.Lock()
    for node_id, role in (("prefill-0", "prefill"), ("decode-0", "decode")):
        board.beat(NodeStatus(node_id=node_id, role=role), now=0.0)
    recent = [Served(100.0, 0.3, 0.02, 0.3 + 0.02 * 15, 200 + 40 * i, 0) for i in range(8)]

    def pages(path: str) -> bytes | None:
        if path == "/status":
            return json.dumps(board.snapshot(1.0, 101.0, recent, {"id": "gw"})).encode()
        if path != "/metrics":
            return None
        with lock:
            metrics.requests.labels("/v1/chat/completions", "200").inc(PER_SCRAPE)
            for _ in range(PER_SCRAPE):
                metrics.e2e.observe(0.6)
            metrics.prompt_tokens.inc(PER_SCRAPE * 340)
            metrics.generation_tokens.inc(PER_SCRAPE * 16)
            return metrics.render()

    with _PageServer(pages) as server:  # closes its socket on the way out
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_port}"
        server.shutdown()


def plan_live(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, Any]:
    live = ["plan", "--live", "--url", url, "--window-s", "0.5", "--requests", "300"]
    status = main([*live, *args, "--json"])
    return status, json.loads(capsys.readouterr().out)


def test_it_plans_for_the_observed_workload(
    busy_gateway: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, found = plan_live(capsys, busy_gateway)
    assert status == 0
    seen = found["observed"]
    assert seen["arrivals"] == PER_SCRAPE
    assert seen["mean_prompt_tokens"] == 340 and seen["mean_output_tokens"] == 16
    assert seen["running"] == {"prefill": 1, "decode": 1}
    assert [p for p, _ in seen["recent"]] == [200 + 40 * i for i in range(8)][::-1]
    assert all(output == 16 for _, output in seen["recent"])
    assert found["workload"]["source"] == "live"
    assert found["workload"]["cost_model"] == "local"
    best = found["recommended"]
    assert best is not None and best["meets"]
    # The lines it would run scale each pool that differs from what runs now.
    wanted = {"crescent-prefill": best["prefill_nodes"], "crescent-decode": best["decode_nodes"]}
    lines = found["scaling"]["commands"]
    assert {line[4].split("/")[1]: line[5] for line in lines} == {
        name: f"--replicas={count}" for name, count in wanted.items() if count != 1
    }
    assert all(line[:4] == ["kubectl", "-n", "crescent", "scale"] for line in lines)
    assert found["scaling"]["applied"] == []


def test_apply_runs_the_lines(busy_gateway: str, capsys: pytest.CaptureFixture[str]) -> None:
    # `echo` stands where kubectl would: the test sees what would have run.
    status, found = plan_live(capsys, busy_gateway, "--apply", "--kubectl", "echo kubectl")
    assert status == 0
    applied = found["scaling"]["applied"]
    assert [a["command"] for a in applied] == found["scaling"]["commands"]
    for done in applied:
        assert done["status"] == 0
        assert done["output"] == " ".join(done["command"][1:])


def test_too_few_requests_scale_nothing(
    busy_gateway: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, found = plan_live(capsys, busy_gateway, "--apply", "--min-requests", "1000")
    assert status == 1
    assert "only 25 requests" in found["scaling"]["hold"]
    assert found["scaling"]["commands"] == [] and found["scaling"]["applied"] == []


def test_a_gateway_that_cannot_be_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--live", "--url", "http://127.0.0.1:9", "--window-s", "0.1"]) == 1
    assert "cannot read the gateway" in capsys.readouterr().err
