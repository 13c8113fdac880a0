"""The train-rollout mismatch metrics (``atr_llm.rollout_mismatch``): against a per-sequence brute force written with
``math`` on Python floats, in closed form when the engine's log-probs are the training policy's moved by a known
amount, and in a tiny CPU run whose stand-in rollout engine reports the model's own log-probs moved by a known
amount per token (``tests/test_verl_oracle.py`` holds them to verl 0.9.1's own ``compute_offpolicy_metrics``)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from grpo_helpers import grpo_config_kwargs, tiny_trainer
from hypothesis import given, settings
from hypothesis import strategies as st

from atr_llm import tiny
from atr_llm.rollout_mismatch import MISMATCH_NAMES, MISMATCH_PREFIX, rollout_mismatch_metrics


def brute_force(train: list[list[float]], rollout: list[list[float]]) -> dict[str, float]:
    """The metrics from their definitions, one sequence (a list of its valid tokens' log-probs) at a time."""
    tokens = [(p, q) for ts, rs in zip(train, rollout) for p, q in zip(ts, rs)]
    seqs = [(ts, rs) for ts, rs in zip(train, rollout) if ts]
    clamp = lambda x: max(-20.0, min(20.0, x))  # noqa: E731  (verl's SAFETY_BOUND)
    d = [sum(rs) / len(rs) - sum(ts) / len(ts) for ts, rs in seqs]
    s = [sum(t - r for t, r in zip(ts, rs)) for ts, rs in seqs]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {
        "kl": mean([q - p for p, q in tokens]),
        "k3_kl": mean([math.exp(p - q) - 1 - (p - q) for p, q in tokens]),
        "chi2_token": mean([math.exp(2 * clamp(p - q)) for p, q in tokens]) - 1,
        "chi2_seq": mean([math.exp(2 * clamp(x)) for x in s]) - 1,
        "training_ppl": mean([math.exp(-sum(ts) / len(ts)) for ts, _ in seqs]),
        "training_log_ppl": mean([-sum(ts) / len(ts) for ts, _ in seqs]),
        "rollout_ppl": mean([math.exp(-sum(rs) / len(rs)) for _, rs in seqs]),
        "rollout_log_ppl": mean([-sum(rs) / len(rs) for _, rs in seqs]),
        "log_ppl_diff": mean(d),
        "log_ppl_abs_diff": mean([abs(x) for x in d]),
        "log_ppl_diff_max": max(d),
        "log_ppl_diff_min": min(d),
        "ppl_ratio": mean([math.exp(x) for x in d]),
        "seq_log_ratio_mean": mean(s),
        "seq_log_ratio_max": max(abs(x) for x in s),
    }


@st.composite
def batches(draw):
    B, T = draw(st.integers(1, 5)), draw(st.integers(1, 7))
    logp = st.floats(-12.0, 0.0, allow_nan=False)
    train = [[draw(logp) for _ in range(T)] for _ in range(B)]
    shift = st.floats(-3.0, 3.0, allow_nan=False)
    rollout = [[min(0.0, t + draw(shift)) for t in row] for row in train]
    mask = [[draw(st.booleans()) for _ in range(T)] for _ in range(B)]
    unscored = [[draw(st.integers(0, 9)) == 0 for _ in range(T)] for _ in range(B)]  # vLLM's NaN
    mask[0][0], unscored[0][0] = True, False  # at least one valid token
    return train, rollout, mask, unscored


@settings(max_examples=150, deadline=None)
@given(batches())
def test_the_metrics_match_a_brute_force_of_their_definitions(batch):
    train, rollout, mask, unscored = batch
    rollout_t = torch.tensor(rollout, dtype=torch.float64)
    rollout_t[torch.tensor(unscored)] = math.nan
    got = rollout_mismatch_metrics(torch.tensor(train, dtype=torch.float64), rollout_t, torch.tensor(mask))
    keep = [[m and not u for m, u in zip(mr, ur)] for mr, ur in zip(mask, unscored)]
    valid = lambda rows: [[x for x, k in zip(r, kr) if k] for r, kr in zip(rows, keep)]  # noqa: E731
    want = brute_force(valid(train), valid(rollout))
    assert list(got) == list(MISMATCH_NAMES)
    for name in MISMATCH_NAMES:
        assert got[name] == pytest.approx(want[name], rel=1e-9, abs=1e-9), name


@pytest.mark.parametrize("c", [0.3, -0.2, 1e-3])
def test_a_known_shift_gives_the_closed_forms(c):
    """log mu = log pi_old + c on every valid token: k1 = c, k3 = e^-c + c - 1, chi2 = e^-2c - 1, d = c, the
    perplexity ratio e^c and the sequence log-ratio -c x its length."""
    g = torch.Generator().manual_seed(1)
    train = torch.log_softmax(torch.randn(3, 5, 11, generator=g, dtype=torch.float64), -1)[..., 0]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    got = rollout_mismatch_metrics(train, train + c, mask)
    lengths = torch.tensor([5.0, 2.0, 3.0], dtype=torch.float64)
    want = {
        "kl": c, "k3_kl": math.exp(-c) + c - 1, "chi2_token": math.exp(-2 * c) - 1,
        "chi2_seq": float(torch.exp(-2 * c * lengths).mean()) - 1, "log_ppl_diff": c, "log_ppl_abs_diff": abs(c),
        "log_ppl_diff_max": c, "log_ppl_diff_min": c, "ppl_ratio": math.exp(c),
        "seq_log_ratio_mean": -c * float(lengths.mean()), "seq_log_ratio_max": abs(c) * 5,
    }
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=1e-12, abs=1e-15), name
    assert got["rollout_log_ppl"] == pytest.approx(got["training_log_ppl"] - c, rel=1e-12)


