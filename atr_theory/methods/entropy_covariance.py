r"""The covariance rules of Cui et al. 2025 ("The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models"): Clip-Cov and KL-Cov act on the few tokens whose centred ``(A - mean A)(log pi - mean log pi)``
is largest, the tokens that drive entropy down."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..registry import MethodResult, Param, Relation, TokenBatch, register
from . import _reference as plain
from ._params import COV_RATIO, EPSILON
from ._ratio import range_flags, ratio_objective


def _centred_cov(batch: TokenBatch, n_valid: torch.Tensor) -> torch.Tensor:
    """Per-token ``(A - mean A)(log pi - mean log pi)`` over valid tokens, detached (Cui et al. 2025). Both are zero
    on padding (``TokenBatch``), so their sums run over the valid tokens without a multiplication by the mask."""
    adv = batch.advantages.detach()
    logp = batch.logp.detach()
    n_valid = n_valid.clamp(min=1)
    return torch.sub(adv, adv.sum() / n_valid).mul_(logp - logp.sum() / n_valid)


def _top_k_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries of the flat ``values``, largest first (``torch.topk``, sorted)."""
    return torch.topk(values, k).indices


@register(
    "clip_cov",
    verl_loss_mode="clip_cov",
    stochastic=True,
    params={
        "epsilon": EPSILON,
        "cov_ratio": replace(COV_RATIO, verl=(("policy_loss", "clip_cov_ratio"),)),
        "cov_lb": Param(
            1.0,
            help="Clip-Cov: lower bound of the centred cov(A, log pi) of a droppable token",
            verl=(("policy_loss", "clip_cov_lb"),),
        ),
        "cov_ub": Param(
            5.0,
            help="Clip-Cov: upper bound of the centred cov(A, log pi) of a droppable token",
            verl=(("policy_loss", "clip_cov_ub"),),
        ),
    },
    relations=(Relation("cov_lb < cov_ub", lambda p: p["cov_lb"] < p["cov_ub"]),),
    default_form="min",
    forms=("min", "mask"),
    reference="Cui et al. 2025 (arXiv 2505.22617), Clip-Cov; verl 'clip_cov' policy loss",
    ratio_mask_gradient=True,
)
def clip_cov(batch: TokenBatch, epsilon: float, cov_ratio: float, cov_lb: float, cov_ub: float) -> MethodResult:
    r"""PPO clip; then ``max(1, int(cov_ratio * n_valid))`` tokens drawn at random (``batch.generator``)
    among the unclipped valid tokens with centred ``cov(A, log pi)`` in ``(cov_lb, cov_ub)`` lose their
    gradient. (verl zeroes their loss value too; we keep the value and drop the gradient.)

    The covariance test runs on every token, the clip test only on the few tokens that pass it (the same candidates
    in the same order, so the same draw as verl's ``randperm``)."""
    lower, upper = 1.0 - epsilon, 1.0 + epsilon
    base = ratio_objective(batch, lower, upper)
    n_valid = torch.count_nonzero(batch.mask)
    cov = _centred_cov(batch, n_valid).reshape(-1)
    idx = torch.nonzero((cov > cov_lb).logical_and_(cov < cov_ub)).squeeze(-1)
    with torch.no_grad():
        y_few, adv_few = batch.log_ratio.reshape(-1)[idx], batch.advantages.reshape(-1)[idx]
        kept_few = range_flags(torch.exp(y_few), y_few, adv_few, lower, upper, batch.form)[0]
        idx = idx[batch.mask.reshape(-1)[idx] & kept_few]
    n_pick = min(max(int(cov_ratio * int(n_valid)), 1), idx.numel())
    perm = torch.randperm(idx.numel(), generator=batch.generator, device="cpu")[:n_pick]
    dropped = idx[perm.to(idx.device)]
    # the dropped tokens keep their value and lose their gradient: an out-of-place index_put costs a copy forward and
    # backward, where torch.where(drop, detached, objective) costs two selects over every token
    flat = base.objective.reshape(-1)
    objective = flat.index_put((dropped,), flat.detach()[dropped]).view_as(base.objective)

    def flags():
        drop = torch.zeros_like(batch.mask).reshape(-1).index_fill_(0, dropped, True).view_as(batch.mask)
        return base.kept & ~drop, base.clipped_low, base.clipped_high | drop

    return MethodResult(objective, flags)


def kl_cov_reference(logp, old_logp, advantages, mask, *, cov_ratio, kl_coef):
    """KL-Cov (Cui et al. 2025): ``w A``, and the ``max(1, int(cov_ratio n))`` valid tokens with the largest centred
    ``(A - mean A)(log pi - mean log pi)`` get the penalty ``- kl_coef |log w|``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    n = int(mask.sum())
    a, lp = adv[mask].detach(), logp[mask].detach()
    cov = (a - a.mean()) * (lp - lp.mean())
    chosen = torch.zeros(n, dtype=torch.bool)
    chosen[torch.topk(cov, max(1, int(cov_ratio * n))).indices] = True
    penalised = torch.zeros_like(mask)
    penalised[mask] = chosen
    return w * adv - torch.where(penalised, kl_coef * torch.log(w).abs(), torch.zeros_like(w))


@register(
    "kl_cov",
    verl_loss_mode="kl_cov",
    reference_form=kl_cov_reference,
    params={
        "cov_ratio": replace(COV_RATIO, default=2e-3, verl=(("policy_loss", "kl_cov_ratio"),)),
        "kl_coef": Param(
            1.0,
            ge=0,
            help="KL-Cov: coefficient of the |log w| penalty on the selected tokens",
            verl=(("policy_loss", "ppo_kl_coef"),),
        ),
    },
    default_form="none",
    forms=("none",),
    reference="Cui et al. 2025 (arXiv 2505.22617), KL-Cov; verl 'kl_cov' policy loss",
)
def kl_cov(batch: TokenBatch, cov_ratio: float, kl_coef: float) -> MethodResult:
    r"""No clipping: ``w A``, and the top ``max(1, int(cov_ratio * n_valid))`` valid tokens by centred
    ``cov(A, log pi)`` get the penalty ``- kl_coef * |log w|``."""
    y = batch.log_ratio
    n_valid = torch.count_nonzero(batch.mask)
    cov = _centred_cov(batch, n_valid)
    cov = cov.masked_fill_(~batch.mask, -math.inf).reshape(-1)  # padding last in the ranking
    # k = max(1, int(cov_ratio * n_valid)) stays on the device: take the top k_max (a size known from the
    # shape, n_valid <= B T) and penalise the first k of them (topk returns them in descending order)
    k_max = min(max(1, int(cov_ratio * y.numel())), y.numel())
    k = torch.clamp(torch.floor(cov_ratio * n_valid.to(torch.float64)), min=1.0)
    top = _top_k_indices(cov, k_max)
    chosen = (torch.arange(k_max, device=y.device) < k) & batch.mask.reshape(-1)[top]
    # the penalty enters at the top k_max positions only (times 0 where not chosen): an index_put, not a select
    # over every token
    flat = (torch.exp(y) * batch.advantages).reshape(-1)
    objective = flat.index_put((top,), flat[top] - kl_coef * y.reshape(-1)[top].abs() * chosen).view_as(y)

    def flags():
        penalised = torch.zeros_like(batch.mask).reshape(-1).index_put((top,), chosen).view_as(batch.mask)
        return torch.ones_like(batch.mask), torch.zeros_like(batch.mask), penalised

    return MethodResult(objective, flags)
