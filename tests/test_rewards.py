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


# ---------------------------------------------------------------------------------------------------------------
# reward_control 'shuffled': the no-signal control
# ---------------------------------------------------------------------------------------------------------------
class _Fixed:
    """A grader that returns the values it is given per call (the oracle: what was graded), and counts."""

    __name__ = "fixed"

    def __init__(self):
        self.popped = 0

    def __call__(self, completions=None, trainer_state=None, **kwargs):
        return [float(c) for c in completions]

    def pop_stats(self):
        self.popped += 1
        return {"reward/correct_frac": 0.5}


class _State:
    def __init__(self, step):
        self.global_step = step


@settings(max_examples=40, deadline=None)
@given(
    group_size=st.integers(2, 9),
    groups=st.integers(1, 12),
    seed=st.integers(0, 2**31),
    step=st.integers(0, 10**6),
    data=st.data(),
)
def test_shuffled_rewards_keep_every_groups_values_and_are_the_same_on_resume(group_size, groups, seed, step, data):
    graded = data.draw(
        st.lists(st.sampled_from([0.0, 1.0, 0.5, -1.0]), min_size=group_size * groups, max_size=group_size * groups)
    )
    first = rewards.GroupShuffledReward(_Fixed(), group_size, seed)(completions=graded, trainer_state=_State(step))
    for g in range(groups):  # each group's multiset of rewards (hence its mean, std, all-equal flag) is unchanged
        block = slice(g * group_size, (g + 1) * group_size)
        assert sorted(first[block]) == sorted(graded[block])
    # a fresh wrapper (a resumed run) at the same step draws the same permutation
    again = rewards.GroupShuffledReward(_Fixed(), group_size, seed)(completions=graded, trainer_state=_State(step))
    assert again == first


def test_shuffled_rewards_carry_no_information_about_which_completion_was_correct():
    """4,000 groups of 8 with one correct completion each, always the first: graded, the first completion's reward
    is 1 every time; shuffled, it is 1 in about 1/8 of the groups (binomial: 500 +- 3 sd of 21), and the correct
    one lands on each of the 8 places about equally often."""
    g, n = 8, 4000
    graded = ([1.0] + [0.0] * (g - 1)) * n
    out = rewards.GroupShuffledReward(_Fixed(), g, seed=0)(completions=graded, trainer_state=_State(5))
    by_place = [sum(out[i * g + j] for i in range(n)) for j in range(g)]
    assert sum(by_place) == n  # one correct per group, still
    assert all(abs(count - n / g) < 3 * (n * (1 / g) * (1 - 1 / g)) ** 0.5 for count in by_place), by_place


def test_shuffled_rewards_differ_between_steps_and_between_calls_at_one_step():
    graded = list(map(float, range(8))) * 4
    r = rewards.GroupShuffledReward(_Fixed(), 8, seed=3)
    a = r(completions=graded, trainer_state=_State(10))
    b = r(completions=graded, trainer_state=_State(10))  # a second call at the same step: another draw
    c = r(completions=graded, trainer_state=_State(11))
    assert a != b and a != c and b != c
    assert rewards.GroupShuffledReward(_Fixed(), 8, seed=4)(completions=graded, trainer_state=_State(10)) != a


def test_shuffled_rewards_refuse_partial_groups_and_pass_the_graders_counts_through():
    grader = _Fixed()
    r = rewards.GroupShuffledReward(grader, 4, seed=0)
    with pytest.raises(ValueError, match="not a multiple of num_generations = 4"):
        r(completions=[1.0] * 6, trainer_state=_State(0))
    assert r.pop_stats() == {"reward/correct_frac": 0.5} and grader.popped == 1
    assert r.__name__ == "fixed"  # TRL logs rewards/<name>/mean under the grader's name
    for bad in (1, 0, True, 2.0):
        with pytest.raises(ValueError, match="group_size"):
            rewards.GroupShuffledReward(grader, bad, seed=0)


def test_reward_control_is_refused_by_name_before_any_work():
    from atr_llm.config import ScriptArguments

    assert ScriptArguments(reward_control="shuffled").reward_control == "shuffled"
    with pytest.raises(ValueError, match="reward_control"):
        ScriptArguments(reward_control="shufled")
