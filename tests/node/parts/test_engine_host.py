"""``EngineHost`` on its own: changes run on the engine thread between steps, bookkeeping
gives the engine's truth, outputs arrive in order past a failing handler, the watchdog sees
a hung step, and stop leaves no thread behind."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from shared.engine.engine import LLMEngine
from shared.engine.types import RequestOutput
from shared.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory
from tests.node.parts.rig import PLAIN, Outputs, hang_steps, prompt, run_to_end, running_host
from tests.support.wait import wait_for_condition

LONG = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
# Long enough that the abort comes well before its end on any host.
ENDLESS = SamplingParams(max_tokens=900, temperature=0.0, ignore_eos=True)


def watch_steps(engine: LLMEngine) -> dict[str, Any]:
    """Wraps the engine's step and changes to record whether a change ran inside a step,
    and on which thread each change ran."""
    seen: dict[str, Any] = {"stepping": False, "overlaps": 0, "threads": set(), "changes": 0}
    step, add, abort = engine.step, engine.add_request, engine.abort_request

    def stepped() -> list[RequestOutput]:
        seen["stepping"] = True
        try:
            return step()
        finally:
            seen["stepping"] = False

    def change(fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            seen["overlaps"] += seen["stepping"]
            seen["threads"].add(threading.current_thread().name)
            seen["changes"] += 1
            return fn(*args, **kwargs)

        return run

    engine.step = stepped  # type: ignore[method-assign]
    engine.add_request = change(add)  # type: ignore[method-assign]
    engine.abort_request = change(abort)  # type: ignore[method-assign]
    return seen


def test_changes_run_on_the_engine_thread_between_steps(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        engine = make_engine(num_kv_blocks=256)
        seen = watch_steps(engine)
        async with running_host(engine) as (host, outputs):
            await host.add("long", prompt(1), ENDLESS, b"")
            await wait_for_condition(lambda: bool(outputs.of("long")), "a first step")
            for i in range(5):
                await host.add(f"short{i}", prompt(10 + i), PLAIN, b"")
            assert await host.abort("long")
            for i in range(5):
                await outputs.wait_final(f"short{i}")
        assert seen["changes"] == 7
        assert seen["overlaps"] == 0
        assert all(name.startswith("engine_") for name in seen["threads"]), seen["threads"]
        final = outputs.final("long")
        assert final is None or len(final.output_token_ids) < ENDLESS.max_tokens

    asyncio.run(scenario())


def test_outputs_arrive_in_order(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        async with running_host(make_engine()) as (host, outputs):
            final = await run_to_end(host, outputs, "r", prompt(2), LONG)
        steps = outputs.of("r")
        assert [len(o.output_token_ids) for o in steps] == list(range(1, LONG.max_tokens + 1))
        assert [t for o in steps for t in o.new_token_ids] == final.output_token_ids

    asyncio.run(scenario())


def test_a_failing_output_handler_does_not_stop_deliveries(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        kept = Outputs()
        calls = [0]

        async def flaky(outputs: list[RequestOutput]) -> None:
            calls[0] += 1
            if calls[0] <= 2:
                raise RuntimeError("the bus is down")
            await kept.on_outputs(outputs)

        async with running_host(make_engine(), on_outputs=flaky) as (host, _):
            await host.add("r", prompt(3), LONG, b"")
            await kept.wait_final("r")
            assert not host.loop_ended and not host.stuck()
        # The two lost deliveries are the first two tokens; every later one came, in order.
        assert [len(o.output_token_ids) for o in kept.of("r")] == list(range(3, 41))

    asyncio.run(scenario())


def test_bookkeeping_gives_the_engines_truth(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        engine = make_engine()
        pool = engine.pool
        tokens = prompt(4)
        async with running_host(engine) as (host, outputs):
            await run_to_end(host, outputs, "held", tokens, hold_blocks=True)
            held = await host.held_block_ids("held")
            assert held is not None and held == engine.held_block_ids("held")
            assert all(pool.blocks[b].ref_cnt == 1 for b in held)
            total, used = host.pool_usage()
            assert total == pool.num_blocks and used >= len(held)
            assert await host.release_held("held")
            assert await host.held_block_ids("held") is None
            assert all(pool.blocks[b].ref_cnt == 0 for b in held)
            assert not await host.release_held("held")

            hashes = host.prompt_hashes(tokens, b"")
            pinned = await host.pin(hashes)
            ids = [b for b, _ in pinned]
            assert ids == held[: len(hashes)]  # the prompt's full blocks, cached in order
            assert [pool.blocks[b].ref_cnt for b in ids] == [1] * len(ids)
            assert host.block_checksums(ids) == [c for _, c in pinned]
            assert await host.num_leading_cached(hashes) == len(hashes)
            await host.unpin(ids)
            assert [pool.blocks[b].ref_cnt for b in ids] == [0] * len(ids)

    asyncio.run(scenario())


def test_stuck_while_a_step_hangs_past_the_bound(make_engine: EngineFactory) -> None:
    engine = make_engine()
    release = hang_steps(engine)

    async def scenario() -> None:
        async with running_host(engine, step_timeout_s=0.2) as (host, outputs):
            try:
                assert not host.stuck()
                await host.add("r", prompt(5), PLAIN, b"")
                await wait_for_condition(host.stuck, "the watchdog to see the hung step")
            finally:
                release.set()
            await outputs.wait_final("r")
            assert not host.stuck()

    asyncio.run(scenario())


def test_stop_leaves_no_engine_thread_running(make_engine: EngineFactory) -> None:
    def engine_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("engine")}

    async def scenario() -> None:
        before = engine_threads()
        async with running_host(make_engine()) as (host, outputs):
            await run_to_end(host, outputs, "r", prompt(6))
            await host.snapshot()  # starts the bookkeeping thread too
            assert len(engine_threads() - before) == 2
        assert not {t for t in engine_threads() - before if t.is_alive()}

    asyncio.run(scenario())
