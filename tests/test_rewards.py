"""atr_llm.rewards: the correctness reward against math-verify, its cache, the boxed-integer fast path, the truncated reward."""

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("math_verify")

from atr_llm import rewards  # noqa: E402


def test_reward_grades_and_counts_and_never_raises():
    r = rewards.CorrectnessReward()
    out = r(
        completions=[
            "so \\boxed{12}",
            "\\boxed{13}",
            "no answer here",
            None,
            [{"role": "assistant", "content": "\\boxed{12}"}],
        ],
        answer=["12", "12", "12", "12", "12"],
    )
    assert out == [1.0, 0.0, 0.0, 0.0, 1.0]
    stats = r.pop_stats()
    assert stats["reward/correct_frac"] == pytest.approx(0.4) and stats["reward/unparsable_frac"] > 0
    # off the main thread math-verify's signal timeouts cannot work: grading goes through a process
    result = {}
    t = threading.Thread(
        target=lambda: result.update(v=r(completions=["\\boxed{1/2}", "\\boxed{0.5}"], answer=["\\frac{1}{2}", "1/2"]))
    )
    t.start()
    t.join(60)
    assert result["v"] == [1.0, 1.0]


def test_reward_cache_gives_math_verifys_grades_and_grades_each_distinct_pair_once(monkeypatch):
    """Oracle: ``rewards.grade`` (math-verify) on every pair, uncached. The cache must give the same rewards and
    counts, grade a repeated pair once (also within one call), never keep a timeout, and drop the oldest first."""
    pairs = [
        ("so \\boxed{12}", "12"),
        ("\\boxed{13}", "12"),
        ("no answer here", "12"),
        ("\\boxed{1/2}", "\\frac{1}{2}"),
    ]
    pairs += [pairs[0], pairs[1], pairs[0], ("\\boxed{12}", "13")]
    expected = [1.0 if rewards.grade(c, g) == "correct" else 0.0 for c, g in pairs]
    assert expected == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    real_grade, calls = rewards.grade, []
    monkeypatch.setattr(rewards, "grade", lambda c, g, t=5: calls.append((c, g)) or real_grade(c, g, t))
    r = rewards.CorrectnessReward()
    completions, answers = [c for c, _ in pairs], [g for _, g in pairs]
    assert r(completions=completions, answer=answers) == expected
    assert sorted(calls) == sorted(set(pairs))  # 5 distinct pairs graded once each
    stats = r.pop_stats()
    assert stats["reward/correct_frac"] == pytest.approx(4 / 8) and stats["reward/unparsable_frac"] == pytest.approx(
        1 / 8
    )
    calls.clear()
    assert r(completions=completions[::-1], answer=answers[::-1]) == expected[::-1] and calls == []
    assert r.pop_stats() == stats  # counts are of rewards given, cached or not
    # a timeout is not kept: the pair is graded again next time
    outcomes = iter(["timeout", "correct", "correct"])
    monkeypatch.setattr(rewards, "grade", lambda c, g, t=5: calls.append((c, g)) or next(outcomes))
    fresh = rewards.CorrectnessReward()
    assert fresh(completions=["x"], answer=["1"]) == [0.0] and fresh(completions=["x"], answer=["1"]) == [1.0]
    assert fresh(completions=["x"], answer=["1"]) == [1.0] and calls == [("x", "1"), ("x", "1")]
    # bounded: with room for 2, the oldest goes first; cache_size=0 keeps nothing
    monkeypatch.setattr(rewards, "grade", lambda c, g, t=5: "wrong")
    small = rewards.CorrectnessReward(cache_size=2)
    for c in ("a", "b", "c"):
        small(completions=[c], answer=["1"])
    assert list(small._cache) == [("b", "1"), ("c", "1")]
    off = rewards.CorrectnessReward(cache_size=0)
    off(completions=["a", "a"], answer=["1", "1"])
    assert off._cache == {}
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="cache_size must be a non-negative int"):
            rewards.CorrectnessReward(cache_size=bad)


