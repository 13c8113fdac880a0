r"""Rules that reweight instead of clipping: SAPO's soft gate, CISPO's truncated weight, VESPO's gamma weight.

None of them removes a token's gradient: each scales ``A grad log pi`` by a weight of the ratio (SAPO through ``w``
itself, CISPO and VESPO through a detached weight times ``log pi``), so every token counts as kept; the flags say
where the weight was truncated (CISPO). Registered in ``atr_theory.METHODS`` when ``atr_theory`` is
imported; each rule's plain form is its ``reference_form``, written above it.
"""

from __future__ import annotations

import math

import torch

from ..registry import MethodResult, Param, TokenBatch, TRLPeer, register, unclipped_result
from . import _reference as plain

__all__ = ["cispo", "sapo", "vespo", "vespo_log_weight"]


def sapo_reference(logp, old_logp, advantages, mask, *, tau_pos, tau_neg):
    """SAPO's soft gate (Gao et al. 2025): ``sigma(tau (w - 1)) 4 / tau A``, ``tau = tau_pos`` if ``A > 0`` else
    ``tau_neg``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    tau = torch.where(adv > 0, torch.full_like(w, tau_pos), torch.full_like(w, tau_neg))
    return torch.sigmoid(tau * (w - 1)) * 4 / tau * adv


def _sapo_from_trl(config) -> dict[str, float]:
    """TRL's ``loss_type='sapo'``: its ``sapo_temperature_pos`` / ``_neg`` are ``tau_pos`` / ``tau_neg``."""
    return {"tau_pos": config.sapo_temperature_pos, "tau_neg": config.sapo_temperature_neg}


def _no_trl_metrics(out, advantages, log_ratio, params, mean) -> dict[str, float]:
    """TRL logs no loss metric of its own for this rule."""
    return {}


@register(
    "sapo",
    verl_loss_mode="sapo",
    reference_form=sapo_reference,
    params={
        "tau_pos": Param(1.0, gt=0, help="SAPO gate temperature for tokens with A > 0", verl=(("actor", "tau_pos"),)),
        "tau_neg": Param(1.05, gt=0, help="SAPO gate temperature for tokens with A <= 0", verl=(("actor", "tau_neg"),)),
    },
    default_form="soft",
    forms=("soft",),
    trl=TRLPeer(
        "sapo", ("sapo_temperature_pos", "sapo_temperature_neg"), _sapo_from_trl, _no_trl_metrics, "seq_mean_token_mean"
    ),
    reference="Gao et al. 2025 (SAPO, arXiv 2511.20347); TRL loss_type 'sapo'; verl 'sapo'",
)
def sapo(batch: TokenBatch, tau_pos: float, tau_neg: float) -> MethodResult:
    r"""Soft gate: ``sigma(tau (w - 1)) * 4 / tau * A`` with ``tau = tau_pos`` for ``A > 0`` else ``tau_neg``.

    Its derivative in ``w`` is ``4 sigma'(tau (w-1)) A``, which is ``A`` at ``w = 1``: the vanilla
    policy gradient on-policy, smoothly fading away from ``w = 1``. Nothing is hard-clipped.
    """
    adv = batch.advantages
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * torch.expm1(batch.log_ratio)) * (4.0 / tau)
    return unclipped_result(gate * adv, batch)


def cispo_reference(logp, old_logp, advantages, mask, *, epsilon_low, epsilon_high):
    """CISPO (MiniMax-M1, 2025): ``sg[clip_reference(w, 1 - eps_low, 1 + eps_high)] A log pi``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    return torch.clamp(w, 1 - epsilon_low, 1 + epsilon_high).detach() * adv * logp


def _cispo_from_trl(config) -> dict[str, float]:
    """TRL's ``loss_type='cispo'`` caps the detached weight at its ``epsilon_high`` (else its ``epsilon``) and has no
    lower bound: ``epsilon_low = 1``, ``epsilon_high = cap - 1``."""
    cap = config.epsilon_high if config.epsilon_high is not None else config.epsilon
    return {"epsilon_low": 1.0, "epsilon_high": cap - 1.0}


def _cispo_trl_metrics(out, advantages, log_ratio, params, mean) -> dict[str, float]:
    """TRL's ``cispo_clip_ratio``: the tokens with ``A > 0`` whose weight the cap truncated."""
    return {"cispo_clip_ratio": mean(out.result.clipped_high & (advantages > 0))}


