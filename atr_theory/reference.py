r"""Each rule's formula on one screen: plain reference forms of the clipping rules, PPO-style.

The registry's rules (``atr_theory.methods``) are written for speed: sign-bit selects, bounds cached per dtype,
workarounds for ``torch.compile``. Here each rule is the textbook formula in a few lines of torch, sharing no helper
with that fast path, so a reader sees the whole rule at once. ``tests/test_reference.py`` checks that
``atr_theory.policy_loss`` gives the same per-token objective and gradient as these on random batches.

Every function takes ``logp``, ``old_logp`` ((B, T) log-probabilities of the sampled tokens under pi and pi_old),
``advantages`` ((B,) or (B, T)), the boolean ``mask`` and the rule's parameters, and returns the (B, T) objective
to *maximise* (zero on padding); the loss is ``-`` its aggregation. ``w = exp(logp - old_logp)``; a frozen token
contributes ``A`` (the value of ``w_old A``, Eq. 5), which carries no gradient.

Rules whose ranges need a root finder or full distributions (dcpo, trgppo, tr_ppo, truly_ppo) and the randomised
clip_cov are pinned by brute force from their definitions in ``tests/test_oracles.py`` instead.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "REFERENCE_FORMS",
    "atr",
    "cispo",
    "clip",
    "clip_higher",
    "dual_clip",
    "dppo_kl",
    "dppo_tv",
    "dro",
    "dual_clip_higher",
    "gmpo",
    "gspo",
    "is_kl3",
    "kl1",
    "kl2",
    "kl_cov",
    "reinforce",
    "sapo",
    "vespo",
]


def _ratio_and_advantages(logp, old_logp, advantages, mask):
    adv = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
    log_w = torch.where(mask, logp - old_logp, torch.zeros_like(logp))
    return torch.exp(log_w), torch.where(mask, adv, torch.zeros_like(adv))


def ppo_min(w, adv, lower, upper):
    """PPO's pessimistic objective ``min(w A, clip(w, l, u) A)`` (Schulman et al. 2017, Eq. 7)."""
    return torch.minimum(w * adv, torch.clamp(w, lower, upper) * adv)


def eq5_mask(w, adv, keep):
    """The mask form (Eq. 5's operator alone, the Section 4 pure-clip reading): ``w A`` where the constraint holds,
    else the constant ``A`` (no gradient)."""
    return torch.where(keep, w * adv, adv.detach())


def clip(logp, old_logp, advantages, mask, epsilon=0.2, form="min"):
    """PPO / GRPO: keep ``w`` in ``[1 - eps, 1 + eps]``."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    if form == "min":
        return ppo_min(w, adv, 1 - epsilon, 1 + epsilon)
    return eq5_mask(w, adv, (w >= 1 - epsilon) & (w <= 1 + epsilon))


def clip_higher(logp, old_logp, advantages, mask, epsilon_low=0.2, epsilon_high=0.28, form="min"):
    """DAPO's Clip-Higher: keep ``w`` in ``[1 - eps_low, 1 + eps_high]``."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    if form == "min":
        return ppo_min(w, adv, 1 - epsilon_low, 1 + epsilon_high)
    return eq5_mask(w, adv, (w >= 1 - epsilon_low) & (w <= 1 + epsilon_high))


def dual_clip(logp, old_logp, advantages, mask, epsilon=0.2, dual_clip_c=3.0, form="min"):
    """Dual-clip PPO (Ye et al. 2020): PPO clip, and for ``A < 0`` the objective is at least ``c A``."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    inner = clip(logp, old_logp, advantages, mask, epsilon, form)
    return torch.where(adv < 0, torch.maximum(inner, dual_clip_c * adv), inner)


def dual_clip_higher(logp, old_logp, advantages, mask, epsilon_low=0.2, epsilon_high=0.28, dual_clip_c=3.0, form="min"):
    """Clip-Higher's range with the dual clip: for ``A < 0`` the objective is at least ``c A``."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    inner = clip_higher(logp, old_logp, advantages, mask, epsilon_low, epsilon_high, form)
    return torch.where(adv < 0, torch.maximum(inner, dual_clip_c * adv), inner)


