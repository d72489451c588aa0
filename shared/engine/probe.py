"""A node's first measurement of its own speed, taken before it takes any work."""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import Executor

from shared.config import EngineSettings
from shared.engine.engine import LLMEngine
from shared.engine.factory import load_engine
from shared.engine.step_governor import StepGovernor
from shared.engine.types import EngineStats
from shared.sampling_params import SamplingParams

#: Token ids of the probe's prompt start here: past the special tokens of common vocabularies.
_FIRST_ID = 1000


#: Past this many weights per token a prompt costs the scheduler's small-model prior several
#: times over: such a node times a prompt before it takes work. Below it the probe is skipped,
#: so nodes of a small model starting together do not time each other's contention.
PROBE_FROM_WEIGHTS = 400_000_000
AUTO_PROBE_TOKENS = 64


def probe_tokens(engine: LLMEngine, setting: int | None) -> int:
    """The probe's length: the setting where given, else by the model's size."""
    if setting is not None:
        return setting
    big = engine.runner.model.config.weights_per_token >= PROBE_FROM_WEIGHTS
    return AUTO_PROBE_TOKENS if big else 0


def probe_speed(engine: LLMEngine, num_tokens: int) -> None:
    """Runs one prompt of ``num_tokens`` tokens and one decode step, reading and writing no
    cached block, so the node's first heartbeat carries real step samples.

    A scheduler that has seen no step of this model prices the node by a prior sized for a
    small one: on an 8B model a prompt token costs about 30 times that, and a cached prefix
    on NVMe was recomputed because recomputing it looked cheaper. The engine's counters are
    cleared afterwards (its measured speed and step samples stay), so the metrics count only
    served work, and so is the prompt-step governor's view of contention."""
    if num_tokens <= 0:
        return
    vocab = engine.runner.model.config.vocab_size
    prompt = [(_FIRST_ID + i) % vocab for i in range(num_tokens)]
    params = SamplingParams(
        max_tokens=2, temperature=0.0, ignore_eos=True, cache_read=False, cache_write=False
    )
    engine.generate([prompt], params)
    speed = engine.stats.prompt_token_s
    for field in dataclasses.fields(EngineStats):
        setattr(engine.stats, field.name, field.default)
    engine.stats.prompt_token_s = speed
    # Nodes starting together probe together: the cores they waited for then say nothing
    # of the load to come, and would hold the next op-by-op steps to one thread.
    engine.threads.governor = StepGovernor()


async def load_and_probe(
    settings: EngineSettings, probe_setting: int | None, thread: Executor | None
) -> LLMEngine:
    """Loads the engine the settings name on ``thread`` (None: asyncio's default executor)
    and measures its speed before any work, so a node's first heartbeat carries it."""
    loop = asyncio.get_running_loop()
    engine = (await loop.run_in_executor(thread, load_engine, settings)).engine
    probe = probe_tokens(engine, probe_setting)
    await loop.run_in_executor(thread, probe_speed, engine, probe)
    return engine
