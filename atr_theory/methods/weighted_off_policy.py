r"""Rules written for stale, off-policy data: M2PO's second-moment token mask (AReaL), TOPR's tapered weight and Kimi
k1.5's squared log-ratio penalty (ROLL's ``pg_variant``).

* ``m2po``: batch-level. It drops the tokens of largest ``(log w)^2`` until the mean ``(log w)^2`` of the tokens left
  is below a threshold, so whether a token keeps its gradient depends on every other token of the batch
  ``policy_loss`` sees (one micro-batch in a trainer, as in AReaL, whose loss function sees one micro-batch).
* ``topr``: per token, a detached truncated weight on ``A log pi`` for the tokens with ``A <= 0``.
* ``kimi15``: per token, ``A log pi`` with a quadratic penalty on ``log w``: DRO's objective (``unclipped.dro``).

Each rule names the peer code it matches (``PeerCode``): AReaL 1.0.4's own functions run in
``tests/test_weighted_off_policy.py`` on the same batches; ROLL is not on PyPI, so its lines are copied there as a
test-only oracle (``tests/roll_pg_variants.py``, with its source and licence).
"""

from __future__ import annotations

import torch

from ..registry import MethodResult, Param, PeerCode, TokenBatch, register
from . import _reference as plain
from .unclipped import dro

__all__ = ["kimi15", "m2po", "m2po_keep", "topr"]

_ORACLE = "tests/test_weighted_off_policy.py"
_ROLL = "ROLL 8eb27cc (not on PyPI)"
_ROLL_FILE = "`roll/pipeline/rlvr/actor_pg_worker.py`"


def m2po_keep(log_ratio: torch.Tensor, mask: torch.Tensor, m2_threshold: float) -> torch.Tensor:
    r"""The tokens M2PO keeps, (B, T) bool: with ``q = (log w)^2`` on the ``n`` valid tokens sorted in decreasing order
    ``s_0 >= s_1 >= ...``, ``k`` is the first index whose suffix mean ``mean(s_k, ..., s_{n-1})`` is below
    ``m2_threshold`` (``n - 1`` if none is: only the smallest stays), and the tokens with ``q >= s_{k-1}`` are dropped
    (none for ``k = 0``).

    AReaL drops exactly the first ``k`` of its ``torch.sort`` order; where tokens tie at ``s_{k-1}`` (two identical
    completions of one prompt) its sort picks which of them go, here all of them go: the decision does not depend on
    the order of the batch, and the mean of the tokens left stays below the threshold (the mean of the smallest
    values only falls as values are taken away).

    Every dropped token has ``q > m2_threshold`` (the suffix mean crosses the threshold at it: ``s_{k-1} = (n-k+1)
    A_{k-1} - (n-k) A_k > m2_threshold``), so only those are sorted: the others enter as one sum and one count, and
    become zeros in the sort (a sort of mostly equal keys costs a third of a sort of distinct ones on a CPU). On a
    device, or while compiling, no host read (``torch.compile(fullgraph=True)`` traces it); called eagerly on a CPU,
    where reading the count costs nothing, only the candidates are sorted (one zero after them stands for the rest):
    the same values in the same order, so the same tokens. The suffix sums in float64."""
    with torch.no_grad():
        q = log_ratio.detach().square()
        candidate = mask & (q > m2_threshold)
        if q.device.type == "cpu" and not torch.compiler.is_compiling():
            s = torch.cat([torch.sort(q[candidate], descending=True).values, q.new_zeros(1)])
        else:
            s = torch.sort(torch.where(candidate, q, 0.0).flatten(), descending=True).values  # the candidates first
        n, m = mask.sum(), candidate.sum()
        rest = torch.where(mask & ~candidate, q, 0.0).sum(dtype=torch.float64)  # every q <= m2_threshold
        index = torch.arange(s.numel(), device=s.device)
        suffix = s.double().flip(0).cumsum(0).flip(0) + rest  # at index j <= m: the sum of s_j, ..., s_{n-1}
        # the first suffix mean below the threshold is at an index j <= m (past m every value is <= the threshold)
        below = (suffix / (n - index).clamp(min=1) < m2_threshold) & (index <= m) & (index < n)
        k = torch.where(below.any(), below.to(torch.uint8).argmax(), (n - 1).clamp(min=0))
        # s_{k-1}: past the sorted candidates every value is a zero (k = n - 1 where no suffix mean is below)
        s_before = torch.where(k - 1 < s.numel(), s.gather(0, (k - 1).clamp(0, s.numel() - 1).view(1)), 0.0)
        cut = torch.where(k > 0, s_before, torch.inf)
        smallest = torch.where(mask, q, torch.inf).amin()  # only it stays where no suffix mean is below
        return mask & ((q < cut) | (q <= smallest))


