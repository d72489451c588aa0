"""The served tokenizer, encoding long texts in a worker process of its own.

The tokenizer library holds the GIL for the whole of one encode (about half a second for a
4 MB prompt): in a thread it would still stall the event loop, and every stream with it. A
text of ``min_chars`` or more is therefore encoded by a process that loaded the same files;
shorter ones, the common case, stay in this process where they cost microseconds."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from array import array
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from shared.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

#: Texts this long or longer are encoded in the worker process.
MIN_CHARS = 64 * 1024
#: Ids turned into Python ints per step: each step holds the GIL, so it is kept short.
_STEP = 32 * 1024
_LOADED: Tokenizer | None = None


#: How often the worker looks whether the gateway that started it is still there.
_PARENT_CHECK_S = 1.0


def _load(path: str, parent: int) -> None:
    global _LOADED
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    _LOADED = Tokenizer.from_dir(Path(path))


def _exit_with(parent: int) -> None:
    """Ends the worker once its gateway is gone: a gateway killed with SIGKILL never shuts
    its pool down, and the worker would wait on its queue for ever."""
    while os.getppid() == parent:
        time.sleep(_PARENT_CHECK_S)
    os._exit(0)


def _ready() -> bool:
    return _LOADED is not None


def _encode(text: str, add_special_tokens: bool) -> array[int]:
    assert _LOADED is not None, "the worker loads the tokenizer before any task"
    # An int array crosses the process boundary as one block of bytes, not a million objects.
    return array("i", _LOADED.encode(text, add_special_tokens))


class PooledTokenizer(Tokenizer):
    """A ``Tokenizer`` whose long encodes (``offload``) run in a worker process.

    Owns that process. Invariant: the ids are the ones the same tokenizer gives in this
    process; should the worker die, encoding goes on here.
    """

    _pool: ProcessPoolExecutor | None = None
    _min_chars: int = MIN_CHARS

    @classmethod
    def load(cls, path: Path, min_chars: int = MIN_CHARS) -> PooledTokenizer:
        """The tokenizer of the model folder ``path``, its worker started."""
        tokenizer = cls.from_dir(path)
        assert isinstance(tokenizer, cls)
        tokenizer.offload(path, min_chars)
        return tokenizer

    def offload(self, path: Path, min_chars: int = MIN_CHARS) -> None:
        """Starts the worker on the tokenizer files in ``path``."""
        context = multiprocessing.get_context("spawn")  # never fork a process with threads
        self._pool = ProcessPoolExecutor(1, context, _load, (str(path), os.getpid()))
        self._min_chars = min_chars
        self._pool.submit(_ready)  # starts it now, not on the first long prompt

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        pool = self._pool
        if pool is None or len(text) < self._min_chars:
            return super().encode(text, add_special_tokens)
        try:
            encoded = pool.submit(_encode, text, add_special_tokens).result()
        except BrokenProcessPool:
            log.warning("the tokenizer's worker process died; encoding in the gateway")
            self._pool = None
            return super().encode(text, add_special_tokens)
        ids: list[int] = []
        for start in range(0, len(encoded), _STEP):
            ids += encoded[start : start + _STEP].tolist()
        return ids

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
