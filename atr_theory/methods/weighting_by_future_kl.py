r"""FIPO (Future-KL Influenced Policy Optimization): dual-clip PPO whose advantage is weighted, per token, by how far
the policy has already moved on the tokens that follow it. Pinned by the code that proposes it for TRL (PR #5434 at
20463989, ``GRPOTrainer.get_fipo_loss_components`` and the ``fipo`` branch of ``_compute_loss``, "a port of
qwenpilot/FIPO"), copied as a test-only oracle in ``tests/soft_region_peers.py`` and run on the same batches in
``tests/test_future_kl_weighting.py``.

With ``y_k = clamp(log w_k, -20, 20)`` (no gradient), ``gamma = 2^(-1 / decay_rate)`` and ``M`` the token mask:

* Future KL: ``F_t = sum_{k >= t} gamma^(k - t) M_k [y_k <= log c] y_k``: the current token and the later ones of the
  same sequence, a token whose ratio exceeds the dual clip's ``c`` left out.
* Influence weight: ``f_t = clamp(exp(F_t), f_low, f_high)``; where ``A < 0`` and ``w > safety_threshold``, ``f_t`` is
  clamped again into ``[0.8, 1]`` (the PR's constants).
* Objective: ``f_t`` times dual-clip PPO's on ``[1 - eps_low, 1 + eps_high]`` and ``c``; ``f`` carries no gradient.
* Sequence drop: a sequence with more than one token that the dual clip caps (``A < 0`` and ``w > c``) is left out
  whole (objective 0, no gradient).

The PR's defaults: ``decay_rate`` 32, ``c = 10``, ``influence_clip_ratio`` 0.2 with ``influence_clip_high_only``
(``[f_low, f_high] = [1, 1.2]``; ``[0.8, 1.2]`` without it; ``influence_clip_ratio = 0`` is ``[0, 10]``),
``safety_threshold`` 10. Where this differs from the PR: the PR divides the summed loss by the tokens of the
sequences it keeps; here the rule gives the per-token objective (0 on a dropped sequence) and the trainer's loss
type aggregates it, so under a token mean the dropped sequences' tokens still count in the denominator
(``tests/test_future_kl_weighting.py`` compares both ways). The paper's own equation (arXiv 2603.19835) has neither the
participation filter, the dual clip, the safety clamp nor the sequence drop, and clips ``f`` to ``[1 - eps_f, 1 +
eps_f]``: ``fipo_influence_low = 0.8`` with ``dual_clip_c`` and ``fipo_safety_threshold`` large is the nearest setting.
"""

from __future__ import annotations

import math

import torch

from ..registry import MethodResult, Param, PeerCode, TokenBatch, register
from . import _reference as plain
from ._params import DUAL_CLIP_C, EPSILON_HIGH, EPSILON_LOW
from ._ratio import mask_and_not
from .divergence_ranges import dual_clip_higher

__all__ = ["fipo", "fipo_influence_weights"]

_ORACLE = "tests/test_future_kl_weighting.py"
_INFLUENCE_LOG_CLAMP = 20.0  # the PR clamps log w to +-20 before its influence weights and its ratio
_SAFETY_CLAMP = (0.8, 1.0)  # the PR's clamp of f where A < 0 and w > safety_threshold
_CHUNK = 128  # positions per chunk of the Future KL's scan (``future_kl``)