def _divergence_rule(divergence, logp, old_logp, advantages, mask, delta, form):
    """Eq. 5 with ``C = divergence(w) <= delta``; the min form uses the range where ``C`` holds, found by bisection."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    if form == "mask":
        return eq5_mask(w, adv, divergence(w.detach()) <= delta)
    lower, upper = _constraint_interval(divergence, delta)
    return ppo_min(w, adv, lower, upper)


def _constraint_interval(divergence, delta, steps=200):
    """The ratios ``[l, u]`` around ``w = 1`` where ``divergence(w) <= delta`` (a divergence falls to 0 at ``w = 1``
    and rises away from it), by bisection in ``log w``; a side where it never exceeds delta is unbounded."""

    def edge(direction):
        inside, outside = 0.0, direction
        while divergence(torch.tensor(math.exp(outside), dtype=torch.float64)) <= delta:
            outside *= 2
            if abs(outside) > 700:
                return direction * math.inf
        for _ in range(steps):
            middle = (inside + outside) / 2
            if divergence(torch.tensor(math.exp(middle), dtype=torch.float64)) <= delta:
                inside = middle
            else:
                outside = middle
        return inside

    return math.exp(edge(-1.0)), math.exp(edge(1.0))


def atr(logp, old_logp, advantages, mask, delta=0.07, form="mask"):
    """ATR-GRPO (this paper): keep ``w A`` while ``k3 = w - 1 - log w <= delta``."""
    return _divergence_rule(lambda w: w - 1 - torch.log(w), logp, old_logp, advantages, mask, delta, form)


def kl1(logp, old_logp, advantages, mask, delta=0.07, form="mask"):
    """Keep ``w A`` while ``k1 = -log w <= delta`` (one-sided: no upper limit)."""
    return _divergence_rule(lambda w: -torch.log(w), logp, old_logp, advantages, mask, delta, form)


def kl2(logp, old_logp, advantages, mask, delta=0.07, form="mask"):
    """Keep ``w A`` while ``k2 = (log w)^2 / 2 <= delta``."""
    return _divergence_rule(lambda w: torch.log(w) ** 2 / 2, logp, old_logp, advantages, mask, delta, form)


def is_kl3(logp, old_logp, advantages, mask, delta=0.07, form="mask"):
    """Keep ``w A`` while the importance-weighted ``w k3(1/w) = 1 - w + w log w <= delta``."""
    return _divergence_rule(lambda w: 1 - w + w * torch.log(w), logp, old_logp, advantages, mask, delta, form)


def sapo(logp, old_logp, advantages, mask, tau_pos=1.0, tau_neg=1.05):
    """SAPO's soft gate (Gao et al. 2025): ``sigma(tau (w - 1)) 4 / tau A``, ``tau = tau_pos`` if ``A > 0`` else
    ``tau_neg``."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    tau = torch.where(adv > 0, torch.full_like(w, tau_pos), torch.full_like(w, tau_neg))
    return torch.sigmoid(tau * (w - 1)) * 4 / tau * adv


def cispo(logp, old_logp, advantages, mask, epsilon_low=0.2, epsilon_high=0.2):
    """CISPO (MiniMax-M1, 2025): ``sg[clip(w, 1 - eps_low, 1 + eps_high)] A log pi``."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    return torch.clamp(w, 1 - epsilon_low, 1 + epsilon_high).detach() * adv * logp


def vespo(
    logp, old_logp, advantages, mask, vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0
):
    """VESPO: ``sg[phi(W)] A log pi`` with ``W = prod_t w_t`` (log clamped per token to [-20, 20], in total to
    [log 1e-8, 20]) and ``phi(W) = W^k exp(lambda (1 - W))``, ``(k, lambda)`` by the sign of ``A`` (``A >= 0``: pos)."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    total = torch.where(mask, torch.log(w).clamp(-20, 20), torch.zeros_like(w)).sum(1, keepdim=True)
    big_w = torch.exp(total.clamp(math.log(1e-8), 20)).detach()
    k = torch.where(adv >= 0, torch.full_like(adv, vespo_k_pos), torch.full_like(adv, vespo_k_neg))
    lam = torch.where(adv >= 0, torch.full_like(adv, vespo_lambda_pos), torch.full_like(adv, vespo_lambda_neg))
    return big_w**k * torch.exp(lam * (1 - big_w)) * adv * logp


def gspo(logp, old_logp, advantages, mask, epsilon_low=3e-4, epsilon_high=4e-4, form="min"):
    """GSPO-token (Zheng et al. 2025, Eq. 11): the sequence ratio ``s = exp(mean_t log w_t)`` carried by each token
    as ``s_t = sg[s] w_t / sg[w_t]``, in PPO's min (or Eq. 5's mask) with ``[1 - eps_low, 1 + eps_high]``."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    log_w = torch.log(w)
    s = torch.exp(log_w.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1))
    s_t = s.detach() * w / w.detach()
    if form == "min":
        objective = ppo_min(s_t, adv, 1 - epsilon_low, 1 + epsilon_high)
    else:
        objective = eq5_mask(s_t, adv, (s.detach() >= 1 - epsilon_low) & (s.detach() <= 1 + epsilon_high))
    return torch.where(mask, objective, torch.zeros_like(w))


def gmpo(logp, old_logp, advantages, mask, epsilon_low=0.4, epsilon_high=0.4, form="min"):
    """GMPO (Zhao et al. 2025): the sequence's ``mean_t A_t`` times the geometric mean of its token ratios, each
    ``log w_t`` clipped PPO-style by its advantage's sign (``A > 0``: at most ``eps_high``; ``A < 0``: at least
    ``-eps_low``; ``A = 0``: 0). Every token of a sequence holds the sequence's value, so the
    ``seq_mean_token_mean`` aggregation of this (B, T) tensor is GMPO's batch mean."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    log_w = torch.log(w)
    signed = torch.sign(adv)
    clipped = signed * torch.minimum(signed * log_w, signed * torch.clamp(log_w, -epsilon_low, epsilon_high))
    n = mask.sum(1, keepdim=True).clamp(min=1)
    sequence = (adv.sum(1, keepdim=True) / n) * torch.exp(clipped.sum(1, keepdim=True) / n)
    return sequence.expand_as(w)