def test_no_valid_token_gives_no_metric_and_shapes_must_match():
    z = torch.zeros(2, 3)
    assert rollout_mismatch_metrics(z, torch.full((2, 3), math.nan), torch.ones(2, 3, dtype=torch.bool)) == {}
    with pytest.raises(ValueError, match=r"one shape, got \(2, 3\), \(2, 4\)"):
        rollout_mismatch_metrics(z, torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))


def token_shift(token_id: int) -> float:
    """The stand-in engine's error on a token: log mu = log pi + this (-0.06 ... 0.06, by the token's id)."""
    return 0.03 * (token_id % 5 - 2)


def stand_in_engine(trainer_cls):
    """``trainer_cls`` whose generation reports, as vLLM does, a log-prob per sampled token: the model's own at the
    sampling temperature, moved by ``token_shift``; each generation's completions are kept in ``generations``."""

    class StandInEngine(trainer_cls):
        generations: list[list[list[int]]]

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            assert logprobs is None and len(completion_ids) == len(prompt_ids)
            logprobs = []
            with torch.no_grad():
                for prompt, completion in zip(prompt_ids, completion_ids):
                    ids = torch.tensor([list(prompt) + list(completion)])
                    logits = self.model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / self.temperature
                    own = torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(completion)[:, None])
                    logprobs.append([float(x) + token_shift(t) for x, t in zip(own[:, 0], completion)])
            self.generations = getattr(self, "generations", []) + [[list(c) for c in completion_ids]]
            return completion_ids, logprobs

    return StandInEngine


def test_a_run_with_a_stand_in_engine_logs_its_known_mismatch(tmp_path):
    """One generation and one loss call per step: the step's logged k1 is the mean shift over its valid tokens, k3
    and chi-squared follow from the shifts alone, and the sequence log-ratio is minus each completion's summed shift."""
    from atr_llm.trainer import ATRGRPOConfig, ATRGRPOTrainer

    torch.set_default_dtype(torch.float32)
    try:
        tok = tiny.build_tiny_tokenizer()
        config = ATRGRPOConfig(**grpo_config_kwargs(tmp_path, method="atr", num_iterations=1, max_steps=2))
        trainer = tiny_trainer(tok, config, trainer_cls=stand_in_engine(ATRGRPOTrainer))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
    finally:
        torch.set_default_dtype(torch.float64)
    rows = [row for row in trainer.state.log_history if MISMATCH_PREFIX + "kl" in row]
    assert len(rows) == len(trainer.generations) == 2
    for row, completions in zip(rows, trainer.generations):
        shifts = [[token_shift(t) for t in c] for c in completions if c]
        flat = [x for s in shifts for x in s]
        seq = [-sum(s) for s in shifts]
        want = {
            "kl": sum(flat) / len(flat),
            "k3_kl": sum(math.exp(-x) + x - 1 for x in flat) / len(flat),
            "chi2_token": sum(math.exp(-2 * x) for x in flat) / len(flat) - 1,
            "chi2_seq": sum(math.exp(2 * x) for x in seq) / len(seq) - 1,
            "log_ppl_diff": sum(sum(s) / len(s) for s in shifts) / len(shifts),
            "seq_log_ratio_mean": sum(seq) / len(seq),
            "seq_log_ratio_max": max(abs(x) for x in seq),
        }
        for name, value in want.items():
            assert row[MISMATCH_PREFIX + name] == pytest.approx(value, abs=2e-5), name
        assert row[MISMATCH_PREFIX + "rollout_log_ppl"] == pytest.approx(
            row[MISMATCH_PREFIX + "training_log_ppl"] - want["log_ppl_diff"], abs=2e-5
        )