def future_kl(log_ratio: torch.Tensor, counted: torch.Tensor, decay_rate: float) -> torch.Tensor:
    r"""``F_t = sum_{k >= t} gamma^(k - t) x_k`` along the last dimension, ``x = log_ratio * counted`` and ``gamma =
    2^(-1 / decay_rate)`` (FIPO's Future KL), as a chunked scan: within a chunk of ``_CHUNK`` positions, a product
    with the chunk's upper-triangular decay matrix; across chunks, from the last, ``F_t += gamma^(e - t) F_e`` with
    ``e`` the next chunk's first position. ``B T _CHUNK`` multiply-adds (the PR's full product is ``B T^2``); every
    factor is at most 1, so nothing grows (``gamma^-t`` cumulative sums would lose every digit at ``T`` in the
    thousands)."""
    x = log_ratio * counted.to(log_ratio.dtype)
    length = x.shape[-1]
    size = min(_CHUNK, length)
    gamma = torch.tensor(2.0 ** (-1.0 / decay_rate), dtype=x.dtype, device=x.device)
    position = torch.arange(size, device=x.device)
    distance = position.unsqueeze(0) - position.unsqueeze(1)  # [t, k] = k - t
    decay = torch.pow(gamma, distance.clamp(min=0)) * (distance >= 0).to(x.dtype)
    pieces, carry = [], None
    for start in reversed(range(0, length, size)):
        n = min(length, start + size) - start
        piece = x[..., start : start + n] @ decay[:n, :n].t()
        if carry is not None:  # the later chunks' sum at e = start + n, decayed over e - t = n - t positions
            piece = piece + carry.unsqueeze(-1) * torch.pow(gamma, (n - position[:n]).to(x.dtype))
        pieces.append(piece)
        carry = piece[..., 0]
    return torch.cat(pieces[::-1], dim=-1)


def fipo_influence_weights(
    batch: TokenBatch,
    decay_rate: float,
    dual_clip_c: float,
    influence_low: float,
    influence_high: float,
    safety_threshold: float,
) -> torch.Tensor:
    """FIPO's influence weights ``f`` (no gradient): ``clamp(exp(F_t), influence_low, influence_high)`` of the Future
    KL (``future_kl``) over the tokens whose ``log w <= log c``, then ``[0.8, 1]`` where ``A < 0`` and ``w >
    safety_threshold`` (TRL PR #5434's ``get_fipo_loss_components``)."""
    with torch.no_grad():
        y = batch.log_ratio.detach().clamp(-_INFLUENCE_LOG_CLAMP, _INFLUENCE_LOG_CLAMP)
        counted = batch.mask & (y <= math.log(dual_clip_c))
        weights = torch.exp(future_kl(y, counted, decay_rate)).clamp(influence_low, influence_high)
        unsafe = (batch.advantages < 0) & (torch.exp(y) > safety_threshold)
        return torch.where(unsafe, weights.clamp(*_SAFETY_CLAMP), weights)


