"""The fault tally's account of tokens against the fault-free run (bench/faults.py)."""

from __future__ import annotations

from bench.faults import Outcome, near_tie, tally


def words(text: str) -> list[int]:
    """A stand-in tokenizer: one id per word."""
    return [hash(w) for w in text.split()]


def outcome(picked: list[str], top: list[dict[str, float]] | None = None) -> Outcome:
    top = top if top is not None else [{t: 0.0} for t in picked]
    return Outcome(text="".join(picked), finish_reason="length", picked=picked, top=top)


def test_a_repeated_token_is_counted_duplicated() -> None:
    want = outcome([" a", " b", " c"])
    got = outcome([" a", " b", " b", " c"])
    result = tally("f", [got], [want], words)
    assert (result.duplicated, result.missing, result.ties) == (1, 0, 0)


def test_outputs_that_part_at_a_near_tie_are_compared_up_to_it() -> None:
    tie = {" b": -0.6931, " x": -0.6935}
    want = outcome([" a", " b", " c", " d"], [{" a": 0.0}, tie, {" c": 0.0}, {" d": 0.0}])
    got = outcome([" a", " x", " y", " z"], [{" a": 0.0}, tie, {" y": 0.0}, {" z": 0.0}])
    assert near_tie(got, want) == 1
    result = tally("f", [got], [want], words)
    assert (result.duplicated, result.missing, result.ties) == (0, 0, 1)


def test_a_token_far_from_the_top_is_no_tie() -> None:
    want = outcome([" a", " b", " c"], [{" a": 0.0}, {" b": -0.1, " x": -2.5}, {" c": 0.0}])
    got = outcome([" a", " x", " c"], [{" a": 0.0}, {" x": -0.1, " b": -2.5}, {" c": 0.0}])
    assert near_tie(got, want) is None
    result = tally("f", [got], [want], words)
    assert (result.duplicated, result.missing, result.ties) == (1, 1, 0)


def test_a_token_outside_the_other_runs_candidates_is_no_tie() -> None:
    want = outcome([" a", " b"], [{" a": 0.0}, {" b": -0.5, " q": -0.5}])
    got = outcome([" a", " x"], [{" a": 0.0}, {" x": -0.5, " q": -0.5}])
    assert near_tie(got, want) is None


def test_a_duplicate_before_a_tie_still_counts() -> None:
    tie = {" c": -0.5, " x": -0.5}
    want = outcome([" a", " b", " c"], [{" a": 0.0}, {" b": 0.0}, tie])
    got = outcome([" a", " a", " x"], [{" a": 0.0}, {" a": 0.0}, tie])
    # Parted first at position 1, not at a tie: the whole outputs are compared.
    assert near_tie(got, want) is None
    result = tally("f", [got], [want], words)
    assert (result.duplicated, result.missing, result.ties) == (2, 2, 0)