_STEP_TEXT = st.text(alphabet="0123456789 +-=\n", max_size=40)
_DIGITS = st.text(alphabet="0123456789", min_size=1, max_size=25)


@settings(max_examples=300, deadline=None)
@given(
    steps=_STEP_TEXT,
    boxed=st.tuples(st.booleans(), _DIGITS).map(lambda t: ("-" if t[0] else "") + t[1]),
    gold=st.one_of(
        st.integers(-(10**20), 10**20).map(str),
        st.tuples(st.booleans(), _DIGITS).map(lambda t: ("-" if t[0] else "") + t[1]),
    ),
    same=st.booleans(),
)
def test_boxed_integer_fast_path_gives_math_verifys_grade_on_its_whole_domain(steps, boxed, gold, same):
    """Oracle: math-verify (``math_verify_grade``). Every completion of the fast path's domain -- any text over digits,
    spaces, ``+ - =`` and newlines, then ``\\boxed{n}`` -- gets math-verify's (status, extracted), equal integers
    written differently included (leading zeros, ``-0``); a fast path comparing strings, or extracting ``int(n)``,
    fails."""
    if same:
        gold = str(int(boxed))
    completion = steps + "\\boxed{" + boxed + "}"
    fast = rewards.boxed_integer_grade(completion, gold)
    assert fast is not None
    assert fast == rewards.math_verify_grade(completion, gold)


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("x = 5\n\\boxed{5}", "5"),  # a letter before the box
        ("\\boxed{5} ", "5"),  # text after it
        ("\\boxed{5}}", "5"),
        ("\\boxed{+5}", "5"),
        ("\\boxed{5.0}", "5"),
        ("\\boxed{5}", "5.0"),  # a gold that is not an integer
        ("$5$ \\boxed{5}", "5"),
        ("\\boxed{1}\n\\boxed{2}", "2"),
        ("5 + 2 = 7", "7"),  # no box
    ],
)
def test_boxed_integer_fast_path_leaves_every_other_pair_to_math_verify(completion, gold, monkeypatch):
    """Outside its domain the fast path answers None and ``grade_with_answer`` is math-verify's grade."""
    assert rewards.boxed_integer_grade(completion, gold) is None
    calls = []
    real = rewards.math_verify_grade
    monkeypatch.setattr(rewards, "math_verify_grade", lambda c, g, t=5: calls.append(c) or real(c, g, t))
    assert rewards.grade_with_answer(completion, gold) == real(completion, gold) and calls == [completion]


def test_truncated_reward_scores_completions_cut_at_the_cap_and_counts_them():
    r = rewards.CorrectnessReward(truncated_reward=0.0, eos_token_ids=[7])
    out = r(
        completions=["\\boxed{4}", "\\boxed{4}}}}}", "\\boxed{5}"],
        answer=["4", "4", "4"],
        completion_ids=[[1, 2, 7], [1, 2, 3, 3], [1, 2, 7]],  # the second has no eos: cut at the cap
    )
    assert out == [1.0, 0.0, 0.0]  # a right answer padded to the cap scores truncated_reward
    stats = r.pop_stats()
    assert stats["reward/truncated_frac"] == pytest.approx(1 / 3) and stats["reward/correct_frac"] == pytest.approx(
        1 / 3
    )
    plain = rewards.CorrectnessReward()
    assert plain(completions=["\\boxed{4}}}}}"], answer=["4"]) == [1.0]  # without it: graded like any other
    assert "reward/truncated_frac" not in plain.pop_stats()
    with pytest.raises(ValueError, match="needs eos_token_ids"):
        rewards.CorrectnessReward(truncated_reward=0.0)
    with pytest.raises(ValueError, match="finite"):
        rewards.CorrectnessReward(truncated_reward=float("nan"), eos_token_ids=[7])
    with pytest.raises(ValueError, match="no completion_ids"):
        r(completions=["\\boxed{4}"], answer=["4"])
