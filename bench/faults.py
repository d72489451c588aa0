"""Faults made real against a running stack: the stack (`crescent up`, which restarts what
dies), a load of streaming clients, and the client-side account of what a fault cost.

Used by ``bench/chaos.py`` (the reliability table) and ``tests/chaos`` (its assertions).
"""

from __future__ import annotations

import asyncio
import difflib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crescent.procfs import children_of


@dataclass
class Stack:
    """One `crescent up`, started as a user starts it. Its children carry ``CRESCENT_UP_ID``
    and their name (``CRESCENT_CHILD_NAME``), so a fault can find and hit each one."""

    proc: subprocess.Popen[str]
    port: int
    data_dir: Path
    output: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @classmethod
    def start(
        cls, data_dir: Path, env: dict[str, str], args: Sequence[str] = (), timeout_s: float = 600
    ) -> Stack:
        port = _free_port()
        argv = [sys.executable, "-m", "crescent", "up", "--port", str(port)]
        argv += ["--data-dir", str(data_dir), *args]
        proc = subprocess.Popen(
            argv, env=os.environ | env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        stack = cls(proc, port, data_dir)
        deadline = time.monotonic() + timeout_s
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            stack.output.append(line)
            if line.startswith("Crescent is serving"):
                return stack
        proc.kill()
        logs = "".join(stack.output)
        raise RuntimeError(f"crescent up did not become ready:\n{logs}\n{collect_logs(data_dir)}")

    @property
    def up_id(self) -> str:
        """The id every process of this stack carries (``CRESCENT_UP_ID``)."""
        return str(json.loads((self.data_dir / "stack.json").read_text())["up_id"])

    def children(self) -> dict[str, int]:
        """Name -> pid of every process this stack runs now."""
        return children_of(self.proc.pid)

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> int:
        pid = self.children()[name]
        os.kill(pid, sig)
        return pid

    def wait_replaced(self, name: str, old_pid: int, timeout_s: float = 120) -> int:
        """Waits until ``crescent up`` has started ``name`` again; returns the new pid."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = self.children().get(name)
            if pid is not None and pid != old_pid:
                return pid
            time.sleep(0.1)
        raise TimeoutError(f"{name} was not restarted")

    def log(self, name: str) -> str:
        path = self.data_dir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, timeout_s: float = 120) -> int:
        """SIGTERM to `crescent up`; its exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)


#: Logs of servers Crescent runs but did not write, shown first and shortest: a failure's
#: message is often read from its end, where Crescent's own services' logs belong.
_FOREIGN_LOGS = {"nats.log": 1000, "s3.log": 1000}


def collect_logs(data_dir: Path) -> str:
    """The tail of every service's log, for a failure's message: the servers Crescent merely
    runs (NATS, S3) first, then Crescent's services, whose warnings come first in full."""
    logs = sorted(
        (data_dir / "logs").glob("*.log"), key=lambda p: (p.name not in _FOREIGN_LOGS, p.name)
    )
    parts = []
    for log in logs:
        text = log.read_text(errors="replace")
        if log.name in _FOREIGN_LOGS:
            parts.append(f"--- {log.name}\n{text[-_FOREIGN_LOGS[log.name] :]}")
            continue
        warnings = [line for line in text.splitlines() if " WARNING " in line or " ERROR " in line]
        parts.append(
            f"--- {log.name}\n" + "\n".join(warnings[-20:]) + f"\n... tail:\n{text[-3000:]}"
        )
    return "\n".join(parts)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Outcome:
    """What one client saw of one streamed request."""

    text: str = ""
    error: str | None = None
    finish_reason: str | None = None
    started: float = 0.0
    arrivals: list[float] = field(default_factory=list)
    done: float | None = None
    picked: list[str] = field(default_factory=list)  # each generated token, as its logprob names it
    top: list[dict[str, float]] = field(default_factory=list)  # its two likeliest, logprobs

    @property
    def completed(self) -> bool:
        return self.error is None and self.finish_reason is not None

    @property
    def longest_gap_s(self) -> float:
        times = [self.started, *self.arrivals]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def stream(
    client: AsyncOpenAI, model: str, prompt: str, max_tokens: int, deadline_s: float = 120
) -> Outcome:
    """One greedy chat completion, streamed; never raises (the error is in the outcome)."""
    out = Outcome(started=time.monotonic())
    messages: Any = [{"role": "user", "content": prompt}]
    try:
        async with asyncio.timeout(deadline_s):
            chunks = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                stream=True, logprobs=True, top_logprobs=2,
            )  # fmt: skip
            async for chunk in chunks:
                for choice in chunk.choices:
                    if choice.delta.content:
                        out.text += choice.delta.content
                        out.arrivals.append(time.monotonic())
                    for lp in (choice.logprobs.content or []) if choice.logprobs else []:
                        out.picked.append(lp.token)
                        out.top.append({t.token: t.logprob for t in lp.top_logprobs})
                    if choice.finish_reason:
                        out.finish_reason = choice.finish_reason
    except TimeoutError:
        out.error = f"no answer within {deadline_s:g} s"
    except Exception as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.done = time.monotonic()
    return out


