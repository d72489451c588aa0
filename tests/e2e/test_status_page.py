"""The gateway's /dashboard in headless Chromium, against the session's `crescent up`: the
page shows the same numbers as the /status JSON it was fed, and renders (a screenshot).

(Named to run after test_global_cache.py, whose stack shares the session's NATS server and
its nodes' names: the session's stack must not be up beside it.)"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from crescent.cli import main
from tests.e2e.heartbeats import fresh_heartbeats, model_nodes, nats_url
from tests.e2e.stack import Stack

pytestmark = pytest.mark.slow

#: Chromium as an isolated, offline renderer: no sandbox (root in CI), no GPU, nothing
#: fetched in the background, a profile of its own.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    "--hide-scrollbars", "--virtual-time-budget=5000",
)  # fmt: skip


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("Debian's chromium package is not installed (`make test` installs it)")
    return found


def render(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [chromium(), *FLAGS, f"--user-data-dir={profile}", *args, url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


class Figures(HTMLParser):
    """Collects every element carrying ``data-path`` (its value and text) and the JSON in
    ``<script id="rendered">``."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, tuple[Any, str]] = {}
        self.rendered: Any = None
        self._open: list[tuple[str, dict[str, str | None]]] = []
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._open.append((tag, dict(attrs)))
        self._text = []

    def handle_data(self, data: str) -> None:
        self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            name, attrs = self._open.pop()
            text = "".join(self._text).strip()
            path = attrs.get("data-path")
            if path is not None:
                self.figures[path] = (json.loads(attrs.get("data-value") or "null"), text)
            if attrs.get("id") == "rendered":
                self.rendered = json.loads(text)
            if name == tag:
                break


def number(text: str) -> float:
    return float(text.split()[0].rstrip("%"))


def shown_right(kind: str, value: Any, text: str) -> bool:
    """Whether ``text`` is how the page formats ``value`` (as dashboard.html's ``fmt``)."""
    if value is None:
        return text == "–"
    if kind == "percent":
        return text.endswith("%") and abs(number(text) - value * 100) <= 0.05 + 1e-9
    if kind == "ms":
        return text.endswith(" ms") and abs(number(text) - value) <= 0.05 + 1e-9
    if kind == "time":
        return text == time.strftime("%H:%M:%S", time.gmtime(value))
    return text == (value if isinstance(value, str) else str(value))


KIND = {"pool_use": "percent", "hit_ratio": "percent", "use": "percent", "ttft_ms": "ms",
        "tpot_ms": "ms", "e2e_ms": "ms", "ended_at": "time", "saturation": "percent",
        "prefill": "percent", "decode": "percent"}  # fmt: skip


def expected(rendered: dict[str, Any], path: str) -> Any:
    """The value a figure's path names in the status document."""
    head, *rest = path.split(".")
    if head == "saturation":
        return rendered["saturation"][rest[0]]
    if head == "cache" and rest[0] == "hit_ratio":
        return rendered["cache"]["hit_ratio"]
    if head == "cache":
        return {p["t"]: p for p in rendered["cache"]["history"]}[float(rest[1])]["hit_ratio"]
    if head == "nodes":
        node = {n["id"]: n for n in rendered["nodes"]}[rest[0]]
        return node[rest[1]] if node["pool_total_blocks"] or rest[1] != "pool_used_blocks" else None
    if head == "tiers":
        return {(t["node"], t["tier"]): t for t in rendered["tiers"]}[rest[0], rest[1]]["use"]
    return rendered["requests"][int(rest[0])][rest[1]]


def test_the_page_shows_the_figures_of_the_status_json(
    stack: Stack, client: OpenAI, model_name: str, tmp_path: Path
) -> None:
    prompt = " ".join(f"Dashboard fact {i} of run {os.getpid()}." for i in range(24))
    for _ in range(2):  # the second may be served from the cache: placement prices it
        last = client.completions.create(
            model=model_name, prompt=prompt, max_tokens=4, temperature=0
        )
    assert last.usage is not None
    details = last.usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    asyncio.run(fresh_heartbeats(nats_url(stack), model_nodes(stack)))  # figures refreshed
    base = stack.base_url.removesuffix("/v1")
    before = httpx.get(f"{base}/status", timeout=10).json()
    dom = render(f"{base}/dashboard", tmp_path / "profile", "--dump-dom").stdout
    after = httpx.get(f"{base}/status", timeout=10).json()

    page = Figures()
    page.feed(dom)
    shown = page.rendered
    assert shown is not None, "the page never rendered a status document"
    # The page's document is the endpoint's: the same services, tiers and requests.
    for doc in (before, after):
        assert {(n["id"], n["role"]) for n in shown["nodes"]} == {
            (n["id"], n["role"]) for n in doc["nodes"]
        }
    assert shown["requests"] == before["requests"] == after["requests"]
    assert [(t["node"], t["tier"], t["capacity_bytes"]) for t in shown["tiers"]] == [
        (t["node"], t["tier"], t["capacity_bytes"]) for t in before["tiers"]
    ]
    assert shown["cache"]["history"] == before["cache"]["history"]
    # Every figure on the page is the document's, formatted as the page says.
    for path, (value, text) in page.figures.items():
        assert value == expected(shown, path), path
        kind = KIND.get(path.split(".")[-1], "int")
        assert shown_right(kind, value, text), (path, value, text)
    roles = {n["role"] for n in shown["nodes"]}
    assert {"gateway", "scheduler", "prefill", "decode", "tierd"} <= roles
    for node in shown["nodes"]:
        for figure in ("health", "running_seqs", "queued_tokens", "pool_use", "saturation"):
            assert f"nodes.{node['id']}.{figure}" in page.figures
    assert {"saturation.prefill", "saturation.decode"} <= set(page.figures)
    assert all(f"tiers.{t['node']}.{t['tier']}.use" in page.figures for t in shown["tiers"])
    assert shown["tiers"], "tierd's tiers are on the page"
    assert len([p for p in page.figures if p.endswith(".e2e_ms")]) == len(shown["requests"]) >= 2
    assert page.figures["cache.hit_ratio"][0] is not None
    # The newest request first, with the cached tokens its client was told of.
    assert shown["requests"][0]["cached_tokens"] == cached

    shot = tmp_path / "dashboard.png"
    render(f"{base}/dashboard", tmp_path / "profile2", "--window-size=1280,900",
           f"--screenshot={shot}")  # fmt: skip
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000
    keep = os.environ.get("DASHBOARD_SCREENSHOT")
    if keep:  # how docs/dashboard.png is made
        shutil.copyfile(shot, keep)


def test_crescent_status_shows_the_running_stack(
    stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["status", "--data-dir", str(stack.data_dir)]) == 0
    out = capsys.readouterr().out
    status = httpx.get(stack.base_url.removesuffix("/v1") + "/status", timeout=10).json()
    for node in status["nodes"]:
        row = next(line for line in out.splitlines() if line.startswith(f"│ {node['id']} "))
        assert node["role"] in row and node["health"] in row, row
    for tier in status["tiers"]:
        assert any(tier["node"] in line and tier["tier"] in line for line in out.splitlines())