@register(
    "cispo",
    verl_loss_mode="cispo",
    reference_form=cispo_reference,
    params={
        "epsilon_low": Param(
            0.2,
            ge=0,
            le=1,
            help="CISPO: the IS weight is at least 1 - epsilon_low (1: no lower bound)",
            verl=(("actor", "clip_ratio_low"),),
        ),
        "epsilon_high": Param(
            0.2,
            gt=-1,
            help="CISPO: the IS weight is at most 1 + epsilon_high (TRL's epsilon_high is that cap itself)",
            verl=(("actor", "clip_ratio_high"),),
            trl_field=True,
        ),
    },
    default_form="soft",
    forms=("soft",),
    trl=TRLPeer("cispo", ("epsilon", "epsilon_high"), _cispo_from_trl, _cispo_trl_metrics, "token_mean", True),
    reference="MiniMax 2025 (MiniMax-M1, arXiv 2506.13585), CISPO; TRL loss_type 'cispo' (cap only); verl 'cispo'",
)
def cispo(batch: TokenBatch, epsilon_low: float, epsilon_high: float) -> MethodResult:
    r"""Clipped IS-weight policy optimisation: ``sg[clip(w, 1 - eps_low, 1 + eps_high)] A log pi``.

    The weight is detached, so the gradient is ``clip(w) A grad log pi`` for every token: no token loses its
    gradient (unlike PPO's clip), large ratios are only down-weighted. The value is that of verl's and TRL's loss
    (``log pi``, not ``w``). TRL's ``loss_type='cispo'`` is ``epsilon_low = 1`` (no lower bound) with the cap
    ``1 + epsilon_high`` = TRL's ``epsilon_high``. Flags: ``clipped_low`` / ``clipped_high`` where the weight was
    truncated from below / above; every token counts as kept."""
    w = torch.exp(batch.log_ratio)
    lower, upper = 1.0 - epsilon_low, 1.0 + epsilon_high
    weight = torch.clamp(w.detach(), lower, upper)
    objective = weight * batch.advantages * batch.logp

    def flags():
        return torch.ones_like(batch.mask), batch.mask & (w < lower), batch.mask & (w > upper)

    return MethodResult(objective, flags)


VESPO_LOG_FLOOR = math.log(1e-8)
"""VESPO clamps the sequence log-ratio to ``[log 1e-8, 20]`` (its reference code, and TRL's)."""


def vespo_log_weight(
    log_ratio: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, k_pos, lambda_pos, k_neg, lambda_neg
) -> torch.Tensor:
    r"""``log phi(W)`` per sequence, (B, 1): ``phi(W) = e^lambda W^k e^{-lambda W}`` (so ``phi(1) = 1``) with
    ``W = exp(clamp(sum_t clamp(log w_t, -20, 20), log 1e-8, 20))``, ``(k, lambda) = (k_pos, lambda_pos)`` where
    ``A >= 0`` else ``(k_neg, lambda_neg)``: (B, 1) for per-sequence advantages, (B, T) for per-token ones (TRL's
    broadcasting)."""
    seq = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)
    log_w = torch.clamp(seq, VESPO_LOG_FLOOR, 20.0)
    nonneg = advantages >= 0
    k = torch.where(nonneg, k_pos, k_neg)
    lam = torch.where(nonneg, lambda_pos, lambda_neg).clamp(min=1e-4)
    return lam + k * log_w - lam * torch.exp(log_w)


