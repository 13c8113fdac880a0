r"""Masks decided by a divergence of the sampled token's Bernoulli: DPPO (Qi et al. 2026, "Rethinking the Trust
Region in LLM Reinforcement Learning", arXiv 2602.04879; verl ``dppo_tv`` / ``dppo_kl``).

A token with old probability ``p`` and new probability ``p w`` is seen as the Bernoulli "this token or another":
its total variation is ``|p w - p|`` and its KL is the binary ``KL(Ber(p) || Ber(p w))``, both the smallest
full-distribution divergence compatible with the sampled token's move. Unlike a ratio range, the mask depends on
``p`` itself: a rare token may move its ratio far, a frequent one only a little. The closest relative of ATR:
``KL(Ber(p) || Ber(p w)) / p -> w - 1 - log w = k3(w)`` as ``p -> 0``, so for rare tokens DPPO-KL with bound
``delta`` is ATR with bound ``delta / p`` (``tests/test_divergence_masks.py``).

Both rules keep verl's form: the gradient ``sg[min(w, c)] A grad log pi`` on the tokens the mask keeps (a
REINFORCE-style truncated IS weight, ``c`` = ``is_cap``, verl's ``clip_ratio_c``), value ``sg[min(w, c)] A log pi``
there and 0 elsewhere. ``form="min"`` (verl's) masks only the side the advantage pushes towards: for ``A > 0`` a
token is dropped only when its probability rose past the bound, for ``A <= 0`` only when it fell past it.
``form="mask"`` drops a token outside the bound on either side (Eq. 5's operator alone with this divergence).
"""

from __future__ import annotations

import torch

from ..divergence import bernoulli_kl_and_slope
from ..registry import MethodResult, Param, TokenBatch, register
from . import _reference as plain

__all__ = ["binary_kl", "binary_kl_fast", "binary_kl_fast_error_bound", "binary_tv", "dppo_kl", "dppo_tv"]

_FORMS = ("min", "mask")
DELTA_LOW = Param(
    0.2,
    gt=0,
    help="DPPO: divergence bound for a token whose probability fell (verl clip_ratio_low)",
    verl=(("actor", "clip_ratio_low"),),
)
DELTA_HIGH = Param(
    0.2,
    gt=0,
    help="DPPO: divergence bound for a token whose probability rose (verl clip_ratio_high)",
    verl=(("actor", "clip_ratio_high"),),
)
IS_CAP = Param(
    20.0,
    gt=0,
    help="DPPO: the detached IS weight is min(w, is_cap) (verl clip_ratio_c)",
    verl=(("actor", "clip_ratio_c"),),
)
_REFERENCE = "Qi et al. 2026 (DPPO, arXiv 2602.04879), sail-sg/Stable-RL; verl '{}'"