def _m2po_keep_reference(q: list[float], m2_threshold: float) -> list[bool]:
    """M2PO's kept tokens from a list of ``(log w)^2`` (float64): take the largest value away while the mean of what
    is left is at least ``m2_threshold``, one token at a time, keeping one at least; then let every token tied with
    a dropped one go too."""
    left = sorted(q, reverse=True)
    dropped = 0
    while dropped < len(left) - 1 and sum(left[dropped:]) / (len(left) - dropped) >= m2_threshold:
        dropped += 1
    if dropped == 0:
        return [True] * len(q)
    cut = left[dropped - 1]
    if cut == left[-1]:  # every value left ties with the last one dropped: keep the smallest ones
        return [x <= left[-1] for x in q]
    return [x < cut for x in q]


def m2po_reference(logp, old_logp, advantages, mask, *, m2_threshold, form):
    r"""M2PO (Zheng et al. 2025, Sec. 4): ``M_t w_t A_t`` with ``M_t = 0`` for the tokens of largest ``(log w)^2``,
    taken away one at a time until the batch's second moment ``mean (log w)^2`` of the rest is below the threshold."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    q = [float(logp[b, t].detach() - old_logp[b, t]) ** 2 for b, t in mask.nonzero().tolist()]
    keep = torch.zeros_like(mask)
    for (b, t), kept in zip(mask.nonzero().tolist(), _m2po_keep_reference(q, m2_threshold)):
        keep[b, t] = kept
    return torch.where(keep, w * adv, torch.zeros_like(w))


@register(
    "m2po",
    reference_form=m2po_reference,
    params={
        "m2_threshold": Param(
            0.04,
            gt=0,
            help="M2PO: drop the tokens of largest (log w)^2 until the batch's mean (log w)^2 is below it "
            "(AReaL actor.m2_threshold)",
        )
    },
    default_form="mask",
    forms=("mask",),
    ratio_mask_gradient=True,
    peers=(
        PeerCode(
            "AReaL 1.0.4",
            "actor.m2_threshold",
            (("m2_threshold", "m2_threshold"),),
            "`areal/trainer/ppo/actor.py` L769-850 (`_apply_m2po_masking`, `_get_m2po_loss_mask`; applied to the loss "
            "mask at L447-448), with `ppo_actor_loss_fn` (`areal/utils/functional/functional.py` L429) unclipped",
            _ORACLE,
        ),
    ),
    reference="Zheng et al. 2025 (M2PO, 'Prosperity before Collapse', arXiv 2510.01161); AReaL actor.m2_threshold",
)
def m2po(batch: TokenBatch, m2_threshold: float) -> MethodResult:
    r"""Second-moment trust region: drop the tokens of largest ``(log w)^2`` until the batch's mean ``(log w)^2`` is
    below ``m2_threshold`` (``m2po_keep``); the others keep the unclipped ``w A``, a dropped token contributes 0.

    Batch-level: the cut ``|log w| < c`` is chosen by the batch's own ratios. One form, ``mask``: the dropped tokens
    lose their gradient whatever their advantage's sign, as M2PO's objective ``M_t w_t A_t`` (Zheng et al. 2025) has it and AReaL
    runs it (its ``_apply_m2po_masking`` takes them out of the loss mask before the PPO loss); PPO's min with the cut
    would keep the dropped tokens on the side the advantage does not favour, which neither source does. AReaL also
    divides its token mean by the kept tokens only; here the aggregation counts every valid token."""
    keep = m2po_keep(batch.log_ratio, batch.mask, m2_threshold)
    w = torch.exp(batch.log_ratio)
    objective = torch.where(keep, w * batch.advantages, 0.0)

    def flags():
        dropped = batch.mask & ~keep
        return keep, dropped & (batch.log_ratio < 0), dropped & (batch.log_ratio > 0)

    return MethodResult(objective, flags)


def topr_reference(logp, old_logp, advantages, mask, *, topr_positive_weight, topr_negative_weight):
    r"""TOPR (Le Roux et al. 2025, Eq. 8), per token as ROLL computes it: ``A log pi`` (no importance weight) for
    ``A > 0``, ``sg[clip(w, 0, 1)] A log pi`` for ``A <= 0``, each times its weight."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    tapered = torch.clamp(w, 0.0, 1.0).detach()
    weight = torch.where(adv > 0, torch.full_like(w, topr_positive_weight), topr_negative_weight * tapered)
    return weight * adv * logp


