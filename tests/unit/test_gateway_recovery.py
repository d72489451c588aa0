"""The gateway's decisions about one choice in flight, step by step."""

from __future__ import annotations

from services.gateway.recovery import Act, ChoiceWatch, RecoveryPolicy
from shared.messages import TokenChunk

POLICY = RecoveryPolicy(gap_wait_s=0.3, probe_after_s=5.0, stall_timeout_s=60.0, max_resumes=2)


def chunk(**fields: object) -> TokenChunk:
    values: dict[str, object] = {"request_id": "r", "index": 0, "token_ids": []} | fields
    return TokenChunk(**values)  # type: ignore[arg-type]


def test_a_healthy_stream_waits() -> None:
    watch = ChoiceWatch("p0", "e", progress_at=0.0)
    assert watch.decide(1.0, owner_alive=True, has_gap=False, policy=POLICY) is Act.WAIT


def test_a_gap_is_replayed_after_a_short_wait_and_only_once() -> None:
    watch = ChoiceWatch("p0", "e", progress_at=0.0)
    assert watch.decide(1.0, True, True, POLICY) is Act.WAIT  # just noticed
    assert watch.decide(1.2, True, True, POLICY) is Act.WAIT
    assert watch.decide(1.31, True, True, POLICY) is Act.REPLAY
    assert watch.decide(1.4, True, True, POLICY) is Act.WAIT  # its answer decides
    watch.replay_done()
    watch.on_chunk(chunk(token_ids=[1]), advanced=True, now=1.5)
    assert watch.gap_since is None


def test_silence_is_probed_and_a_long_stall_fails() -> None:
    watch = ChoiceWatch("p0", "e", progress_at=0.0)
    assert watch.decide(5.0, True, False, POLICY) is Act.REPLAY
    watch.replay_done()
    assert watch.decide(9.0, True, False, POLICY) is Act.WAIT
    assert watch.decide(10.0, True, False, POLICY) is Act.REPLAY
    watch.replay_done()
    assert watch.decide(60.0, True, False, POLICY) is Act.FAIL
    assert "no token came" in watch.reason


def test_a_prefill_predicted_to_run_long_may_stay_silent_that_long() -> None:
    """An 8B model's long prompt computes for minutes before its first token: the stall
    timeout counts from when the prediction (with its margin) runs out, and probes go on."""
    watch = ChoiceWatch("p0", "e", progress_at=0.0, quiet_until=300.0)
    assert watch.decide(5.0, True, False, POLICY) is Act.REPLAY
    watch.replay_done()
    assert watch.decide(200.0, True, False, POLICY) is Act.REPLAY
    watch.replay_done()
    assert watch.decide(202.0, True, False, POLICY) is Act.WAIT  # probed just now
    assert watch.decide(359.0, True, False, POLICY) is Act.REPLAY
    watch.replay_done()
    assert watch.decide(360.0, True, False, POLICY) is Act.FAIL
    flowing = ChoiceWatch("p0", "e", progress_at=0.0, quiet_until=300.0)
    flowing.on_chunk(chunk(token_ids=[1]), advanced=True, now=10.0)
    assert flowing.decide(70.0, True, False, POLICY) is Act.FAIL  # a stall after a token
    resumed = ChoiceWatch("p0", "e", progress_at=0.0)
    resumed.restart(10.0)
    resumed.accepted("p1", "e1", 10.0, quiet_for=100.0)
    assert resumed.decide(169.0, True, False, POLICY) is Act.REPLAY
    resumed.replay_done()
    assert resumed.decide(170.0, True, False, POLICY) is Act.FAIL


def test_a_dead_or_leaving_owner_resumes_up_to_the_limit() -> None:
    watch = ChoiceWatch("d0", "e", progress_at=0.0)
    assert watch.decide(1.0, owner_alive=False, has_gap=False, policy=POLICY) is Act.RESUME
    watch.restart(1.0)
    assert watch.owner == "" and watch.attempt == 1
    watch.accepted("p1", "e1", 1.1)
    watch.on_chunk(chunk(migrate=True), advanced=False, now=2.0)
    assert watch.decide(2.0, True, False, POLICY) is Act.RESUME and watch.reason == "its node left"
    watch.restart(2.0)
    watch.accepted("p2", "e2", 2.1)
    assert watch.decide(3.0, False, False, POLICY) is Act.FAIL
    assert watch.resumes == 2 and "moved 2 times" in watch.reason


def test_an_owner_notice_names_the_decode_node_even_after_its_tokens() -> None:
    watch = ChoiceWatch("p0", "e", progress_at=0.0)
    watch.restart(0.0)
    watch.on_chunk(chunk(owner="d1", owner_epoch="x"), advanced=False, now=0.1)
    watch.accepted("p0", "e", 0.2)  # the acceptance came after the notice: the notice stands
    assert (watch.owner, watch.owner_epoch, watch.noticed) == ("d1", "x", True)


def test_a_failed_replay_resumes() -> None:
    watch = ChoiceWatch("p0", "e", progress_at=0.0)
    assert watch.decide(5.0, True, False, POLICY) is Act.REPLAY
    assert watch.replay_failed(POLICY) is Act.RESUME and watch.asked_at is None
