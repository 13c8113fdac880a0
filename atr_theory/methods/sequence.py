r"""Sequence-level rules: one decision (or one ratio) per sequence instead of one per token.

* ``gspo``: GSPO's sequence ratio ``s = exp(mean_t log w_t)`` clipped PPO-style (Zheng et al. 2025).
* ``gmpo``: GMPO's geometric mean of the token ratios, each clipped in log space by its advantage's sign
  (Zhao et al. 2025; verl ``geo_mean``).
* ``atr_seq``: the paper's rule at sequence level: ``mean_t k3(w_t) <= delta`` keeps the whole sequence.

Registered in ``atr_theory.METHODS`` when ``atr_theory`` is imported. ``ratio_level="sequence"`` of
``atr_theory.policy_loss`` (``atr_theory.layers``) gives any token rule a sequence ratio instead.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..divergence import kl3_from_log_ratio
from ..layers import sequence_log_ratio
from ..registry import MethodResult, Param, TokenBatch, register
from . import _reference as plain
from ._params import DELTA, EPSILON_HIGH, EPSILON_LOW
from ._ratio import ratio_objective

__all__ = ["atr_seq", "gmpo", "gspo"]


def gspo_reference(logp, old_logp, advantages, mask, *, epsilon_low, epsilon_high, form):
    """GSPO-token (Zheng et al. 2025, Eq. 11): the sequence ratio ``s = exp(mean_t log w_t)`` carried by each token
    as ``s_t = sg[s] w_t / sg[w_t]``, in PPO's min (or Eq. 5's mask) with ``[1 - eps_low, 1 + eps_high]``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    log_w = torch.log(w)
    s = torch.exp(log_w.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1))
    s_t = s.detach() * w / w.detach()
    if form == "min":
        objective = plain.ppo_min(s_t, adv, 1 - epsilon_low, 1 + epsilon_high)
    else:
        objective = plain.eq5_mask(s_t, adv, (s.detach() >= 1 - epsilon_low) & (s.detach() <= 1 + epsilon_high))
    return torch.where(mask, objective, torch.zeros_like(w))


@register(
    "gspo",
    verl_loss_mode="gspo",
    reference_form=gspo_reference,
    params={"epsilon_low": EPSILON_LOW.with_default(3e-4), "epsilon_high": EPSILON_HIGH.with_default(4e-4)},
    default_form="min",
    forms=("min", "mask"),
    reference="Zheng et al. 2025 (GSPO, GSPO-token); TRL importance_sampling_level='sequence'; verl 'gspo'",
)
def gspo(batch: TokenBatch, epsilon_low: float, epsilon_high: float) -> MethodResult:
    r"""Sequence-level ratio ``s = exp(mean_t log w_t)`` clipped to ``[1 - eps_low, 1 + eps_high]``, in its
    GSPO-token form (Zheng et al. 2025, Eq. 11; verl ``gspo``): token ``t`` uses ``s_t = sg[s] w_t / sg[w_t]``.

    ``s_t`` has the value ``s`` (and the same clipping decision for every token of the sequence) and the
    gradient ``s grad log pi_t``, so each token's gradient carries its own advantage. With per-sequence
    advantages (GRPO's) this is exactly GSPO's sequence-level gradient ``A s mean_t grad log pi_t`` under
    every aggregation; with per-token advantages it is GSPO-token (tests: against verl).
    """
    y = batch.log_ratio
    token_log_ratio = sequence_log_ratio(y, batch.mask).detach() + (y - y.detach())
    return ratio_objective(replace(batch, log_ratio=token_log_ratio), 1.0 - epsilon_low, 1.0 + epsilon_high)