@register(
    "topr",
    reference_form=topr_reference,
    params={
        "topr_positive_weight": Param(
            1.0, ge=0, help="TOPR: weight of the tokens with A > 0 (ROLL topr_positive_weight)"
        ),
        "topr_negative_weight": Param(
            1.0, ge=0, help="TOPR: weight of the tokens with A <= 0 (ROLL topr_negative_weight)"
        ),
    },
    default_form="soft",
    forms=("soft",),
    peers=(
        PeerCode(
            _ROLL,
            "pg_variant=topr",
            (("topr_positive_weight", "topr_positive_weight"), ("topr_negative_weight", "topr_negative_weight")),
            f"{_ROLL_FILE} L253-331 (`_compute_topr_loss`: L295 and L299-305), splitting by the sign of `A` where ROLL "
            "splits by `scores > 0`",
            _ORACLE,
        ),
    ),
    reference="Le Roux et al. 2025 (TOPR, 'Tapered Off-Policy REINFORCE', arXiv 2503.14286); ROLL pg_variant 'topr'",
)
def topr(batch: TokenBatch, topr_positive_weight: float, topr_negative_weight: float) -> MethodResult:
    r"""Tapered off-policy REINFORCE: ``c_+ A log pi`` where ``A > 0``, ``c_- sg[min(w, 1)] A log pi`` where ``A <= 0``
    (``c_+``, ``c_-`` the two weights).

    A soft rule (one form, ``soft``): no token loses its gradient; a negative token's weight tapers as its probability
    falls below the old one, so pushing a bad completion down fades out instead of diverging, and a positive one keeps
    the plain supervised gradient. The ratio is each token's (ROLL's); the paper truncates the whole trajectory's ratio
    ``prod_t w_t`` instead. Flags: ``clipped_high`` where a token with ``A <= 0`` had its weight cut at 1."""
    adv = batch.advantages
    w = torch.exp(batch.log_ratio)
    negative = adv <= 0
    weight = torch.where(negative, torch.clamp(w.detach(), max=1.0) * topr_negative_weight, topr_positive_weight)
    objective = weight * adv * batch.logp

    def flags():
        return torch.ones_like(batch.mask), torch.zeros_like(batch.mask), batch.mask & negative & (w > 1)

    return MethodResult(objective, flags)


def kimi15_reference(logp, old_logp, advantages, mask, *, kimi15_tau):
    r"""Kimi k1.5 (Kimi Team 2025, Eq. 3) per token, as ROLL computes it: ``A log pi - tau / 2 (log pi - log
    pi_old)^2``."""
    _, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    return adv * logp - kimi15_tau / 2 * (logp - old_logp) ** 2


@register(
    "kimi15",
    reference_form=kimi15_reference,
    params={
        "kimi15_tau": Param(0.1, gt=0, help="Kimi k1.5: weight tau of the penalty tau/2 (log w)^2 (ROLL kimi15_tau)")
    },
    default_form="none",
    forms=("none",),
    peers=(
        PeerCode(
            _ROLL,
            "pg_variant=kimi15",
            (("kimi15_tau", "kimi15_tau"),),
            f"{_ROLL_FILE} L408-442 (`_compute_kimi15_loss`: L430)",
            _ORACLE,
        ),
    ),
    reference="Kimi Team 2025 (Kimi k1.5, arXiv 2501.12599), Eq. 3 per token; ROLL pg_variant 'kimi15'",
)
def kimi15(batch: TokenBatch, kimi15_tau: float) -> MethodResult:
    r"""Kimi k1.5's policy loss per token: ``A log pi - (tau / 2) (log w)^2``, DRO's objective with ``beta = tau``
    (``dro``: the same values and gradient); every token is kept.

    One form, ``none``: no ratio range, a penalty. The paper's Eq. 3 squares the log-ratio of the whole response
    (``(sum_t log w_t)^2``); ROLL squares each token's, and so does this rule."""
    return dro(batch, kimi15_tau)
