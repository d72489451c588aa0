"""The bench against an in-process OpenAI-like server (an httpx mock transport that streams
server-sent events): the client's timing and usage, failures, and a whole run's outputs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crescent import cli
from crescent.bench.client import request_body, stream_completion
from crescent.bench.records import RequestRecord
from crescent.bench.workload import BenchRequest

BLOCK = 8  # the fake server's cache block, in tokens


class FakeOpenAI:
    """Streams ``max_tokens`` one-token chunks a few ms apart, then usage. Its prefix cache
    counts the full blocks a request shares with what it saw before, in the request's
    ``cache_salt`` scope, and reports them as Crescent does (all in DRAM)."""

    def __init__(self, gap_s: float = 0.002, usage: bool = True, fail_every: int = 0) -> None:
        self.gap_s = gap_s
        self.usage = usage
        self.fail_every = fail_every
        self.seen: set[tuple[Any, ...]] = set()
        self.bodies: list[tuple[str, dict[str, Any]]] = []

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "fake-model"}]})
        body = json.loads(request.content)
        self.bodies.append((request.url.host, body))
        if self.fail_every and len(self.bodies) % self.fail_every == 0:
            return httpx.Response(503, json={"error": {"message": "overloaded, retry"}})
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, content=self.events(body))

    def cached(self, body: dict[str, Any]) -> int:
        prompt, salt = body["prompt"], body.get("cache_salt")
        keys = [(salt, *prompt[:end]) for end in range(BLOCK, len(prompt), BLOCK)]
        hits = 0
        while hits < len(keys) and keys[hits] in self.seen:
            hits += 1
        self.seen.update(keys)
        return hits * BLOCK

    async def events(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        cached = self.cached(body)
        yield b": a comment line, ignored\n\n"
        for i in range(body["max_tokens"]):
            await asyncio.sleep(self.gap_s)  # the gap between tokens a server streams with
            chunk = {
                "id": "cmpl-fake",
                "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}],
            }
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        if self.usage:
            usage = {
                "prompt_tokens": len(body["prompt"]),
                "completion_tokens": body["max_tokens"],
                "prompt_tokens_details": {
                    "cached_tokens": cached,
                    "cached_tokens_by_tier": {"dram": cached, "nvme": 0, "s3": 0},
                },
            }
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"


def _record(request: BenchRequest) -> RequestRecord:
    return RequestRecord(request.index, 0, 0, 0.0, 0.0, len(request.prompt), request.max_tokens)


async def _one(server: FakeOpenAI, request: BenchRequest, **body: Any) -> RequestRecord:
    async with httpx.AsyncClient(transport=server.transport()) as http:
        payload = request_body(request, "m", False, None) | body
        return await stream_completion(
            http, "http://fake/v1/completions", payload, _record(request)
        )


def test_a_streamed_request_is_timed_and_its_usage_read() -> None:
    server = FakeOpenAI(gap_s=0.01)
    request = BenchRequest(0, 0, 0, 0.0, tuple(range(100, 140)), 5)
    first = asyncio.run(_one(server, request))
    again = asyncio.run(_one(server, request))
    assert first.ok and first.status == 200 and first.error is None
    assert first.output_tokens == 5 and first.prompt_tokens == 40
    assert len(first.itl_s) == 4 and all(gap >= 0.009 for gap in first.itl_s)
    assert first.ttft_s is not None and first.e2e_s is not None
    assert 0.009 <= first.ttft_s <= first.e2e_s
    assert first.e2e_s >= first.ttft_s + sum(first.itl_s) - 1e-6
    assert first.cached_tokens == 0
    assert again.cached_tokens == 32 and again.cached_by_tier == {"dram": 32, "nvme": 0, "s3": 0}
    assert first.response_id == "cmpl-fake"  # what a server's debug view is asked by


def test_the_body_is_token_ids_streamed_with_usage() -> None:
    request = BenchRequest(3, 0, 0, 0.0, (5, 6, 7), 9)
    assert request_body(request, "m", False, None) == {
        "model": "m",
        "prompt": [5, 6, 7],
        "max_tokens": 9,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    flagged = request_body(request, "m", True, "s")
    assert flagged["ignore_eos"] is True and flagged["cache_salt"] == "s"
    assert "ttft_slo_ms" not in flagged and "tbt_slo_ms" not in flagged
    with_slos = request_body(request, "m", False, None, (3000.0, 150.0))
    assert (with_slos["ttft_slo_ms"], with_slos["tbt_slo_ms"]) == (3000.0, 150.0)


def test_without_usage_tokens_are_counted_from_chunks() -> None:
    record = asyncio.run(_one(FakeOpenAI(usage=False), BenchRequest(0, 0, 0, 0.0, (1, 2), 3)))
    assert record.ok and record.output_tokens == 3
    assert record.prompt_tokens is None and record.cached_tokens is None


def test_a_refusal_is_recorded_not_raised() -> None:
    record = asyncio.run(_one(FakeOpenAI(fail_every=1), BenchRequest(0, 0, 0, 0.0, (1,), 2)))
    assert not record.ok
    assert (record.status, record.error) == (503, "overloaded, retry")


def test_a_broken_connection_is_recorded_not_raised() -> None:
    async def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async def go() -> RequestRecord:
        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
            request = BenchRequest(0, 0, 0, 0.0, (1,), 2)
            body = request_body(request, "m", False, None)
            return await stream_completion(http, "http://x/v1/completions", body, _record(request))

    record = asyncio.run(go())
    assert not record.ok and record.status is None
    assert record.error == "ConnectError: connection refused"


def _bench(argv: list[str], server: FakeOpenAI) -> int:
    from crescent.bench.main import run

    args = cli.build_parser().parse_args(["bench", *argv])
    return run(args, transport=server.transport())


def test_a_run_writes_its_result_and_plots(tmp_path: Path) -> None:
    server = FakeOpenAI(fail_every=7)
    argv = ["--dataset", "multiturn", "--num-requests", "20", "--block-tokens", "16"]
    argv += ["--concurrency", "4", "--max-tokens-cap", "3", "--out", str(tmp_path)]
    assert _bench(argv, server) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    summary = result["summary"]
    # One warm-up request, then the workload; every seventh request the server refuses.
    assert len(server.bodies) == 21
    assert summary["requests"] == 20 and summary["failed"] == 3
    failed = [r for r in result["requests"] if not r["ok"]]
    assert {r["status"] for r in failed} == {503}
    assert summary["cached_ratio"] > 0  # later turns of a conversation share earlier prompts
    assert summary["cached_ratio_dram"] == summary["cached_ratio"]
    assert result["config"]["targets"][0]["model"] == "fake-model"
    assert "api_key" not in json.dumps(result["config"]["targets"]).replace("api_key_set", "")
    for name in ("latency_cdf.png", "ttft_over_time.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


def test_compare_alternates_rounds_and_writes_ratios(tmp_path: Path) -> None:
    server = FakeOpenAI()
    argv = ["--dataset", "shared-prefix", "--num-requests", "12", "--prefix-len", "32"]
    argv += ["--input-len", "8", "--output-len", "2", "--num-prefixes", "2", "--warmup", "0"]
    argv += ["--compare", "--rounds", "3", "--out", str(tmp_path), "--no-plots"]
    argv += ["--target", "on=http://one/v1", "--target", "off=http://one/v1,cache=off"]
    assert _bench(argv, server) == 0
    salted = ["off" if "cache_salt" in body else "on" for _, body in server.bodies]
    assert salted == ["on"] * 4 + ["off"] * 4 + ["on"] * 4 + ["off"] * 4 + ["on"] * 4 + ["off"] * 4
    salts = [body["cache_salt"] for _, body in server.bodies if "cache_salt" in body]
    assert len(set(salts)) == len(salts)
    comparison = json.loads((tmp_path / "comparison.json").read_text())
    on, off = comparison["summaries"]["on"], comparison["summaries"]["off"]
    assert on["cached_ratio"] > 0 and off["cached_ratio"] == 0
    assert comparison["ratios"]["off/on"]["cached_ratio"] == 0
    assert comparison["ratios"]["off/on"]["requests"] == 1
    for name in ("on", "off"):
        result = json.loads((tmp_path / name / "result.json").read_text())
        assert result["summary"]["completed"] == 12


def test_a_rate_sweep_runs_once_per_rate_and_reports_goodput_and_scales(tmp_path: Path) -> None:
    server = FakeOpenAI(fail_every=5)
    argv = ["--dataset", "random", "--num-requests", "6", "--input-len", "8", "--warmup", "0"]
    argv += ["--output-len", "2", "--request-rates", "50,100", "--slo-scales", "0.5,1,4"]
    argv += ["--compare", "--rounds", "1", "--out", str(tmp_path)]
    argv += ["--target", "a=http://one/v1", "--target", "b=http://one/v1,cache=off"]
    assert _bench(argv, server) == 0
    assert len(server.bodies) == 2 * 2 * 6  # two rates, two targets, six requests
    prompts = [tuple(body["prompt"]) for _, body in server.bodies]
    assert not set(prompts[:12]) & set(prompts[12:])  # each rate its own prompts
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert sweep["config"]["request_rates"] == [50.0, 100.0]
    for rate in ("50", "100"):
        for name in ("a", "b"):
            row = sweep["sweep"][f"{float(rate)}"][name]
            result = json.loads((tmp_path / f"rate-{rate}" / name / "result.json").read_text())
            # The sweep's figures are the run's own, and a failure never meets any scale.
            assert row["goodput"] == pytest.approx(result["summary"]["goodput"])
            assert row["slo_attainment"] == pytest.approx(result["summary"]["slo_attainment"])
            assert row["attainment_at_4x"] <= 1 - result["summary"]["failed"] / 6
            assert result["config"]["pacing"]["request_rate"] == float(rate)
    # Every fifth request failed, so 90% of six is out of reach at any scale.
    assert sweep["sweep"]["50.0"]["a"]["tightest_scale_p90"] == "inf"
    assert (tmp_path / "slo_sweep.png").read_bytes().startswith(b"\x89PNG")


def test_a_target_that_refuses_the_warm_up_stops_the_run(tmp_path: Path) -> None:
    argv = ["--dataset", "random", "--num-requests", "3", "--out", str(tmp_path)]
    assert _bench(argv, FakeOpenAI(fail_every=1)) == 1
    assert not (tmp_path / "result.json").exists()


def test_a_bad_trace_line_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n{')
    assert _bench(["--trace", str(trace), "--out", str(tmp_path)], FakeOpenAI()) == 2
    assert f"{trace}:2: not JSON" in capsys.readouterr().err
