r"""Equivalences between rules, each an executable check: two routes through ``atr_theory.policy_loss`` that
share no code for the rule itself, compared by the gradient autograd gives each on random float64 batches.

The paper's framework says a rule is the set of tokens it keeps and what a kept token's gradient is; two rules that
keep the same tokens with the same weight are one rule whatever their losses look like. The checks below state such
identities between rules the field ships under different names (verl's bypass-mode rejection and ATR; DPPO's
binary KL and TRGPPO's range; OPSM and verl's sequence k1 mask; GSPO and a sequence-level clip) and, where an
identity needs a condition, a failing check with its counterexample when the condition is dropped.
``python -m sims.verify_theorems`` writes them into ``figures/paper/equivalences.{md,json}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .layers import RolloutCorrection, SequenceMask
from .loss import policy_loss
from .ranges import kl3_clip_range

__all__ = ["EQUIVALENCES", "Equivalence", "check", "random_batch"]

Route = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
DELTA = 0.07


@dataclass(frozen=True)
class Equivalence:
    """``left`` and ``right`` give the same gradient (``holds_expected``) or do not (a counterexample is reported)."""

    id: str
    statement: str
    left: Route
    right: Route
    holds_expected: bool
    per_token_advantages: bool = False
    scale: float = 0.4
    counterexample: Callable[[], tuple[torch.Tensor, ...]] | None = None
    """A constructed batch on which the two differ (where random batches rarely show it)."""


def random_batch(seed: int, per_token: bool, scale: float, B: int = 6, T: int = 10):
    """float64 log-probabilities ``<= 0`` (old in [-3, -0.01], new = old + scale N(0, 1)), advantages, a padded mask."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.01
    logp = (old + scale * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-9)
    adv = torch.randn((B, T) if per_token else (B, 1), generator=g, dtype=torch.float64).expand(B, T).contiguous()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    return logp, old, adv, torch.arange(T)[None, :] < lengths[:, None]


def _grad(route: Route, logp, old, adv, mask) -> torch.Tensor:
    lp = logp.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(route(lp, old, adv, mask), lp)
    return grad


def _loss(method: str, aggregation: str = "token_mean", **kw) -> Route:
    return lambda lp, old, adv, m: policy_loss(lp, old, adv, m, method=method, aggregation=aggregation, **kw).loss


def check(eq: Equivalence, n: int = 200, seed: int = 0) -> dict:
    """Run ``eq`` on ``n`` random batches (and its constructed counterexample): the largest gradient difference
    relative to the gradients' size, whether it holds (``<= 1e-10``), and the first batch where it does not."""
    worst, first_failure = 0.0, None
    batches = [random_batch(seed + i, eq.per_token_advantages, eq.scale) for i in range(n)]
    if eq.counterexample is not None:
        batches.append(eq.counterexample())
    for i, batch in enumerate(batches):
        a, b = _grad(eq.left, *batch), _grad(eq.right, *batch)
        err = float((a - b).abs().max() / (a.abs().max() + b.abs().max()).clamp(min=1e-300))
        if err > 1e-10 and first_failure is None:
            logp, old, adv, mask = batch
            first_failure = {
                "batch": i if i < n else "constructed",
                "ratio": torch.exp(logp - old)[mask].tolist()[:12],
                "p_old": torch.exp(old)[mask].tolist()[:12],
                "advantages": adv[mask].tolist()[:12],
                "rel_gradient_difference": err,
            }
        worst = max(worst, err)
    holds = worst <= 1e-10
    return {
        "id": eq.id,
        "statement": eq.statement,
        "expected": eq.holds_expected,
        "holds": holds,
        "as_expected": holds == eq.holds_expected,
        "instances": len(batches),
        "max_rel_gradient_difference": worst,
        "counterexample": first_failure,
    }


def _atr_upper(delta: float) -> float:
    return float(kl3_clip_range(delta)[1])