def vespo_reference(logp, old_logp, advantages, mask, *, vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg):
    """VESPO: ``sg[phi(W)] A log pi`` with ``W = prod_t w_t`` (log clamped per token to [-20, 20], in total to
    [log 1e-8, 20]) and ``phi(W) = W^k exp(lambda (1 - W))``, ``(k, lambda)`` by the sign of ``A`` (``A >= 0``: pos)."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    total = torch.where(mask, torch.log(w).clamp(-20, 20), torch.zeros_like(w)).sum(1, keepdim=True)
    big_w = torch.exp(total.clamp(math.log(1e-8), 20)).detach()
    k = torch.where(adv >= 0, torch.full_like(adv, vespo_k_pos), torch.full_like(adv, vespo_k_neg))
    lam = torch.where(adv >= 0, torch.full_like(adv, vespo_lambda_pos), torch.full_like(adv, vespo_lambda_neg))
    return big_w**k * torch.exp(lam * (1 - big_w)) * adv * logp


_VESPO_PARAMS = {  # TRL's GRPOConfig fields of the same names
    "vespo_k_pos": Param(2.0, ge=0, help="VESPO: exponent k of the gamma weight for A >= 0", trl_field=True),
    "vespo_lambda_pos": Param(3.0, gt=0, help="VESPO: rate lambda of the gamma weight for A >= 0", trl_field=True),
    "vespo_k_neg": Param(3.0, ge=0, help="VESPO: exponent k of the gamma weight for A < 0", trl_field=True),
    "vespo_lambda_neg": Param(2.0, gt=0, help="VESPO: rate lambda of the gamma weight for A < 0", trl_field=True),
}


def _vespo_from_trl(config) -> dict[str, float]:
    """TRL's ``loss_type='vespo'``: its four ``vespo_*`` fields are the rule's parameters."""
    return {name: getattr(config, name) for name in _VESPO_PARAMS}


def _vespo_trl_metrics(out, advantages, log_ratio, params, mean) -> dict[str, float]:
    """TRL's ``vespo/phi_seq_mean``: the mean gamma weight, over sequences when there is one weight per sequence,
    else over valid tokens."""
    m = out.mask
    y = torch.where(m, log_ratio.detach(), 0.0)
    phi = torch.exp(vespo_log_weight(y, m, advantages, *(params[k] for k in _VESPO_PARAMS))).nan_to_num(0.0)
    if phi.shape[1] == 1:
        return {"vespo/phi_seq_mean": float(phi.mean())}
    return {"vespo/phi_seq_mean": float((phi * m).sum() / m.sum().clamp(min=1))}


@register(
    "vespo",
    reference_form=vespo_reference,
    params=_VESPO_PARAMS,
    trl=TRLPeer(
        "vespo", tuple(_VESPO_PARAMS), _vespo_from_trl, _vespo_trl_metrics, "token_mean", True, folds_vllm_ratio=True
    ),
    default_form="soft",
    forms=("soft",),
    reference="VESPO (variational sequence-level soft policy optimisation); TRL loss_type 'vespo'",
)
def vespo(
    batch: TokenBatch, vespo_k_pos: float, vespo_lambda_pos: float, vespo_k_neg: float, vespo_lambda_neg: float
) -> MethodResult:
    r"""Sequence-level soft weight: ``sg[phi(W)] A log pi`` with the gamma weight ``phi`` of
    ``vespo_log_weight`` on the *product* of the sequence's token ratios ``W = prod_t w_t``.

    ``phi`` peaks at ``W = k / lambda`` and vanishes for ``W -> 0`` and ``W -> inf``: a sequence far off-policy
    contributes little, smoothly. It reads the token ratios themselves (``logp - old_logp``), whatever ratio level
    the loss uses, as TRL does."""
    log_ratio = torch.where(batch.mask, batch.logp - batch.old_logp, 0.0).detach()
    with torch.no_grad():
        log_phi = vespo_log_weight(
            log_ratio, batch.mask, batch.advantages, vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg
        )
        phi = torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return unclipped_result(phi * batch.advantages * batch.logp, batch)
