"""The bound on what a structured output may cost: before a request reaches a node, its
grammar is compiled and its first token mask computed here, on a small pool of threads of its
own, and a grammar that fails or takes longer than the bound is a 400.

A node computes a mask for every step of every constrained sequence on its engine thread; a
grammar whose first mask alone takes longer than the bound (regular expressions such as
``(a{1000}){1000}`` take seconds) would stall every sequence batched with it."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from services.gateway import errors
from shared.model.grammar import Grammars, regex_grammar

#: Grammars whose verdict is remembered, so a repeated one is not compiled again.
REMEMBERED = 512
#: Threads compiling grammars at once: a flood of costly grammars holds at most these cores.
WORKERS = 2
#: Regular expressions one request's schemas may hold.
MAX_PATTERNS = 64
TOO_COMPLEX = "the grammar is too complex"
#: A grammar is remembered as too costly only when its own compile took this many times the
#: bound: a little over it may be the host's load, not the grammar.
SURELY_SLOW = 4
_OK = ""


class GrammarGuard:
    """Checks grammars' compile and first-mask cost against ``timeout_s``.

    Owns its thread pool and the remembered verdicts (grammar digest -> "" when fine, else
    the reason it is refused). Invariant: a verdict is remembered only once the check ran to
    its end, and "too costly" only when the compile itself took ``SURELY_SLOW`` times the
    bound, so a grammar refused because the host was busy is measured again next time.
    """

    def __init__(self, grammars: Grammars, timeout_s: float, workers: int = WORKERS) -> None:
        self.grammars = grammars
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="grammar-check")
        self._verdicts: OrderedDict[bytes, str] = OrderedDict()
        self._running: dict[bytes, Future[tuple[str, bool]]] = {}
        self._lock = threading.RLock()  # a done callback may run inside ``_probe``

    def check_schemas(self, schemas: list[Any], param: str) -> None:
        """Each regular expression the JSON ``schemas`` hold, timed on its own: a schema's
        first mask reaches none of them, yet a node compiles each once its output gets there.
        Only their cost is judged here; whether they are valid, the whole grammar's check
        says."""
        patterns = sorted(set(_patterns(schemas)))
        if len(patterns) > MAX_PATTERNS:
            raise errors.invalid(
                f"{param} holds {len(patterns)} regular expressions; at most {MAX_PATTERNS} "
                "are allowed",
                param,
            )
        for pattern in patterns:
            self.check(regex_grammar(pattern), param, refuse_errors=False)

    def check(self, grammar: str, param: str, refuse_errors: bool = True) -> None:
        """Raises a 400 naming ``param`` when the grammar is too costly or (``refuse_errors``)
        fails. Blocks up to ``timeout_s``: call it off the event loop."""
        key = hashlib.sha256(grammar.encode()).digest()
        verdict = self._remembered(key)
        if verdict is None:
            future = self._probe(key, grammar)
            try:
                verdict, _ = future.result(timeout=self.timeout_s)
            except (FutureTimeout, CancelledError):
                # One still queued behind costlier grammars is dropped, not left to pile up.
                future.cancel()
                verdict = self._too_slow()
        if verdict and (refuse_errors or verdict.startswith(TOO_COMPLEX)):
            raise errors.invalid(f"{param} cannot be enforced: {verdict}", param)

    def _probe(self, key: bytes, grammar: str) -> Future[tuple[str, bool]]:
        """The check of ``grammar`` under way, or a new one: requests repeating a grammar
        share one compile."""
        with self._lock:
            future = self._running.get(key)
            if future is None or future.cancelled():
                future = self._pool.submit(self._measure, grammar)
                self._running[key] = future
                future.add_done_callback(lambda done: self._remember(key, done))
            return future

    def _measure(self, grammar: str) -> tuple[str, bool]:
        """The verdict, and whether to remember it."""
        started = time.monotonic()
        error = self.grammars.first_mask_error(grammar)
        if error is not None:
            return f"unsupported grammar: {error}", True
        took = time.monotonic() - started
        if took > self.timeout_s:
            return self._too_slow(), took > SURELY_SLOW * self.timeout_s
        return _OK, True

    def _too_slow(self) -> str:
        return (
            f"{TOO_COMPLEX}: compiling it and computing its first token mask "
            f"takes longer than {self.timeout_s:g} s"
        )

    def _remembered(self, key: bytes) -> str | None:
        with self._lock:
            verdict = self._verdicts.get(key)
            if verdict is not None:
                self._verdicts.move_to_end(key)
            return verdict

    def _remember(self, key: bytes, done: Future[tuple[str, bool]]) -> None:
        with self._lock:
            if self._running.get(key) is done:
                del self._running[key]
            if done.cancelled() or done.exception() is not None:
                return
            verdict, lasting = done.result()
            if not lasting:
                return
            self._verdicts[key] = verdict
            if len(self._verdicts) > REMEMBERED:
                self._verdicts.popitem(last=False)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _patterns(node: Any) -> Iterator[str]:
    """Every ``pattern`` and ``patternProperties`` key anywhere in a JSON schema."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            elif key == "patternProperties" and isinstance(value, dict):
                yield from (k for k in value if isinstance(k, str))
            yield from _patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from _patterns(item)