def _outlier_sequence() -> tuple[torch.Tensor, ...]:
    """One sequence of 10 tokens: nine with ``w = 1``, one with ``w = 2.5``; mean k3 = 0.058 <= 0.07 keeps it."""
    old = torch.full((1, 10), math.log(0.2), dtype=torch.float64)
    logp = old.clone()
    logp[0, 3] = math.log(0.5)
    return logp, old, torch.ones(1, 10, dtype=torch.float64), torch.ones(1, 10, dtype=torch.bool)


def _positive_drift_sequence() -> tuple[torch.Tensor, ...]:
    """Two sequences whose probabilities fell (mean k1 = 0.5): advantage +1 and -1."""
    old = torch.full((2, 4), math.log(0.5), dtype=torch.float64)
    logp = old - 0.5
    adv = torch.tensor([[1.0], [-1.0]], dtype=torch.float64).expand(2, 4).contiguous()
    return logp, old, adv, torch.ones(2, 4, dtype=torch.bool)


def _reinforce_with(rejection: SequenceMask, cap: float) -> Route:
    return _loss("reinforce", rollout_correction=RolloutCorrection("token", "truncate", cap), sequence_mask=rejection)


def _sequence_k1(which: str, lower: float = -math.inf) -> SequenceMask:
    return SequenceMask("k1", "mean", DELTA, which, lower=lower)


def _zero_rule(sequence_mask: SequenceMask) -> Route:
    """REINFORCE with only ``sequence_mask`` (which tokens survive is all the gradient shows)."""
    return _loss("reinforce", sequence_mask=sequence_mask)