def binary_tv(log_ratio: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    r"""Signed ``p w - p = p (e^y - 1)`` with ``p = exp(old_logp)``: the sampled token's probability change, whose
    absolute value is the total variation between ``Ber(p)`` and ``Ber(p w)``. ``expm1``: exact near ``w = 1``."""
    return torch.exp(old_logp) * torch.expm1(log_ratio)


def binary_kl(log_ratio: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    r"""``KL(Ber(p) || Ber(p w)) = p log(1/w) + (1 - p) log((1 - p) / (1 - p w))`` with ``p = exp(old_logp)``,
    ``w = e^y``, evaluated as ``p k3(y) + q k3(y')`` (``atr_theory.ranges.bernoulli_kl_of_log_ratio``), with
    ``q = 1 - p = -expm1(old_logp)`` exact for ``p`` near 1; ``-y`` at ``p = 1``; ``+inf`` where ``p w >= 1``.

    verl writes ``log((1 - p + 1e-8) / (1 - p w + 1e-8))``: off where ``1 - p w`` is ~1e-8 or smaller
    (``tests/test_divergence_masks.py`` measures it against mpmath)."""
    p = torch.exp(old_logp)
    q = -torch.expm1(old_logp)
    certain = q <= 0
    safe_q = torch.where(certain, torch.ones_like(q), q)
    kl, _ = bernoulli_kl_and_slope(log_ratio, p, safe_q)
    kl = torch.where(certain, -log_ratio, kl)
    return torch.nan_to_num(kl, nan=torch.inf)  # log1p of a negative number: p w > 1


def binary_kl_fast(log_ratio: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    r"""``KL(Ber(p) || Ber(p w))`` to a small *absolute* error, in a dozen elementwise passes with four
    transcendental ones (``binary_kl``'s series take about forty): what a comparison with a bound ``delta`` needs,
    and all DPPO-KL's fast path uses.

    ``KL = q log(q / q') - p y`` with ``p = exp(old_logp)``, ``q = -expm1(old_logp)``, ``y = log w`` and the new probability's
    complement ``q' = -expm1(old_logp + y)``. ``old_logp + y`` recovers ``logp`` exactly where ``logp = 0`` (the
    subtraction that made ``y`` was exact there), so a token whose new probability is 1 has ``q' = 0`` and an
    infinite KL; ``q' < 0`` (a new probability above 1, possible with a sequence-level ratio) counts as 0. At ``y = 0``
    ``q' = q`` exactly and the KL is exactly 0. ``p = 1`` (``q = 0``) gives ``-y``: inside the log ``q`` is clamped to the
    smallest normal number and ``q'`` replaced by 1 (the term is ``0 x finite`` either way; this keeps the padding,
    where ``old_logp = logp = 0``, free of ``log(inf)``, which takes a slow path on CPU).

    Not relative accuracy: for a tiny KL (``w`` near 1) the two terms cancel. The error is at most
    ``binary_kl_fast_error_bound`` (a few ulps of ``p |y| + q |log q| + q |log q'| + 1``; measured against mpmath in
    ``tests/test_divergence_masks.py``), so a decision ``KL > delta`` can differ from the exact one only for a token
    that close to the bound."""
    expm1_old = torch.expm1(old_logp)
    p, q = torch.exp(old_logp), -expm1_old
    q_new = torch.expm1(old_logp + log_ratio).neg_().clamp_min_(0.0).add_(expm1_old >= 0)
    return q * torch.log_(torch.clamp(q, min=torch.finfo(q.dtype).tiny) / q_new) - p * log_ratio


def binary_kl_fast_error_bound(log_ratio: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    r"""The absolute error ``binary_kl_fast`` is claimed (and tested) to stay within: ``8 eps (p |y| + q |log q| +
    q |log q'| + 1)``, ``eps`` the dtype's machine epsilon. Each of the formula's few roundings is a relative error of
    one ``eps`` in ``p``, ``q``, ``q'`` (``exp`` and ``expm1`` are accurate to the last bit or so), ``y`` or a
    product; the log of a ratio correct to a few ``eps`` is off by a few ``eps`` absolute, which the factor ``q``
    keeps below ``q`` times that, and the ``+ 1`` covers the sum's own rounding. Computed in float64 (a bound, not a
    value the rule needs)."""
    y, old = log_ratio.double(), old_logp.double()
    eps = torch.finfo(log_ratio.dtype).eps
    p = torch.exp(old)
    q = -torch.expm1(old)
    q_new = -torch.expm1(old + y)
    scale = p * y.abs() + q * (torch.log(q).abs() + torch.log(q_new).abs()) + 1.0
    return 8 * eps * torch.nan_to_num(scale, nan=torch.inf, posinf=torch.inf)


def dppo_drop(
    batch: TokenBatch, divergence: torch.Tensor, delta_low: float, delta_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(drop, past)``: where DPPO drops a token, and where its divergence is past its bound (0 where the ratio is 1;
    NaN counts as past): past ``delta_high`` where its probability rose, past ``delta_low`` where it fell.
    ``form="mask"`` drops every token past; ``form="min"`` only those on the side the advantage pushes towards
    (``A > 0``: rising; ``A <= 0``: falling)."""
    rose = batch.log_ratio.detach() > 0
    bound = delta_high if delta_low == delta_high else torch.where(rose, delta_high, delta_low)
    past = ~(divergence <= bound)
    if batch.form == "mask":
        return past, past
    return past & (rose == (batch.advantages > 0)), past


def dppo_result(batch: TokenBatch, decision: tuple[torch.Tensor, torch.Tensor], is_cap: float) -> MethodResult:
    """DPPO's objective given ``dppo_drop``'s decision: see the module docstring. Its mask form keeps the tokens
    not past the bound (``MethodResult.mask_form_kept``)."""
    drop, past = decision
    adv = batch.advantages
    w = torch.exp(batch.log_ratio)
    weight = torch.clamp(w.detach(), max=is_cap)
    objective = torch.where(drop, torch.zeros_like(w), weight * adv * batch.logp)

    def flags():
        y = batch.log_ratio
        return ~drop, drop & (y < 0), (drop & (y > 0)) | (~drop & (w > is_cap))

    return MethodResult(objective, flags, lambda: ~past)


def _binary_kl_reference(p_old, p_new):
    """``KL(Ber(p_old) || Ber(p_new))`` as written (textbook form; float64 tests keep ``p`` away from 1)."""
    return p_old * torch.log(p_old / p_new) + (1 - p_old) * torch.log((1 - p_old) / (1 - p_new))


def _dppo_reference(divergence_exceeds, logp, old_logp, advantages, mask, is_cap, form):
    """DPPO (Qi et al. 2026): ``sg[min(w, c)] A log pi`` where the token stays inside its bound, else 0. ``min``:
    only the side the advantage pushes towards (``A > 0``: rising; ``A <= 0``: falling); ``mask``: both sides."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    p_old, p_new = torch.exp(old_logp), torch.exp(logp).detach()
    rose, fell = divergence_exceeds(p_old, p_new)
    outside = torch.where(adv > 0, rose, fell) if form == "min" else rose | fell
    return torch.where(outside, torch.zeros_like(w), torch.clamp(w, max=is_cap).detach() * adv * logp)


def dppo_tv_reference(logp, old_logp, advantages, mask, *, delta_low, delta_high, is_cap, form):
    """DPPO-Binary-TV: the token's probability change ``p - p_old`` stays in ``[-delta_low, delta_high]``."""

    def exceeds(p_old, p_new):
        return p_new - p_old > delta_high, p_new - p_old < -delta_low

    return _dppo_reference(exceeds, logp, old_logp, advantages, mask, is_cap, form)


@register(
    "dppo_tv",
    verl_loss_mode="dppo_tv",
    reference_form=dppo_tv_reference,
    params={"delta_low": DELTA_LOW, "delta_high": DELTA_HIGH, "is_cap": IS_CAP},
    default_form="min",
    forms=_FORMS,
    reference=_REFERENCE.format("dppo_tv"),
)
def dppo_tv(batch: TokenBatch, delta_low: float, delta_high: float, is_cap: float) -> MethodResult:
    r"""DPPO-Binary-TV: keep a token while its probability change ``p w - p`` lies in ``[-delta_low, delta_high]``
    (``binary_tv``): a per-token ratio range ``[1 - delta_low / p, 1 + delta_high / p]``."""
    with torch.no_grad():
        change = binary_tv(batch.log_ratio, batch.old_logp).abs()
        decision = dppo_drop(batch, change, delta_low, delta_high)
    return dppo_result(batch, decision, is_cap)


def dppo_kl_reference(logp, old_logp, advantages, mask, *, delta_low, delta_high, is_cap, form):
    """DPPO-Binary-KL: ``KL(Ber(p_old) || Ber(p))`` stays at most ``delta_high`` (``p`` rose) or ``delta_low``
    (``p`` fell)."""

    def exceeds(p_old, p_new):
        kl = _binary_kl_reference(p_old, p_new)
        return (p_new > p_old) & (kl > delta_high), (p_new < p_old) & (kl > delta_low)

    return _dppo_reference(exceeds, logp, old_logp, advantages, mask, is_cap, form)


@register(
    "dppo_kl",
    verl_loss_mode="dppo_kl",
    reference_form=dppo_kl_reference,
    params={"delta_low": DELTA_LOW, "delta_high": DELTA_HIGH, "is_cap": IS_CAP},
    default_form="min",
    forms=_FORMS,
    reference=_REFERENCE.format("dppo_kl"),
)
def dppo_kl(batch: TokenBatch, delta_low: float, delta_high: float, is_cap: float) -> MethodResult:
    r"""DPPO-Binary-KL: keep a token while ``KL(Ber(p) || Ber(p w))`` (``binary_kl_fast``) is at most ``delta_high``
    (probability rose) or ``delta_low`` (fell): TRGPPO's range ``[l_KL(p), u_KL(p)]`` with two bounds."""
    with torch.no_grad():
        decision = dppo_drop(batch, binary_kl_fast(batch.log_ratio, batch.old_logp), delta_low, delta_high)
    return dppo_result(batch, decision, is_cap)
