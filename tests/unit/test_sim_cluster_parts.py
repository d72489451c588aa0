"""Parts of the cluster simulator against plain versions of the same thing: the decode node's
closed-form stretches against stepping one step at a time, the catalogue's answers against
asking every pool, and the cost models against the figures they come from."""

from __future__ import annotations

import math
import random

import pytest

from crescent.sim.catalogue import Catalogue, Match, matched_by
from crescent.sim.cli import POLICIES
from crescent.sim.costs import KV_BYTES_PER_TOKEN, LOCAL_DECODE, LOCAL_PREFILL, cost_model
from crescent.sim.nodes import DecodeNode, Job
from crescent.sim.pool import BlockPool, block_key
from services.scheduler.cluster import NodeLoad
from services.scheduler.timing import StepCoefficients, decode_step_seconds, prefill_seconds
from services.tierd.policy import POLICIES as TIERD_POLICIES

COEF = StepCoefficients(0.01, 1e-3, 2e-5)


def stepped(arrivals: list[tuple[float, int, int]]) -> list[float]:
    """Finish times of (arrival, prompt, output) jobs on a decode node stepped one step at a
    time: arrivals join at the next step boundary, a step of ``b`` jobs over ``c`` tokens
    takes ``decode_step_seconds``."""
    pending = sorted(enumerate(arrivals), key=lambda x: x[1][0])
    running: dict[int, list[int]] = {}  # job -> [tokens left, context]
    done = [math.nan] * len(arrivals)
    t = 0.0
    while pending or running:
        if not running:
            t = max(t, pending[0][1][0])
        while pending and pending[0][1][0] <= t:
            i, (_, prompt, output) = pending.pop(0)
            running[i] = [output - 1, prompt + 1]
        context = sum(c for _, c in running.values())
        t += decode_step_seconds(COEF, len(running), context)
        for i in list(running):
            running[i][0] -= 1
            running[i][1] += 1
            if running[i][0] == 0:
                done[i] = t
                del running[i]
    return done


def closed_form(arrivals: list[tuple[float, int, int]]) -> list[float]:
    """The same jobs through ``DecodeNode``, driven as the simulator drives it."""
    load = NodeLoad("d", "decode", 0, 0, 10**6, 10**6, 16, 0.0)
    node = DecodeNode(load, COEF, None)
    jobs = [Job(i, a, p, o, ()) for i, (a, p, o) in enumerate(arrivals)]
    events = sorted((j.arrival, 0, j.index) for j in jobs)
    while events or node.wake < math.inf:
        if events and events[0][0] < node.wake:
            now, _, i = events.pop(0)
            node.waiting.append(jobs[i])
            if not node.ending:
                node.start = now
                node.admit()
                node.plan()
            else:
                steps, at = node.join_boundary(now)
                if at < node.wake:
                    node.wake, node.wake_steps = at, steps
        else:
            now = node.wake
            node.advance(node.wake_steps, now)
            node.admit()
            node.plan()
    return [j.finished for j in jobs]


@pytest.mark.parametrize("seed", range(40))
def test_decode_stretches_end_where_stepping_one_step_at_a_time_ends(seed: int) -> None:
    rng = random.Random(seed)
    arrivals = [
        (rng.choice((0.0, rng.uniform(0, 3))), rng.randrange(1, 2000), rng.randrange(2, 60))
        for _ in range(rng.randrange(1, 12))
    ]
    assert closed_form(arrivals) == pytest.approx(stepped(arrivals), rel=1e-9, abs=1e-9)


def test_a_decode_node_reports_what_it_runs() -> None:
    load = NodeLoad("d", "decode", 0, 0, 100, 100, 16, 0.0)
    node = DecodeNode(load, COEF, None)
    node.waiting.extend([Job(0, 0.0, 30, 5, (), blocks=3), Job(1, 0.0, 50, 9, (), blocks=4)])
    node.admit()
    node.plan()
    node.report(node.start + node.elapsed(2))
    assert (load.running_seqs, load.free_blocks) == (2, 93)
    assert load.finishing == ((2, 33), (6, 53))


def test_catalogue_answers_what_asking_every_pool_answers() -> None:
    rng = random.Random(3)
    pools = {f"n{i:02d}": BlockPool(rng.choice((3, 6, 50)), "lru") for i in range(30)}
    catalogue, lean = Catalogue(pools), Catalogue(pools)
    chains = [[0, *rng.sample(range(1, 40), rng.randrange(0, 6))] for _ in range(60)]
    matched = matched_by([block_key(i) for i in chain] for chain in chains)
    for step in range(400):
        ids = rng.choice(chains)
        node_id = rng.choice(sorted(pools))
        pools[node_id].access(ids, float(step))
        keys = [block_key(i) for i in ids]
        catalogue.stored(node_id, keys)
        lean.stored(node_id, [key for key in keys if key in matched])
        asked = rng.choice(chains)
        match = catalogue.match([block_key(i) for i in asked])
        # Storing only the blocks prompts are matched by changes no answer.
        assert _answers(lean.match([block_key(i) for i in asked])) == _answers(match)
        answered = {h.node_id: h.num_blocks for h in match.holders}
        for node, pool in pools.items():
            held = pool.lookup(asked)
            if node in answered:
                assert answered[node] == held
            elif match.common is not None and match.common.holds(node):
                assert held == match.common.num_blocks == 1
            else:
                assert held == 0
        if match.common is not None:
            listed = list(match.common.ascending())
            assert listed == sorted(listed)


def _answers(match: Match) -> tuple[object, ...]:
    common = match.common
    return (match.holders, None if common is None else list(common.ascending()))


def test_the_cli_knows_tierds_policies() -> None:
    assert set(POLICIES) == set(TIERD_POLICIES)


def test_the_local_model_reproduces_the_engine_figures() -> None:
    local = cost_model("local")
    for tokens, rate in LOCAL_PREFILL:
        seconds = prefill_seconds(local.prefill, tokens, 0, local.max_num_batched_tokens)
        assert tokens / seconds == pytest.approx(rate, rel=0.02)
    for batch, rate in LOCAL_DECODE:
        seconds = decode_step_seconds(local.decode, batch, batch * 128)
        assert batch / seconds == pytest.approx(rate, rel=0.15)


def test_the_a800_model_follows_its_stated_figures() -> None:
    a800 = cost_model("a800")
    assert KV_BYTES_PER_TOKEN == 327_680  # 2 x 80 layers x 8 heads x 128 dims x 2 bytes
    assert a800.block_bytes == 512 * KV_BYTES_PER_TOKEN
    # 138 GB of weights read at 70% of 8 x 2,039 GB/s: one step's floor.
    assert a800.decode.base_s == pytest.approx(138e9 / (0.7 * 8 * 2.039e12))
    # 2 x 69e9 FLOPs a token at half of 8 x 312 TFLOPS.
    assert a800.prefill.per_token_s == pytest.approx(138e9 / (0.5 * 8 * 312e12))
    assert a800.pull_seconds(0) == 0.0
    assert a800.pull_seconds(1) == pytest.approx(0.002 + a800.block_bytes / 87e9)