def _binary_kl(p_old, p_new):
    """``KL(Ber(p_old) || Ber(p_new))`` as written (textbook form; float64 tests keep ``p`` away from 1)."""
    return p_old * torch.log(p_old / p_new) + (1 - p_old) * torch.log((1 - p_old) / (1 - p_new))


def _dppo(divergence_exceeds, logp, old_logp, advantages, mask, is_cap, form):
    """DPPO (Qi et al. 2026): ``sg[min(w, c)] A log pi`` where the token stays inside its bound, else 0. ``min``:
    only the side the advantage pushes towards (``A > 0``: rising; ``A <= 0``: falling); ``mask``: both sides."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    p_old, p_new = torch.exp(old_logp), torch.exp(logp).detach()
    rose, fell = divergence_exceeds(p_old, p_new)
    outside = torch.where(adv > 0, rose, fell) if form == "min" else rose | fell
    return torch.where(outside, torch.zeros_like(w), torch.clamp(w, max=is_cap).detach() * adv * logp)


def dppo_tv(logp, old_logp, advantages, mask, delta_low=0.2, delta_high=0.2, is_cap=20.0, form="min"):
    """DPPO-Binary-TV: the token's probability change ``p - p_old`` stays in ``[-delta_low, delta_high]``."""

    def exceeds(p_old, p_new):
        return p_new - p_old > delta_high, p_new - p_old < -delta_low

    return _dppo(exceeds, logp, old_logp, advantages, mask, is_cap, form)


def dppo_kl(logp, old_logp, advantages, mask, delta_low=0.2, delta_high=0.2, is_cap=20.0, form="min"):
    """DPPO-Binary-KL: ``KL(Ber(p_old) || Ber(p))`` stays at most ``delta_high`` (``p`` rose) or ``delta_low``
    (``p`` fell)."""

    def exceeds(p_old, p_new):
        kl = _binary_kl(p_old, p_new)
        return (p_new > p_old) & (kl > delta_high), (p_new < p_old) & (kl > delta_low)

    return _dppo(exceeds, logp, old_logp, advantages, mask, is_cap, form)


def reinforce(logp, old_logp, advantages, mask):
    """REINFORCE (Williams 1992) / GPG: ``A log pi``."""
    _, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    return adv * logp


def dro(logp, old_logp, advantages, mask, dro_beta=0.1):
    """DRO (Richemond et al. 2024): ``A log pi - beta / 2 (log pi - log pi_old)^2``."""
    _, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    return adv * logp - 0.5 * dro_beta * (logp - old_logp) ** 2


def kl_cov(logp, old_logp, advantages, mask, cov_ratio=2e-3, kl_coef=1.0):
    """KL-Cov (Cui et al. 2025): ``w A``, and the ``max(1, int(cov_ratio n))`` valid tokens with the largest centred
    ``(A - mean A)(log pi - mean log pi)`` get the penalty ``- kl_coef |log w|``."""
    w, adv = _ratio_and_advantages(logp, old_logp, advantages, mask)
    n = int(mask.sum())
    a, lp = adv[mask].detach(), logp[mask].detach()
    cov = (a - a.mean()) * (lp - lp.mean())
    chosen = torch.zeros(n, dtype=torch.bool)
    chosen[torch.topk(cov, max(1, int(cov_ratio * n))).indices] = True
    penalised = torch.zeros_like(mask)
    penalised[mask] = chosen
    return w * adv - torch.where(penalised, kl_coef * torch.log(w).abs(), torch.zeros_like(w))


REFERENCE_FORMS = {
    "clip": clip,
    "clip_higher": clip_higher,
    "dual_clip": dual_clip,
    "dual_clip_higher": dual_clip_higher,
    "cispo": cispo,
    "vespo": vespo,
    "atr": atr,
    "kl1": kl1,
    "kl2": kl2,
    "is_kl3": is_kl3,
    "sapo": sapo,
    "gspo": gspo,
    "gmpo": gmpo,
    "dppo_tv": dppo_tv,
    "dppo_kl": dppo_kl,
    "reinforce": reinforce,
    "dro": dro,
    "kl_cov": kl_cov,
}
"""Registry name -> its reference form (the rules with one; the others: ``tests/test_oracles.py``)."""