def fipo_reference(logp, old_logp, advantages, mask, *, epsilon_low, epsilon_high, dual_clip_c, fipo_decay_rate,
                   fipo_influence_low, fipo_influence_high, fipo_safety_threshold, form):
    """FIPO (Ma et al. 2026; TRL PR #5434): ``f_t`` times dual-clip PPO, ``f_t = clip(exp(sum_{k >= t} gamma^(k - t)
    y_k), f_low, f_high)`` over the tokens with ``y_k <= log c`` (``[0.8, 1]`` for ``A < 0`` and ``w > s``); a sequence
    with two or more negative tokens above ``c`` is dropped."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    y = torch.log(w.detach()).clamp(-20, 20)
    gamma = 2.0 ** (-1.0 / fipo_decay_rate)
    weights = torch.ones_like(y)
    for b in range(y.shape[0]):
        for t in range(y.shape[1]):
            total = sum(gamma ** (k - t) * float(y[b, k]) for k in range(t, y.shape[1])
                        if mask[b, k] and float(y[b, k]) <= math.log(dual_clip_c))
            f = min(max(math.exp(total), fipo_influence_low), fipo_influence_high)
            if adv[b, t] < 0 and math.exp(float(y[b, t])) > fipo_safety_threshold:
                f = min(max(f, 0.8), 1.0)
            weights[b, t] = f
    lower, upper = 1 - epsilon_low, 1 + epsilon_high
    if form == "mask":
        objective = plain.eq5_mask(w, adv, (w >= lower) & (w <= upper))
        objective = torch.where((adv < 0) & (objective < dual_clip_c * adv), (dual_clip_c * adv).detach(), objective)
    else:
        ppo = plain.ppo_min(w, adv, lower, upper)
        objective = torch.where(adv < 0, torch.maximum(ppo, dual_clip_c * adv), ppo)
    capped = (adv < 0) & mask & (weights > 0) & (w.detach() > dual_clip_c)
    dropped = capped.sum(dim=1, keepdim=True) > 1
    return torch.where(dropped, torch.zeros_like(objective), weights * objective)


@register(
    "fipo",
    reference_form=fipo_reference,
    params={
        "epsilon_low": EPSILON_LOW.with_default(0.2),
        "epsilon_high": EPSILON_HIGH.with_default(0.2),
        "dual_clip_c": DUAL_CLIP_C.with_default(10.0),
        "fipo_decay_rate": Param(
            32.0, gt=0, help="FIPO: the Future KL's half-life in tokens, gamma = 2^(-1 / decay_rate) (TRL PR #5434 "
            "fipo_decay_rate)"
        ),
        "fipo_influence_low": Param(
            1.0, ge=0, le=1, help="FIPO: the influence weight's floor (1 with the PR's influence_clip_high_only, else "
            "1 - influence_clip_ratio; 0 for influence_clip_ratio 0)"
        ),
        "fipo_influence_high": Param(
            1.2, ge=1, help="FIPO: the influence weight's ceiling (1 + influence_clip_ratio; 10 for "
            "influence_clip_ratio 0)"
        ),
        "fipo_safety_threshold": Param(
            10.0, gt=0, help="FIPO: above this ratio a negative token's influence weight is clamped into [0.8, 1] "
            "(fipo_safety_threshold)"
        ),
    },
    default_form="min",
    forms=("min", "mask"),
    peers=(
        PeerCode(
            "TRL PR #5434 (20463989, open)",
            "loss_type=fipo",
            (
                ("epsilon", "epsilon_low"),
                ("epsilon_high", "epsilon_high"),
                ("fipo_clip_ratio_c", "dual_clip_c"),
                ("fipo_decay_rate", "fipo_decay_rate"),
                ("fipo_influence_clip_ratio, fipo_influence_clip_high_only", "fipo_influence_low"),
                ("fipo_influence_clip_ratio", "fipo_influence_high"),
                ("fipo_safety_threshold", "fipo_safety_threshold"),
            ),
            "`trl/trainer/grpo_trainer.py` `GRPOTrainer.get_fipo_loss_components` and the `fipo` branch of "
            "`_compute_loss` (its aggregation divides by the kept sequences' tokens)",
            _ORACLE,
        ),
    ),
    reference="Ma et al. 2026 (FIPO, 'Eliciting Deep Reasoning with Future-KL Influenced Policy Optimization', "
    "arXiv 2603.19835); TRL PR #5434",
)
def fipo(
    batch: TokenBatch,
    epsilon_low: float,
    epsilon_high: float,
    dual_clip_c: float,
    fipo_decay_rate: float,
    fipo_influence_low: float,
    fipo_influence_high: float,
    fipo_safety_threshold: float,
) -> MethodResult:
    r"""Future-KL weighting: ``f_t`` (``fipo_influence_weights``, no gradient) times dual-clip PPO on ``[1 - eps_low,
    1 + eps_high]`` with ``c``; a sequence holding more than one negative token above ``c`` is dropped (objective 0,
    flagged clipped high). Needs the sequence layout: ``F_t`` runs along each row of the batch."""
    base = dual_clip_higher(batch, epsilon_low, epsilon_high, dual_clip_c)  # either form
    weights = fipo_influence_weights(
        batch, fipo_decay_rate, dual_clip_c, fipo_influence_low, fipo_influence_high, fipo_safety_threshold
    )
    with torch.no_grad():
        # the PR counts a token where its weighted advantage f A < 0 and the dual clip caps it (w > c)
        capped = batch.mask & (batch.advantages < 0) & (weights > 0) & (torch.exp(batch.log_ratio) > dual_clip_c)
        dropped = (capped.sum(dim=-1, keepdim=True) > 1).expand_as(batch.mask)
    objective = torch.where(dropped, torch.zeros_like(base.objective), weights * base.objective)

    def flags():
        kept, low, high = base.flags()
        return mask_and_not(kept, dropped), mask_and_not(low, dropped), high | dropped

    def mask_form_kept() -> torch.Tensor:
        return mask_and_not(base.mask_form_kept(), dropped)

    return MethodResult(objective, flags, mask_form_kept if base.mask_form_kept is not None else None)