EQUIVALENCES: tuple[Equivalence, ...] = (
    Equivalence(
        "atr=bypass_token_k3",
        f"ATR in its mask form (the Section 4 pure-clip objective; delta = {DELTA}) has the gradient of REINFORCE with token-truncated IS at cap 2 and token "
        f"k3 rejection at delta (verl bypass mode, rollout_rs='token_k3'): the cap lies above ATR's upper bound "
        f"{_atr_upper(DELTA):.3f}",
        _loss("atr", form="mask", delta=DELTA),
        _reinforce_with(SequenceMask("k3", "token", DELTA, "all"), 2.0),
        True,
        per_token_advantages=True,
    ),
    Equivalence(
        "atr!=bypass_token_k3_low_cap",
        "... but not when the IS cap (1.2) lies below ATR's upper bound: kept tokens with w in (1.2, 1.422] are "
        "truncated",
        _loss("atr", form="mask", delta=DELTA),
        _reinforce_with(SequenceMask("k3", "token", DELTA, "all"), 1.2),
        False,
        per_token_advantages=True,
    ),
    Equivalence(
        "atr_seq=bypass_seq_mean_k3",
        "atr_seq has the gradient of REINFORCE with token IS and sequence mean-k3 rejection (verl bypass mode, "
        "rollout_rs='seq_mean_k3') when the IS cap is above every kept ratio (1e6 here)",
        _loss("atr_seq", delta=DELTA),
        _reinforce_with(SequenceMask("k3", "mean", DELTA, "all"), 1e6),
        True,
    ),
    Equivalence(
        "atr_seq!=bypass_seq_mean_k3_cap2",
        "... but not at verl's default cap 2: a mean-k3 bound lets one token of a kept sequence reach w > 2 (nine "
        "tokens at w = 1 and one at w = 2.5 have mean k3 0.058 <= 0.07), whose weight verl truncates",
        _loss("atr_seq", delta=DELTA),
        _reinforce_with(SequenceMask("k3", "mean", DELTA, "all"), 2.0),
        False,
        counterexample=_outlier_sequence,
    ),
    Equivalence(
        "dppo_kl=trgppo_eps0",
        "DPPO-Binary-KL (min form, both bounds delta, cap 1e6) keeps the tokens TRGPPO (min form, epsilon = 0, "
        "bound delta) keeps, with the same gradient: both bound the binary KL(Ber(p_old) || Ber(p)) on the side "
        "the advantage pushes",
        _loss("dppo_kl", delta_low=DELTA, delta_high=DELTA, is_cap=1e6),
        _loss("trgppo", delta=DELTA, epsilon=0.0),
        True,
        per_token_advantages=True,
        scale=1.0,
    ),
    Equivalence(
        "opsm=verl_seq_mean_k1_negative",
        "DeepSeek-V3.2's off-policy sequence mask (TRL off_policy_mask_threshold = delta) is verl's seq_mean_k1 "
        "rejection with upper bound delta and no lower bound, applied to negative-advantage sequences only",
        _zero_rule(_sequence_k1("negative")),
        lambda lp, old, adv, m: (
            _zero_rule(_sequence_k1("all"))(lp, old, torch.where(adv < 0, adv, 0.0), m)
            + _loss("reinforce")(lp, old, torch.where(adv >= 0, adv, 0.0), m)
        ),
        True,
        scale=0.6,
    ),
    Equivalence(
        "opsm!=verl_seq_mean_k1",
        "... but verl's seq_mean_k1 as shipped (every advantage) also drops positive-advantage sequences that "
        "drifted: it is not OPSM",
        _zero_rule(_sequence_k1("negative")),
        _zero_rule(_sequence_k1("all")),
        False,
        counterexample=_positive_drift_sequence,
    ),
    Equivalence(
        "gspo=clip_higher_sequence_level",
        "GSPO (GSPO-token form) has the gradient of Clip-Higher at ratio_level='sequence' (TRL's GSPO) for "
        "per-sequence advantages",
        _loss("gspo", epsilon_low=0.05, epsilon_high=0.08),
        _loss("clip_higher", epsilon_low=0.05, epsilon_high=0.08, ratio_level="sequence"),
        True,
        scale=0.1,
    ),
    Equivalence(
        "gspo!=clip_higher_sequence_level_per_token",
        "... but not for per-token advantages: GSPO-token gives token t its own advantage, the sequence ratio "
        "spreads every token's advantage over the sequence",
        _loss("gspo", epsilon_low=0.05, epsilon_high=0.08),
        _loss("clip_higher", epsilon_low=0.05, epsilon_high=0.08, ratio_level="sequence"),
        False,
        per_token_advantages=True,
        scale=0.1,
    ),
    Equivalence(
        "ce_gppo_beta0=dual_clip_higher",
        "CE-GPPO with beta_1 = beta_2 = 0 has the gradient of dual-clip PPO with the same range and c: the tokens "
        "PPO freezes get the gradient beta (1 +- eps) A, here 0",
        _loss("ce_gppo", gppo_beta1=0.0, gppo_beta2=0.0),
        _loss("dual_clip_higher", epsilon_low=0.2, epsilon_high=0.2, dual_clip_c=3.0),
        True,
        per_token_advantages=True,
        scale=1.0,
    ),
    Equivalence(
        "ce_gppo!=dual_clip_higher",
        "... but not at its defaults (beta_1 = 0.25, beta_2 = 1): a token outside the range on PPO's frozen side "
        "keeps a gradient",
        _loss("ce_gppo"),
        _loss("dual_clip_higher", epsilon_low=0.2, epsilon_high=0.2, dual_clip_c=3.0),
        False,
        per_token_advantages=True,
        scale=1.0,
    ),
    Equivalence(
        "bapo_no_search=dual_clip_higher",
        "BAPO with both steps 0 (no search) is dual-clip PPO on its start bounds [0.6, 1.2]",
        _loss("bapo", bapo_lower_step=0.0, bapo_upper_step=0.0),
        _loss("dual_clip_higher", epsilon_low=0.4, epsilon_high=0.2, dual_clip_c=3.0),
        True,
        per_token_advantages=True,
        scale=1.0,
    ),
    Equivalence(
        "up_grpo=reinforce_positive+dual_clip_rest",
        "UP-GRPO is REINFORCE on the tokens with A > 0 and dual-clip PPO (its range and c) on the others",
        _loss("up_grpo"),
        lambda lp, old, adv, m: (
            _loss("reinforce", "token_sum")(lp, old, torch.where(adv > 0, adv, 0.0), m)
            + _loss("dual_clip_higher", "token_sum", epsilon_low=0.2, epsilon_high=0.2, dual_clip_c=3.0)(
                lp, old, torch.where(adv > 0, 0.0, adv), m
            )
        )
        / m.sum(),
        True,
        per_token_advantages=True,
        scale=1.0,
    ),
)
