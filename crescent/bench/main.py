"""``crescent bench``: builds the workload, plays it against one target or two in turns,
writes the results and prints the summary.

With two targets (``--compare``) the workload is cut into ``--rounds`` consecutive parts of
whole conversations, and each part is played against the first target, then the second,
before the next part: drift on a shared machine (another job, a warming page cache) falls
on both. Each target sees every request once.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import secrets
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from crescent.bench import plots, report, slo_sweep
from crescent.bench.client import request_body, stream_completion
from crescent.bench.metrics import Slo, Summary, ratios_to_first, summarize
from crescent.bench.options import BenchOptions, Target, options_from
from crescent.bench.records import RequestRecord
from crescent.bench.runner import RoundResult, new_record, play
from crescent.bench.workload import BenchRequest, Conversation, build, split_rounds
from crescent.traces import TOKEN_LOW


class BenchError(Exception):
    """A target that cannot be measured at all (unreachable, no model, a refused warm-up)."""


@dataclass(slots=True)
class TargetRun:
    """One target's records over all its rounds; ``sent_s`` counts along the target's own
    time line (its rounds end to end, without the other target's turns)."""

    model: str
    records: list[RequestRecord] = field(default_factory=list)
    duration_s: float = 0.0

    def add(self, result: RoundResult) -> None:
        for record in result.records:
            record.sent_s += self.duration_s
        self.records.extend(result.records)
        self.duration_s += result.duration_s


class Sender:
    """Sends a workload's requests to one target: its URL, model, key and cache switch."""

    def __init__(
        self, http: httpx.AsyncClient, target: Target, model: str, opts: BenchOptions
    ) -> None:
        self.http = http
        self.target = target
        self.model = model
        self.url = f"{target.base_url}/completions"
        self.headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
        self.ignore_eos = opts.ignore_eos
        self.slos_ms = (opts.slo_ttft_ms, opts.slo_tpot_ms) if opts.send_slos else None
        # A salt of its own for each request of each run: nothing cached is ever reused.
        self._salt = secrets.token_hex(8) if target.cache_off else None

    async def send(self, request: BenchRequest, start: float) -> RequestRecord:
        salt = None if self._salt is None else f"bench-{self._salt}-{request.index}"
        body = request_body(request, self.model, self.ignore_eos, salt, self.slos_ms)
        return await stream_completion(
            self.http, self.url, body, new_record(request, start), self.headers
        )

    async def warm_up(self, count: int) -> None:
        """``count`` unmeasured requests on token ids below any workload's, so they share no
        prefix with it; the first failure stops the bench."""
        for i in range(count):
            prompt = (TOKEN_LOW - 1 - i % 50,) * 16
            record = await self.send(BenchRequest(-1 - i, -1, 0, 0.0, prompt, 2), 0.0)
            if not record.ok:
                status = f"HTTP {record.status}: " if record.status else ""
                raise BenchError(
                    f"{self.target.name}: a warm-up request failed: {status}{record.error}"
                )


async def resolve_model(http: httpx.AsyncClient, target: Target) -> str:
    """The target's model, or the first the server lists at ``/models``."""
    if target.model:
        return target.model
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        resp = await http.get(f"{target.base_url}/models", headers=headers)
        resp.raise_for_status()
        return str(resp.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise BenchError(
            f"{target.name}: no model from {target.base_url}/models ({exc}); give --model"
        ) from None


async def bench(
    opts: BenchOptions,
    conversations: Sequence[Conversation],
    console: Console,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, TargetRun]:
    rounds = split_rounds(conversations, opts.rounds)
    total = sum(len(c) for c in conversations) * len(opts.targets)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    client = httpx.AsyncClient(timeout=opts.timeout_s, limits=limits, transport=transport)
    async with client as http:
        senders = []
        for target in opts.targets:
            sender = Sender(http, target, await resolve_model(http, target), opts)
            await sender.warm_up(opts.warmup)
            senders.append(sender)
        runs = {s.target.name: TargetRun(s.model) for s in senders}
        failed = 0
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns, TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("requests", total=total)

            def done(record: RequestRecord) -> None:
                nonlocal failed
                failed += not record.ok
                bar.update(task, advance=1, description=f"requests ({failed} failed)")

            for chunk in rounds:
                for sender in senders:
                    result = await play(chunk, sender.send, opts.pacing.concurrency, done)
                    runs[sender.target.name].add(result)
    return runs


def config_of(opts: BenchOptions, runs: dict[str, TargetRun]) -> dict[str, Any]:
    return {
        "targets": [t.describe() | {"model": runs[t.name].model} for t in opts.targets],
        "workload": asdict(opts.workload),
        "pacing": asdict(opts.pacing),
        "slo_ttft_ms": opts.slo_ttft_ms,
        "slo_tpot_ms": opts.slo_tpot_ms,
        "rounds": opts.rounds,
        "ignore_eos": opts.ignore_eos,
        "timeout_s": opts.timeout_s,
        "warmup": opts.warmup,
    }


def write_outputs(
    opts: BenchOptions, runs: dict[str, TargetRun], summaries: dict[str, Summary]
) -> list[Path]:
    """Result files and plots; the paths written."""
    config = config_of(opts, runs)
    written: list[Path] = []
    single = len(runs) == 1
    for name, run in runs.items():
        folder = opts.out if single else opts.out / name
        report.write_result(folder / "result.json", config, summaries[name], run.records)
        written.append(folder / "result.json")
        if opts.plots:
            written += plots.write_plots({name: run.records}, folder)
    if not single:
        payload = {"config": config, "summaries": summaries, "ratios": ratios_to_first(summaries)}
        report.write_json(opts.out / "comparison.json", payload)
        written.append(opts.out / "comparison.json")
        if opts.plots:
            written += plots.write_plots({n: r.records for n, r in runs.items()}, opts.out)
    return written


def describe(opts: BenchOptions, conversations: Sequence[Conversation]) -> str:
    requests = [r for c in conversations for r in c]
    prompt = sum(len(r.prompt) for r in requests)
    w, p = opts.workload, opts.pacing
    if p.timestamps:
        pace = f"at the trace's times × {p.time_scale:g}"
    elif p.request_rate == float("inf"):
        pace = "all at once"
    else:
        pace = f"Poisson at {p.request_rate:g} req/s"
    cap = f", at most {p.concurrency} in flight" if p.concurrency else ""
    return (
        f"{w.dataset}: {len(requests)} requests in {len(conversations)} conversations, "
        f"{prompt} prompt tokens (mean {prompt / len(requests):.0f}), sent {pace}{cap}"
    )


def run(args: argparse.Namespace, transport: httpx.AsyncBaseTransport | None = None) -> int:
    """The command; ``transport`` replaces the network (tests)."""
    try:
        opts = options_from(args)
        conversations = build(opts.workload, opts.pacing)
    except ValueError as exc:  # crescent.traces.TraceError is one
        sys.stderr.write(f"crescent bench: error: {exc}\n")
        return 2
    if not conversations:
        sys.stderr.write("crescent bench: error: the workload has no requests\n")
        return 2
    console = Console()
    try:
        if opts.request_rates:
            return sweep_rates(opts, console, transport)
        return one_run(opts, conversations, console, transport).status
    except BenchError as exc:
        console.print(f"[red]crescent bench: {exc}[/]", highlight=False)
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("crescent bench: interrupted; nothing more written\n")
        return 130


@dataclass(frozen=True, slots=True)
class RunResult:
    """One play of the workload: the exit status (1 when a target completed nothing), and
    per target its records and its summary."""

    status: int
    runs: dict[str, TargetRun]
    summaries: dict[str, Summary]


def one_run(
    opts: BenchOptions,
    conversations: Sequence[Conversation],
    console: Console,
    transport: httpx.AsyncBaseTransport | None,
) -> RunResult:
    """Plays the workload once against every target, prints and writes its figures."""
    console.print(describe(opts, conversations))
    runs = asyncio.run(bench(opts, conversations, console, transport))
    slo = Slo(opts.slo_ttft_ms, opts.slo_tpot_ms)
    summaries = {name: summarize(r.records, r.duration_s, slo) for name, r in runs.items()}
    title = f"SLO: TTFT ≤ {slo.ttft_ms:g} ms, TPOT ≤ {slo.tpot_ms:g} ms"
    console.print(report.summary_table(title, summaries, ratios_to_first(summaries)))
    for name, target_run in runs.items():
        for error in sorted({r.error or "" for r in target_run.records if not r.ok})[:3]:
            console.print(f"{name}: a request failed: {error}", markup=False, highlight=False)
    for path in write_outputs(opts, runs, summaries):
        console.print(f"wrote {path}", highlight=False)
    status = 0 if all(s["completed"] for s in summaries.values()) else 1
    return RunResult(status, runs, summaries)


def sweep_rates(
    opts: BenchOptions, console: Console, transport: httpx.AsyncBaseTransport | None
) -> int:
    """One run per rate of ``opts.request_rates`` (each under ``<out>/rate-<R>/``), then the
    sweep's table, ``sweep.json`` and ``slo_sweep.png`` (``slo_sweep``). Each rate has token
    ids of its own (the seed plus the rate's position), so no run finds an earlier one's
    prompts in a server's cache."""
    records: dict[float, dict[str, list[RequestRecord]]] = {}
    summaries: dict[float, dict[str, Summary]] = {}
    status = 0
    for position, rate in enumerate(opts.request_rates):
        rate_opts = dataclasses.replace(
            opts,
            workload=dataclasses.replace(opts.workload, seed=opts.workload.seed + position),
            pacing=dataclasses.replace(opts.pacing, request_rate=rate),
            out=slo_sweep.rate_folder(opts, rate),
        )
        conversations = build(rate_opts.workload, rate_opts.pacing)
        result = one_run(rate_opts, conversations, console, transport)
        status = max(status, result.status)
        records[rate] = {name: r.records for name, r in result.runs.items()}
        summaries[rate] = result.summaries
    slo = Slo(opts.slo_ttft_ms, opts.slo_tpot_ms)
    sweep = slo_sweep.figures(summaries, records, slo, opts.slo_scales)
    console.print(slo_sweep.table(sweep, slo))
    config = {
        "request_rates": opts.request_rates,
        "slo_scales": opts.slo_scales,
        "slo_ttft_ms": slo.ttft_ms,
        "slo_tpot_ms": slo.tpot_ms,
    }
    written = [opts.out / "sweep.json"]
    report.write_json(written[0], {"config": config, "sweep": sweep})
    if opts.plots:
        written.append(opts.out / "slo_sweep.png")
        slo_sweep.plot(records, sweep, slo, written[1])
    for path in written:
        console.print(f"wrote {path}", highlight=False)
    return status