@dataclass(frozen=True)
class Tally:
    """A fault's cost as clients saw it: requests sent, completed and failed; tokens
    duplicated and missing against the fault-free run; the longest a stream waited for its
    next token; and ``ties``, the outputs that parted from the fault-free run's at a near tie
    (``near_tie``), compared up to there."""

    fault: str
    sent: int
    completed: int
    failed: int
    duplicated: int
    missing: int
    recovery_s: float
    errors: tuple[str, ...] = ()
    ties: int = 0

    @property
    def clean(self) -> bool:
        return self.completed == self.sent and self.duplicated == 0 and self.missing == 0


#: Two greedy candidates this close (in nats) are a tie that fp32 sums in another order can
#: break either way: a request resumed on another node computes its generated tokens' KV as a
#: prompt, and the fault-free run batches it with other requests, so neither sums exactly as
#: the other did. A token lost, repeated or taken from another request lands this close to the
#: top only by a coincidence far rarer than such a tie.
TIE_NATS = 1e-3


def near_tie(got: Outcome, want: Outcome) -> int | None:
    """The first position where ``got`` and ``want`` chose different tokens, when each chose
    the other's second candidate within ``TIE_NATS`` of its first; None otherwise."""
    for i, (a, b) in enumerate(zip(got.picked, want.picked, strict=False)):
        if a == b:
            continue
        if i >= len(got.top) or i >= len(want.top):
            return None
        theirs, ours = want.top[i], got.top[i]
        if a not in theirs or b not in ours:
            return None
        close = abs(theirs[b] - theirs[a]) <= TIE_NATS and abs(ours[a] - ours[b]) <= TIE_NATS
        return i if close else None
    return None


def tally(
    fault: str, outcomes: Sequence[Outcome], expected: Sequence[Outcome], tokens: Any
) -> Tally:
    """Compares each outcome's text with the fault-free run's, token by token (``tokens``
    turns a text into token ids); where the two part at a near tie, only the text before it."""
    duplicated = missing = ties = 0
    for out, ref in zip(outcomes, expected, strict=True):
        if out.error is not None:
            continue
        got, want = out.text, ref.text
        tie = near_tie(out, ref) if got != want else None
        if tie is not None:
            ties += 1
            got, want = "".join(out.picked[:tie]), "".join(ref.picked[:tie])
        got_ids, want_ids = tokens(got), tokens(want)
        matcher = difflib.SequenceMatcher(a=want_ids, b=got_ids, autojunk=False)
        for op, a1, a2, b1, b2 in matcher.get_opcodes():
            if op in ("insert", "replace"):
                duplicated += b2 - b1
            if op in ("delete", "replace"):
                missing += a2 - a1
    completed = sum(o.completed for o in outcomes)
    errors = tuple(o.error for o in outcomes if o.error is not None)
    return Tally(
        fault,
        sent=len(outcomes),
        completed=completed,
        failed=len(outcomes) - completed,
        duplicated=duplicated,
        missing=missing,
        recovery_s=max((o.longest_gap_s for o in outcomes), default=0.0),
        errors=errors,
        ties=ties,
    )
