"""`crescent status`: the /status document of a gateway as rich tables, found by URL or by a
`crescent up` data folder; an unreachable gateway is one line and exit status 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from crescent.cli import main
from crescent.status import render
from services.gateway.metrics import Served
from services.gateway.status import StatusBoard
from shared.cluster_messages import NodeStatus

NOW = 1_800_000_000.0


def document() -> dict[str, Any]:
    board = StatusBoard()
    board.beat(NodeStatus(node_id="prefill-0", role="prefill", total_blocks=728,
                          free_blocks=546, running_seqs=3, queued_tokens=1200), 5.0)  # fmt: skip
    board.beat(NodeStatus(node_id="decode-0", role="decode", draining=True), 5.0)
    board.beat(NodeStatus(node_id="tierd-h", role="tierd", tiers={"nvme": (4 << 30, 1 << 30)}), 5)
    board.beat(NodeStatus(node_id="scheduler-0", role="scheduler",
                          saturation={"prefill-0": 0.8125, "decode-0": 0.0371},
                          role_saturation={"prefill": 0.8125, "decode": 0.0371}), 5.0)  # fmt: skip
    served = [Served(NOW - 3, 0.1234, 0.0201, 0.9, prompt_tokens=400, cached_tokens=384)]
    return board.snapshot(6.0, NOW, served, {"id": "gateway-x", "model": "m", "in_flight": 2})


def text_of(doc: dict[str, Any]) -> str:
    console = Console(record=True, width=160)
    console.print(render(doc))
    return console.export_text()


def test_the_tables_show_the_documents_figures() -> None:
    out = text_of(document())
    assert "gateway-x · m · 2 in flight" in out
    prefill = next(line for line in out.splitlines() if "prefill-0" in line)
    for figure in ("prefill", "ok", "3", "1200", "25.0%", "182/728", "81.2%"):
        assert figure in prefill, (figure, prefill)
    decode = next(line for line in out.splitlines() if "decode-0" in line)
    assert "draining" in decode and "3.7%" in decode
    assert "prefill 81.2% · decode 3.7%" in out  # the roles' figures
    tier = next(line for line in out.splitlines() if "tierd-h" in line and "nvme" in line)
    assert "1.0 GiB" in tier and "4.0 GiB" in tier and "25.0%" in tier
    assert "96.0%" in out  # the hit ratio: 384 of 400
    request = next(line for line in out.splitlines() if "123.4 ms" in line)
    assert "20.1 ms" in request and "900.0 ms" in request and "384" in request


def test_status_reads_a_gateway_by_url_or_stack_folder(
    gateway: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["status", "--url", gateway]) == 0
    assert "prefill-0" in capsys.readouterr().out
    (tmp_path / "stack.json").write_text(json.dumps({"api": f"{gateway}/v1"}))
    assert main(["status", "--data-dir", str(tmp_path)]) == 0
    assert "tierd-h" in capsys.readouterr().out


def test_an_unreachable_gateway_is_one_line_and_status_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["status", "--url", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("crescent status: error: http://127.0.0.1:9/status") and err.count("\n") == 1
    )
