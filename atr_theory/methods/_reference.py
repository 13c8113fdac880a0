r"""What the rules' reference forms share, and nothing the fast path uses.

Each registered rule with a ``reference_form`` (``atr_theory.registry.MethodSpec``) has it written beside its fast
path in its family module: the textbook formula in a few lines of torch, sharing no helper with the fast path
(``tests/test_reference.py`` checks both the equality and that separation). Every reference form takes ``logp``,
``old_logp`` ((B, T) log-probabilities of the sampled tokens under pi and pi_old), ``advantages`` ((B,) or (B, T)),
the boolean ``mask`` and the rule's parameters as keywords, and returns the (B, T) objective to *maximise*; the loss
is ``-`` its aggregation. ``w = exp(logp - old_logp)``; a frozen token contributes ``A`` (the value of ``w_old A``,
Eq. 5), which carries no gradient.
"""

from __future__ import annotations

import math

import torch


def ratio_and_advantages(logp, old_logp, advantages, mask):
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


def divergence_rule(divergence, logp, old_logp, advantages, mask, delta, form):
    """Eq. 5 with ``C = divergence(w) <= delta``; the min form uses the range where ``C`` holds, found by bisection."""
    w, adv = ratio_and_advantages(logp, old_logp, advantages, mask)
    if form == "mask":
        return eq5_mask(w, adv, divergence(w.detach()) <= delta)
    lower, upper = constraint_interval(divergence, delta)
    return ppo_min(w, adv, lower, upper)


def constraint_interval(divergence, delta, steps=200):
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
