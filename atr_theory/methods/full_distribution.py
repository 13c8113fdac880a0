r"""Rules that read the whole next-token distribution at each position, not only the sampled token: TR-PPO and
Truly PPO's rollback (Wang et al. 2020), gated by ``KL(pi_old(.|s_t) || pi(.|s_t))``."""

from __future__ import annotations

import math

import torch

from ..divergence import full_kl
from ..registry import MethodResult, Param, TokenBatch, register
from ._params import DELTA
from ._ratio import mask_and, ratio_objective


def _position_kl(batch: TokenBatch, name: str) -> torch.Tensor:
    """(B, T) ``KL(pi_old(.|s_t) || pi(.|s_t))``: ``batch.position_kl`` when the caller computed it (e.g. chunk by
    chunk from hidden states, ``atr_theory.head_kl_chunked``; ``atr_theory.policy_loss`` checked its
    shape), else from the full distributions."""
    expected = tuple(batch.log_ratio.shape)
    if batch.position_kl is not None:
        return batch.position_kl.to(batch.log_ratio.dtype)
    if batch.old_full_logp is None or batch.full_logp is None:
        raise ValueError(
            f"method {name!r} needs the full distributions: pass old_full_logp and full_logp of shape (B, T, V), "
            "or their per-position KL as position_kl (B, T)"
        )
    for arg, t in (("old_full_logp", batch.old_full_logp), ("full_logp", batch.full_logp)):
        if t.ndim != 3 or tuple(t.shape[:2]) != expected:
            raise ValueError(f"{arg} must have shape (B, T, V) with (B, T) = {expected}, got {tuple(t.shape)}")
    kl = full_kl(batch.old_full_logp, batch.full_logp, chunk_size=batch.kl_chunk_size)
    return kl.to(batch.log_ratio.dtype)


@register(
    "tr_ppo",
    params={"delta": DELTA},
    default_form="min",
    forms=("min", "mask"),
    reference="Wang et al. 2020 (Truly PPO, TR-PPO); paper Eq. 3 (KL-based clipping)",
    needs_full_distributions=True,
    ratio_mask_gradient=True,
)
def tr_ppo(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Min form (the default; the original TR-PPO, Wang et al. 2020, Eq. 8, and the paper's Eq. 3 operator inside
    its Section 2 surrogate): ``min(w A, F A)`` with ``F = 1`` (``w_old``) where ``KL >= delta`` and ``F = w`` below:
    a token outside the trust region loses its gradient only when ``w A > A`` (its ratio moved in the direction its
    advantage favours); moving back stays possible.

    Mask form (the Section 4 pure-clip reading): keep ``w A`` while the full ``KL(pi_old(.|s_t) || pi(.|s_t)) <=
    delta`` at the token's position, else the constant ``A``.

    Note: the paper's Eq. 3 writes the reverse direction ``KL(pi || pi_old)``; we follow Truly PPO and
    METHODS.md (``KL(pi_old || pi)``, the direction TRPO constrains). The KL only gates, so it is
    computed without gradient, chunked over positions (``kl_chunk_size``).
    """
    with torch.no_grad():
        kl = _position_kl(batch, "tr_ppo")
    if batch.form == "mask":
        return ratio_objective(batch, 0.0, math.inf, kl <= delta)
    w = torch.exp(batch.log_ratio)
    adv = batch.advantages
    outside = kl >= delta
    objective = torch.where(outside, torch.minimum(w * adv, adv), w * adv)

    def flags():
        frozen = mask_and(outside, w * adv > adv)
        return ~frozen, mask_and(frozen, batch.log_ratio < 0), mask_and(frozen, batch.log_ratio > 0)

    return MethodResult(objective, flags, lambda: kl <= delta)  # the mask form's constraint (ties: kept)


@register(
    "truly_ppo",
    params={"delta": DELTA, "alpha": Param(5.0, ge=0, help="Truly PPO: rollback coefficient")},
    default_form="none",
    forms=("none",),
    reference="Wang et al. 2020 (Truly PPO, TR-PPO-RB), wangyuhuix/TrulyPPO",
    needs_full_distributions=True,
)
def truly_ppo(batch: TokenBatch, delta: float, alpha: float) -> MethodResult:
    r"""Trust-region rollback: where ``KL(pi_old || pi) >= delta`` and ``w A > A`` (the ratio moved
    past 1 in the direction the advantage favours) the objective is ``w A - alpha KL``; else ``w A``.
    The KL carries gradient here (it is the rollback force)."""
    kl = _position_kl(batch, "truly_ppo")
    w = torch.exp(batch.log_ratio)
    adv = batch.advantages
    rollback = mask_and(kl.detach() >= delta, w * adv > adv)
    objective = torch.where(rollback, w * adv - alpha * kl, w * adv)
    none = torch.zeros_like(batch.mask)
    return MethodResult(objective, lambda: (torch.ones_like(batch.mask), none, rollback))