def gmpo_reference(logp, old_logp, advantages, mask, *, epsilon_low, epsilon_high, form):
    """GMPO (Zhao et al. 2025): the sequence's ``mean_t A_t`` times the geometric mean of its token ratios, each
    ``log w_t`` clipped PPO-style by its advantage's sign (``A > 0``: at most ``eps_high``; ``A < 0``: at least
    ``-eps_low``; ``A = 0``: 0). Every token of a sequence holds the sequence's value, so the
    ``seq_mean_token_mean`` aggregation of this (B, T) tensor is GMPO's batch mean."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    log_w = torch.log(w)
    signed = torch.sign(adv)
    clipped = signed * torch.minimum(signed * log_w, signed * torch.clamp(log_w, -epsilon_low, epsilon_high))
    n = mask.sum(1, keepdim=True).clamp(min=1)
    sequence = (adv.sum(1, keepdim=True) / n) * torch.exp(clipped.sum(1, keepdim=True) / n)
    return sequence.expand_as(w)


@register(
    "gmpo",
    verl_loss_mode="geo_mean",
    reference_form=gmpo_reference,
    params={
        "epsilon_low": Param(
            0.4,
            ge=0,
            help="GMPO: for A < 0 each log w_t is clipped below at -epsilon_low",
            verl=(("actor", "clip_ratio_low"),),
        ),
        "epsilon_high": Param(
            0.4,
            ge=0,
            help="GMPO: for A > 0 each log w_t is clipped above at epsilon_high",
            verl=(("actor", "clip_ratio_high"),),
            trl_field=True,
        ),
    },
    default_form="min",
    forms=("min",),
    reference="Zhao et al. 2025 (GMPO, arXiv 2507.20673); verl 'geo_mean' (clip_ratio_low / _high in log space)",
    aliases=("geo_mean",),
)
def gmpo(batch: TokenBatch, epsilon_low: float, epsilon_high: float) -> MethodResult:
    r"""Geometric-mean policy optimisation: a sequence's objective is ``Abar exp(mean_t c_t)`` with
    ``c_t = min(log w_t, eps_high)`` where ``A_t > 0``, ``max(log w_t, -eps_low)`` where ``A_t < 0``, ``0`` where
    ``A_t = 0``, and ``Abar = mean_t A_t`` (verl ``geo_mean``).

    PPO's pessimistic clip, applied to each token's log-ratio before the geometric mean: the product of ratios
    cannot be driven by one outlier token. Token ``t`` holds ``Abar g_t`` with ``log g_t = sg[mean c] + c_t -
    sg[c_t]`` (value ``exp(mean c)``, gradient ``exp(mean c) grad c_t``), so the ``seq_mean_token_mean``
    aggregation gives GMPO's loss and gradient exactly (verl aggregates ``geo_mean`` that way whatever its
    ``loss_agg_mode``); other aggregations weight the same per-token gradients by length. Only the min form: a
    token is clipped by its own sign, not frozen at a constant ``A`` (Eq. 5 has no per-token constant here)."""
    y, adv = batch.log_ratio, batch.advantages
    positive, negative = adv > 0, adv < 0
    clipped = torch.where(positive, torch.clamp(y, max=epsilon_high), torch.clamp(y, min=-epsilon_low))
    clipped = torch.where(positive | negative, clipped, torch.zeros_like(y))
    m = batch.mask.to(y.dtype)
    n = m.sum(-1, keepdim=True).clamp(min=1.0)
    mean_clipped = (clipped * m).sum(-1, keepdim=True) / n
    mean_adv = (adv * m).sum(-1, keepdim=True) / n
    token_log_g = mean_clipped.detach() + (clipped - clipped.detach())
    objective = mean_adv * torch.exp(token_log_g)

    def flags():
        high = positive & (y > epsilon_high)
        low = negative & (y < -epsilon_low)
        return ~(low | high), low, high

    return MethodResult(objective, flags)


@register(
    "atr_seq",
    params={"delta": DELTA},
    default_form="mask",
    forms=("mask",),
    reference="ours (the paper's future work): sequence-level approximate trust region with KL3; verl bypass mode "
    "with rollout_rs='seq_mean_k3' and REINFORCE (same gradient)",
    ratio_mask_gradient=True,
)
def atr_seq(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Sequence-level ATR: keep every token of a sequence (objective ``w_t A``) while the sequence's
    mean ``(1/|y|) sum_t k3(w_t) <= delta``, else freeze the whole sequence (objective ``A``).

    Derivation: ``mean_t k3(w_t)`` estimates the per-token average ``KL(pi_old || pi)`` along the
    sampled sequence (each k3 is unbiased per position), which is TRPO's average-KL trust region.
    Because k3 is convex and ``mean_t w_t >= exp(mean_t log w_t)`` (AM-GM),
    ``mean_t k3(w_t) >= k3(s)`` with GSPO's sequence ratio ``s = exp(mean_t log w_t)``: a kept
    sequence always has ``s`` inside ``kl3_clip_range(delta)``, while log-ratios of opposite signs can
    no longer cancel as they do in ``s``.
    """
    with torch.no_grad():  # the test's outcome carries no gradient: record no graph for it
        # log w is 0 on padding (TokenBatch), where k3 = 0: the sum runs over the valid tokens
        seq_k3 = kl3_from_log_ratio(batch.log_ratio).sum(-1) / batch.mask.sum(-1).clamp(min=1)
        keep = (seq_k3 <= delta).unsqueeze(-1).expand_as(batch.mask)
    return ratio_objective(batch, 0.0, math.inf, keep)
