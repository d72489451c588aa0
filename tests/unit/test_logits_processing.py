"""Per-sequence logits rules against a reference computed element by element in float32, and
through the sampler: greedy follows the processed logits, logprobs stay those of the model."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch

from shared.errors import InvalidRequestError
from shared.model.logits_processing import SequenceLogitsProcessor, apply_bitmask
from shared.model.sampler import Sampler
from shared.sampling_params import SamplingParams

VOCAB = 64
EOS = (2,)
f32 = np.float32


def reference(
    logits: list[float], params: SamplingParams, prompt: list[int], completion: list[int]
) -> list[float]:
    """The documented rules, one element at a time, in float32 and in the documented order."""
    out = [f32(x) for x in logits]
    for token, bias in params.logit_bias:
        out[token] = f32(out[token] + f32(bias))
    r = f32(params.repetition_penalty)
    if params.repetition_penalty != 1.0:
        for token in set(prompt) | set(completion):
            out[token] = f32(out[token] / r) if out[token] > 0 else f32(out[token] * r)
    counts = Counter(completion)
    if params.frequency_penalty or params.presence_penalty:
        for token in range(len(out)):
            c = f32(counts[token])
            penalty = f32(c * f32(params.frequency_penalty))
            penalty = f32(penalty + f32(c > 0) * f32(params.presence_penalty))
            out[token] = f32(out[token] - penalty)
    if len(completion) < params.min_tokens:
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(EOS))
        for token in stops:
            out[token] = f32(-np.inf)
    return [float(x) for x in out]


def processed(
    params: SamplingParams, prompt: list[int], completion: list[int], logits: torch.Tensor
) -> list[float]:
    """What the processor makes of ``logits`` after the completion so far."""
    rules = SequenceLogitsProcessor(params, VOCAB, prompt, EOS)
    for token in completion:
        assert rules.accept(token)
    row = logits.clone()
    rules.apply(row.numpy())
    return row.tolist()


def random_case(seed: int) -> tuple[torch.Tensor, list[int], list[int]]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(VOCAB, generator=gen) * 4
    prompt = torch.randint(0, VOCAB, (12,), generator=gen).tolist()
    completion = torch.randint(3, VOCAB, (20,), generator=gen).tolist()
    return logits, prompt, completion


CASES = {
    "frequency": SamplingParams(frequency_penalty=0.7),
    "presence": SamplingParams(presence_penalty=1.3),
    "negative penalties": SamplingParams(frequency_penalty=-0.4, presence_penalty=-2.0),
    "repetition": SamplingParams(repetition_penalty=1.8),
    "repetition below 1": SamplingParams(repetition_penalty=0.6),
    "bias": SamplingParams(logit_bias=((5, 100.0), (6, -100.0), (7, 0.25))),
    "everything": SamplingParams(
        max_tokens=64,
        frequency_penalty=0.5,
        presence_penalty=0.5,
        repetition_penalty=1.3,
        logit_bias=((9, 3.0), (10, -1.5)),
        min_tokens=30,
        stop_token_ids=(11, 12),
    ),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_rule_equals_the_reference_exactly(name: str, seed: int) -> None:
    logits, prompt, completion = random_case(seed)
    params = CASES[name]
    expected = reference(logits.tolist(), params, prompt, completion)
    assert processed(params, prompt, completion, logits) == expected
    assert expected != logits.tolist()  # the rule changed something


def test_min_tokens_bans_stop_tokens_only_until_reached() -> None:
    logits, prompt, _ = random_case(4)
    params = SamplingParams(max_tokens=10, min_tokens=3, stop_token_ids=(7,))
    before = processed(params, prompt, [20, 21], logits)
    assert before[2] == before[7] == float("-inf")
    assert before[8] == logits[8].item()
    assert processed(params, prompt, [20, 21, 22], logits) == logits.tolist()
    # With ignore_eos only the stop token ids are banned.
    ignoring = dataclasses.replace(params, ignore_eos=True)
    out = processed(ignoring, prompt, [], logits)
    assert out[7] == float("-inf") and out[2] == logits[2].item()


def test_a_resumed_sequence_counts_the_completion_that_ends_its_prompt() -> None:
    logits, prompt, completion = random_case(5)
    params = SamplingParams(max_tokens=40, frequency_penalty=0.9, presence_penalty=0.3)
    straight = processed(params, prompt, completion, logits)
    resumed = dataclasses.replace(params, max_tokens=30, output_offset=12)
    rules = SequenceLogitsProcessor(resumed, VOCAB, prompt + completion[:12], EOS)
    for token in completion[12:]:
        rules.accept(token)
    row = logits.clone()
    rules.apply(row.numpy())
    assert row.tolist() == straight
    assert rules.generated == len(completion)


def test_apply_bitmask_keeps_exactly_the_set_bits() -> None:
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 70, generator=gen)
    mask = torch.randint(-(2**31), 2**31 - 1, (3, 3), dtype=torch.int32, generator=gen)
    out = logits.clone()
    for b in range(3):
        apply_bitmask(out[b].numpy(), mask[b].numpy())
    for b in range(3):
        for t in range(70):
            allowed = (int(mask[b, t // 32]) >> (t % 32)) & 1
            assert out[b, t].item() == (logits[b, t].item() if allowed else float("-inf"))


def test_the_sampler_picks_the_processed_argmax_and_reports_raw_logprobs() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3, 0.0001] + [1e-6] * (VOCAB - 4)] * 2))
    params = SamplingParams(temperature=0, logprobs=1, logit_bias=((1, -100.0),))
    rules = SequenceLogitsProcessor(params, VOCAB, [5], EOS)
    out = Sampler().sample(logits, [params, params], [0, 0], [rules, None])
    assert out[0].token_id == 2  # token 1 is biased away
    assert out[1].token_id == 1  # the row without rules is untouched
    raw = torch.log_softmax(logits[0], dim=-1)
    assert out[0].logprobs is not None
    assert out[0].logprobs.logprob == pytest.approx(raw[2].item())
    assert out[0].logprobs.top[0][0] == 1  # the model's own favourite, bias or not


def test_a_row_whose_rules_fail_fails_alone() -> None:
    class Broken(SequenceLogitsProcessor):
        def apply(self, row: np.ndarray, mask: np.ndarray | None = None) -> None:
            raise RuntimeError("boom")

    logits = torch.randn(2, VOCAB)
    params = SamplingParams(temperature=0, presence_penalty=1.0)
    broken = Broken(params, VOCAB, [1], EOS)
    out = Sampler().sample(logits, [params, params], [0, 0], [broken, None])
    assert out[0].error is not None and "boom" in out[0].error
    assert out[1].error is None and out[1].token_id == int(logits[1].argmax())


@pytest.mark.parametrize(
    ("values", "param"),
    [
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"presence_penalty": -2.1}, "presence_penalty"),
        ({"presence_penalty": float("nan")}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logit_bias": ((1, 101.0),)}, "logit_bias"),
        ({"logit_bias": ((-1, 1.0),)}, "logit_bias"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"stop_token_ids": (-3,)}, "stop_token_ids"),
    ],
)
def test_out_of_range_values_are_refused(values: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        SamplingParams(max_tokens=16, **values)  # type: ignore[arg-type]
    assert caught.value.param == param


def test_only_rules_that_change_something_need_a_processor() -> None:
    assert not SamplingParams(repetition_penalty=1.0, frequency_penalty=0.0).processes_logits
    assert SamplingParams(min_tokens=1).processes_logits
    assert SamplingParams(grammar="x").processes_logits
