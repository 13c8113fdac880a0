r"""Soft trust regions: rules that weight a token's gradient outside the ratio range instead of removing it, or that
replace the clip by a smooth term. Each is pinned by the code that proposes it (``PeerCode``: a pull request of TRL,
OpenRLHF or verl, or the authors' own repository, at a named commit), copied as a test-only oracle in
``tests/soft_region_peers.py`` and run on the same batches in ``tests/test_weighted_trust_regions.py``.

With ``w = pi / pi_old`` (``y = log w``), ``A`` the advantage and ``sg`` the stop-gradient, the objective to maximise
per token, and its gradient in ``log pi``:

* ``pspo`` (TRL PR #4548): ``((1 - alpha) w + alpha) A``; gradient ``(1 - alpha) w A``, no clip.
* ``cfpo`` (TRL PR #5027, OpenRLHF PR #1184): ``w A - |A| (w - 1)^2 / (2 eps)``; gradient ``w (A - |A| (w - 1) /
  eps)``, which is 0 at ``w = 1 + eps`` (``A > 0``) or ``1 - eps`` (``A < 0``) and pulls back beyond.
* ``up_grpo`` (verl PR #7022): ``A pi / sg(pi)`` for ``A > 0`` (value ``A``, gradient ``A``: REINFORCE, no ratio), the
  dual-clip PPO objective for ``A <= 0``.
* ``ce_gppo`` (Kwai-Klear/CE-GPPO): PPO's range, but a token outside it on the side PPO would freeze keeps the
  gradient ``beta (1 +- eps) A`` (``beta_1`` below the range with ``A < 0``, ``beta_2`` above it with ``A > 0``);
  dual clip for ``A < 0``. GPPO (Klear-Reasoner) is ``beta_1 = beta_2 = 1``.
* ``aspo`` (ASPO, Archer2.0's ``compute_policy_loss_archer``): for ``A > 0`` the ratio is flipped: value ``A /
  min(w, 1 + eps_high)``, gradient ``A / w`` up to ``1 + eps_high`` (0 beyond), capped at ``c_+ A`` where ``1 / w >
  c_+`` (a ``c_+ A log pi`` term); for ``A < 0`` PPO's lower clip and a soft dual clip ``c A log pi`` where ``w > c``
  (the gradient ``c A`` stays).

* ``bapo`` (WooooDyy/BAPO): dual-clip PPO on a range ``[l, u]`` searched per batch: the lower bound is raised, then
  the upper one, step by step, until the positive tokens' clipped contribution is at least a target times the
  negative ones' (``bapo_bounds``).

Flags: a token is *kept* where its gradient is the ratio's ``w A`` (inside the range), clipped low / high where the
rule weights it otherwise (``pspo``, ``cfpo``: every token kept). Every rule here but ``bapo`` (a hard range, both
forms) has one form, ``soft``.
"""

from __future__ import annotations

import math

import torch

from .. import token_bounds
from ..registry import MethodResult, Param, PeerCode, TokenBatch, register, unclipped_result
from . import _reference as plain
from ._params import DUAL_CLIP_C, EPSILON_HIGH, EPSILON_LOW
from ._ratio import apply_dual_clip, bounds_by_sign, mask_and, range_flags, ratio_objective

__all__ = ["aspo", "bapo", "bapo_bounds", "ce_gppo", "cfpo", "pspo", "up_grpo"]

_ORACLE = "tests/test_weighted_trust_regions.py"
_EPS_LOW, _EPS_HIGH = EPSILON_LOW.with_default(0.2), EPSILON_HIGH.with_default(0.2)


def _self_ratio(logp: torch.Tensor) -> torch.Tensor:
    """``pi / sg(pi) = exp(log pi - sg(log pi))``: 1 in value, gradient ``grad log pi``."""
    return torch.exp(logp - logp.detach())


def _by_sign(adv: torch.Tensor, dtype: torch.dtype):
    """``select(negative, positive)``: ``negative`` where ``adv < 0``, ``positive`` elsewhere (numbers or tensors), as
    ``dtype``; by the sign bit for float32 / float64 (``token_bounds._select_by_sign``: a -0.0 advantage counts as
    negative, its objective is 0 either way), else ``torch.where``."""
    if adv.dtype == dtype and dtype in (torch.float32, torch.float64):
        sign = token_bounds._sign_mask(adv.detach())
        return lambda negative, positive: token_bounds._select_by_sign(sign, negative, positive, dtype)
    below = adv.detach() < 0
    return lambda negative, positive: torch.where(below, torch.as_tensor(negative, dtype=dtype),
                                                  torch.as_tensor(positive, dtype=dtype))


def pspo_reference(logp, old_logp, advantages, mask, *, pspo_alpha):
    """PSPO (Dwyer et al. 2025): the ratio smoothed towards 1, ``((1 - alpha) w + alpha) A``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    return ((1 - pspo_alpha) * w + pspo_alpha) * adv


@register(
    "pspo",
    reference_form=pspo_reference,
    params={
        "pspo_alpha": Param(
            0.1, ge=0, le=1, help="PSPO: smoothing of the ratio towards 1 (TRL PR #4548 smoothing_alpha)"
        )
    },
    default_form="soft",
    forms=("soft",),
    peers=(
        PeerCode(
            "TRL PR #4548 (9d490c3)",
            "trust_region_method=pspo",
            (("smoothing_alpha", "pspo_alpha"),),
            "`trl/trainer/grpo_trainer.py` `GRPOTrainer._compute_loss`, its `trust_region_method == \"pspo\"` branch",
            _ORACLE,
        ),
    ),
    reference="Dwyer et al. 2025 (PSPO, 'It's Not You, It's Clipping', arXiv 2509.21282); TRL PR #4548",
)
def pspo(batch: TokenBatch, pspo_alpha: float) -> MethodResult:
    r"""Probability smoothing: ``((1 - alpha) w + alpha) A``, the ratio of pi smoothed towards pi_old, with no clip
    and no min; its gradient ``(1 - alpha) w A`` is the unclipped ratio's scaled by ``1 - alpha``."""
    w = torch.exp(batch.log_ratio)
    return unclipped_result(((1.0 - pspo_alpha) * w + pspo_alpha) * batch.advantages, batch)


def cfpo_reference(logp, old_logp, advantages, mask, *, cfpo_epsilon):
    """CFPO (arXiv 2601.22801): ``w A - |A| (w - 1)^2 / (2 eps)``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    return w * adv - adv.abs() * (w - 1) ** 2 / (2 * cfpo_epsilon)


@register(
    "cfpo",
    reference_form=cfpo_reference,
    params={
        "cfpo_epsilon": Param(
            0.2,
            gt=0,
            help="CFPO: the penalty's scale; the gradient vanishes at w = 1 +- epsilon (TRL PR #5027 epsilon_high, "
            "OpenRLHF PR #1184 clip_eps_low)",
        )
    },
    default_form="soft",
    forms=("soft",),
    peers=(
        PeerCode(
            "OpenRLHF PR #1184 (8eb43da)",
            "policy_loss_type=cfpo",
            (("clip_eps_low", "cfpo_epsilon"),),
            "`openrlhf/models/loss.py` `PolicyLoss.forward` (its `cfpo` branch, token-level loss)",
            _ORACLE,
        ),
        PeerCode(
            "TRL PR #5027 (afa266b, closed)",
            "loss_type=cfpo",
            (("epsilon_high", "cfpo_epsilon"),),
            "`trl/trainer/grpo_trainer.py` `GRPOTrainer._compute_loss`, its `cfpo` branch (the file does not import "
            "at that commit: a quote is missing in its aggregation line)",
            _ORACLE,
        ),
    ),
    reference="Clipping-Free Policy Optimization (arXiv 2601.22801); TRL PR #5027, OpenRLHF PR #1184",
)
def cfpo(batch: TokenBatch, cfpo_epsilon: float) -> MethodResult:
    r"""Clipping-free: ``w A - |A| (w - 1)^2 / (2 eps)``, a quadratic penalty on the ratio instead of a clip. Its
    gradient in ``log pi``, ``w (A - |A| (w - 1) / eps)``, is ``A`` at ``w = 1``, falls to 0 at ``w = 1 + eps`` for
    ``A > 0`` (``1 - eps`` for ``A < 0``) and pulls the ratio back beyond: a soft region of half-width ``eps``."""
    w, adv = torch.exp(batch.log_ratio), batch.advantages
    return unclipped_result(w * adv - adv.abs() * torch.square(w - 1.0) / (2.0 * cfpo_epsilon), batch)


def up_grpo_reference(logp, old_logp, advantages, mask, *, epsilon_low, epsilon_high, dual_clip_c):
    """UP-GRPO (verl PR #7022, Eq. 15 of its paper): ``A pi / sg(pi)`` for ``A > 0``; for ``A <= 0`` dual-clip PPO,
    ``max(min(w A, clip(w, 1 - eps_low, 1 + eps_high) A), c A)``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    positive = adv * torch.exp(logp - logp.detach())
    ppo = plain.ppo_min(w, adv, 1 - epsilon_low, 1 + epsilon_high)
    negative = torch.where(adv < 0, torch.maximum(ppo, dual_clip_c * adv), ppo)
    return torch.where(adv > 0, positive, negative)


@register(
    "up_grpo",
    reference_form=up_grpo_reference,
    params={"epsilon_low": _EPS_LOW, "epsilon_high": _EPS_HIGH, "dual_clip_c": DUAL_CLIP_C},
    default_form="soft",
    forms=("soft",),
    peers=(
        PeerCode(
            "verl PR #7022 (0257b18)",
            "policy_loss.loss_mode=up",
            (("clip_ratio_low", "epsilon_low"), ("clip_ratio_high", "epsilon_high"), ("clip_ratio_c", "dual_clip_c")),
            "`verl/trainer/ppo/core_algos.py` `compute_policy_loss_up`",
            _ORACLE,
        ),
    ),
    reference="UP-GRPO (Unbounded Positive, arXiv 2607.06987, Eq. 15); verl PR #7022 loss_mode 'up'",
)
def up_grpo(batch: TokenBatch, epsilon_low: float, epsilon_high: float, dual_clip_c: float) -> MethodResult:
    r"""Unbounded positive: ``A pi / sg(pi)`` where ``A > 0`` (value ``A``, gradient ``A``: REINFORCE, no ratio and no
    clip), dual-clip PPO with ``[1 - eps_low, 1 + eps_high]`` and ``c`` where ``A <= 0``. Flags: the negative side's
    (a positive token is always kept)."""
    adv, y = batch.advantages, batch.log_ratio
    w = torch.exp(y)
    # one clamp of w sg(s): s = 1 where A <= 0 (dual-clip PPO's bounds), s = 1 / w where A > 0 (value 1, gradient 1:
    # pi / sg(pi)); at A = 0 the objective is 0 either way
    lo, hi = bounds_by_sign(adv, 1.0 - epsilon_low, math.inf, dual_clip_c, y.dtype)
    with torch.no_grad():
        scale = torch.where(adv > 0, torch.exp(-y), 1.0)
    objective = torch.clamp(w * scale, lo, hi) * adv

    def flags():
        positive = adv > 0
        _, low, high = range_flags(w, y, adv, 1.0 - epsilon_low, 1.0 + epsilon_high, "min", negative_cap=dual_clip_c)
        low, high = low & ~positive, high & ~positive
        return ~(low | high), low, high

    return MethodResult(objective, flags)


def ce_gppo_reference(logp, old_logp, advantages, mask, *, epsilon_low, epsilon_high, dual_clip_c, gppo_beta1,
                      gppo_beta2):
    """CE-GPPO (Su et al. 2025): ``w A`` inside ``[1 - eps_low, 1 + eps_high]``; outside on PPO's frozen side the
    value ``beta (1 +- eps) A`` with the gradient ``beta (1 +- eps) A`` (``pi / sg(pi)``); ``max(., c A)`` for
    ``A < 0``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    self_ratio = torch.exp(logp - logp.detach())
    low = (w < 1 - epsilon_low) & (adv < 0)
    high = (w > 1 + epsilon_high) & (adv > 0)
    inside = w * adv
    outside_low = gppo_beta1 * (1 - epsilon_low) * self_ratio * adv
    outside_high = gppo_beta2 * (1 + epsilon_high) * self_ratio * adv
    objective = torch.where(low, outside_low, torch.where(high, outside_high, inside))
    return torch.where(adv < 0, torch.maximum(objective, dual_clip_c * adv), objective)


@register(
    "ce_gppo",
    reference_form=ce_gppo_reference,
    params={
        "epsilon_low": _EPS_LOW,
        "epsilon_high": _EPS_HIGH,
        "dual_clip_c": DUAL_CLIP_C,
        "gppo_beta1": Param(
            0.25, ge=0, help="CE-GPPO: gradient weight below the range for A < 0 (its gppo_loss_beta1; GPPO: 1)"
        ),
        "gppo_beta2": Param(
            1.0, ge=0, help="CE-GPPO: gradient weight above the range for A > 0 (its gppo_loss_beta2; GPPO: 1)"
        ),
    },
    default_form="soft",
    forms=("soft",),
    peers=(
        PeerCode(
            "Kwai-Klear/CE-GPPO (169f3b3)",
            "loss_func=gppo_general",
            (
                ("clip_ratio_low", "epsilon_low"),
                ("clip_ratio_high", "epsilon_high"),
                ("clip_ratio_c", "dual_clip_c"),
                ("gppo_loss_beta1", "gppo_beta1"),
                ("gppo_loss_beta2", "gppo_beta2"),
            ),
            "`verl/trainer/ppo/core_algos.py` `compute_gppo_loss_general_beta`; GPPO (`loss_func=gppo`, "
            "`compute_gppo_loss` of defde20) is `gppo_beta1 = gppo_beta2 = 1`",
            _ORACLE,
        ),
    ),
    reference="Su et al. 2025 (CE-GPPO, arXiv 2509.20712); GPPO: Klear-Reasoner (arXiv 2508.07629)",
)
def ce_gppo(
    batch: TokenBatch,
    epsilon_low: float,
    epsilon_high: float,
    dual_clip_c: float,
    gppo_beta1: float,
    gppo_beta2: float,
) -> MethodResult:
    r"""Gradient-preserving clip: ``w A`` inside ``[1 - eps_low, 1 + eps_high]``; a token PPO would freeze (below the
    range with ``A < 0``, above it with ``A > 0``) keeps the bounded gradient ``beta_1 (1 - eps_low) A`` /
    ``beta_2 (1 + eps_high) A`` through ``pi / sg(pi)``, its value PPO's clipped one times beta; for ``A < 0`` the
    dual clip ``max(., c A)``. At ``beta_1 = beta_2 = 0`` its gradient is dual-clip PPO's."""
    adv, y = batch.advantages, batch.log_ratio
    w = torch.exp(y)
    # one clamp of w sg(s): s = 1 inside, k / w outside on PPO's frozen side (value k, gradient k: beta (1 +- eps)
    # pi / sg(pi)); for A < 0 at most c (the dual clip: value c, no gradient)
    lo, hi = bounds_by_sign(adv, -math.inf, math.inf, dual_clip_c, y.dtype)
    with torch.no_grad():
        low = mask_and(w < 1.0 - epsilon_low, adv < 0)
        high = mask_and(w > 1.0 + epsilon_high, adv > 0)
        weight = torch.where(low, w.new_tensor(gppo_beta1 * (1.0 - epsilon_low)), w.new_tensor(gppo_beta2 * (1.0 + epsilon_high)))
        scale = torch.where(low | high, weight / w, 1.0)
    objective = torch.clamp(w * scale, lo, hi) * adv

    def flags():
        capped = mask_and(adv < 0, w * scale > dual_clip_c)
        return ~(low | high | capped), low & ~capped, high | capped

    return MethodResult(objective, flags)


def aspo_reference(logp, old_logp, advantages, mask, *, epsilon_low, epsilon_high, dual_clip_c, aspo_positive_c):
    """ASPO (arXiv 2510.06062) as Archer2.0 runs it with one clip range: for ``A > 0`` the flipped ratio, value ``A /
    p`` with ``p = min(w, 1 + eps_high)`` and gradient ``A / w`` while ``w <= 1 + eps_high``, ``c_+ A log pi`` where
    ``1 / p > c_+``; for ``A <= 0`` ``n A`` with ``n = max(w, 1 - eps_low)``, ``c A log pi`` where ``n > c``."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    p = torch.clamp(w, max=1 + epsilon_high)
    flipped = adv * (p / p.detach()) / p.detach()
    positive = torch.where(1 / p > aspo_positive_c, aspo_positive_c * adv * logp, flipped)
    n = torch.clamp(w, min=1 - epsilon_low)
    negative = torch.where(n > dual_clip_c, dual_clip_c * adv * logp, n * adv)
    return torch.where(adv < 0, negative, positive)


@register(
    "aspo",
    reference_form=aspo_reference,
    params={
        "epsilon_low": _EPS_LOW,
        "epsilon_high": _EPS_HIGH,
        "dual_clip_c": DUAL_CLIP_C,
        "aspo_positive_c": Param(
            3.0, gt=1, help="ASPO: cap of the flipped ratio 1 / w for A > 0 (Archer2.0 positive_clip_ratio_c)"
        ),
    },
    default_form="soft",
    forms=("soft",),
    peers=(
        PeerCode(
            "wizard-III/Archer2.0 (0a9492a)",
            "use_archer_policy_loss=True",
            (
                ("negative_low_entropy_clip_ratio_low", "epsilon_low"),
                ("positive_low_entropy_clip_ratio_high", "epsilon_high"),
                ("negative_clip_ratio_c", "dual_clip_c"),
                ("positive_clip_ratio_c", "aspo_positive_c"),
            ),
            "`verl/trainer/ppo/core_algos.py` `compute_policy_loss_archer` with every token in `high_entropy_mask` "
            "(one clip range; Archer2.0 widens it to 0.4 on its top-20% entropy tokens, not done here)",
            _ORACLE,
        ),
    ),
    reference="ASPO (Asymmetric Importance Sampling Policy Optimization, arXiv 2510.06062); Archer2.0's code",
)
def aspo(
    batch: TokenBatch, epsilon_low: float, epsilon_high: float, dual_clip_c: float, aspo_positive_c: float
) -> MethodResult:
    r"""Asymmetric importance sampling: for ``A > 0`` the flipped ratio, gradient ``A / w`` (``A / p`` in value, ``p =
    min(w, 1 + eps_high)``; 0 above the range), ``c_+ A log pi`` where ``1 / p > c_+``; for ``A <= 0`` PPO's lower
    clip ``max(w, 1 - eps_low) A`` and a soft dual clip ``c A log pi`` where that ratio exceeds ``c`` (the gradient
    ``c A`` stays, where dual-clip PPO's is 0)."""
    adv, logp, y = batch.advantages, batch.logp, batch.log_ratio
    w = torch.exp(y)
    # A > 0: w sg(1 / w^2) (value and gradient 1 / w) at least 1 / (1 + eps_high) (value 1 / p, no gradient above);
    # A < 0: w at least 1 - eps_low; the capped tokens instead k log pi (k = c_+ or c). Chosen by the sign of A
    select = _by_sign(adv, y.dtype)
    with torch.no_grad():
        # 1 / w^2 where A >= 0 (w >= 1 / c_+ where not capped: finite), 1 where A < 0
        scale = select(1.0, torch.exp(y.clamp(min=-math.log(aspo_positive_c)) * -2.0))
        lower = select(1.0 - epsilon_low, 1.0 / (1.0 + epsilon_high))
        capped = select(y - math.log(dual_clip_c), -math.log(aspo_positive_c) - y) > 0  # w > c; 1 / w > c_+
        cap = select(dual_clip_c, aspo_positive_c)
    objective = torch.where(capped, cap * logp, torch.clamp(w * scale, min=lower)) * adv

    def flags():
        negative = adv < 0
        low = negative & (w < 1.0 - epsilon_low) | ~negative & capped
        high = ~negative & (w > 1.0 + epsilon_high) | negative & capped
        return ~(low | high), low, high

    return MethodResult(objective, flags)


def _bapo_schedule(start: float, stop: float, step: float) -> list[float]:
    """The bounds BAPO's search visits on one side: ``start``, then ``min(b + step, stop)`` while ``b < stop`` (none
    when ``step <= 0``), as its authors' loop computes them in Python floats."""
    values = [start]
    while values[-1] < stop and step > 0:
        values.append(min(values[-1] + step, stop))
    return values


def bapo_bounds(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    lower: list[float],
    upper: list[float],
    target: float,
    eps: float = 1e-8,
) -> tuple[float | torch.Tensor, float | torch.Tensor]:
    r"""BAPO's ratio bounds for this batch: with ``P(u) = sum_{A >= 0} min(w, u) A`` and ``N(l) = sum_{A < 0} max(w, l)
    |A|`` over the valid tokens, the first pair of the sequence ``(l_0, u_0), (l_1, u_0), ..., (l_n, u_0), (l_n, u_1),
    ...`` (``lower`` and ``upper`` from ``_bapo_schedule``: the lower bound is raised first, then the upper one, as the
    authors' code does) with ``P / (N + eps) >= target`` (``inf`` where ``N <= 0``), else the last pair.

    Eagerly on a CPU the pairs are tried one at a time (a host read each, stopping at the first that meets the
    target); on a device or while compiling every pair is evaluated and the first is picked without a host read
    (0-d tensors are returned). Both compute each sum the same way, so they choose the same pair."""
    with torch.no_grad():
        w = torch.exp(log_ratio.detach())
        adv = torch.where(mask, advantages.detach(), 0.0)
        gain, loss = adv.clamp(min=0), (-adv).clamp(min=0)

        def share(lo: float, hi: float) -> torch.Tensor:
            p = (torch.minimum(w, w.new_tensor(hi)) * gain).sum()
            n = (torch.maximum(w, w.new_tensor(lo)) * loss).sum()
            return torch.where(n <= 0, torch.inf, p / (n + eps))

        pairs = [(lo, upper[0]) for lo in lower] + [(lower[-1], hi) for hi in upper[1:]]
        if w.device.type == "cpu" and not torch.compiler.is_compiling():
            for lo, hi in pairs:
                if share(lo, hi).item() >= target:
                    return lo, hi
            return pairs[-1]
        met = torch.stack([share(lo, hi) >= target for lo, hi in pairs])
        met[-1] = True  # the last pair where none meets the target
        first = met.to(torch.uint8).argmax()
        index = first.view(1)
        return (
            w.new_tensor([lo for lo, _ in pairs]).gather(0, index)[0],
            w.new_tensor([hi for _, hi in pairs]).gather(0, index)[0],
        )


def bapo_reference(logp, old_logp, advantages, mask, *, bapo_lower_start, bapo_lower_max, bapo_lower_step,
                   bapo_upper_start, bapo_upper_max, bapo_upper_step, bapo_target, dual_clip_c, form):
    """BAPO (Xi et al. 2025): raise the lower bound, then the upper one, step by step until the positive tokens'
    clipped contribution is at least ``target`` times the negative ones'; then dual-clip PPO on those bounds."""
    w, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    wd, ad = w.detach(), adv.detach()
    lo, hi = bapo_lower_start, bapo_upper_start

    def share(lo, hi):
        p = sum(float(min(x, hi) * a) for x, a in zip(wd[mask].tolist(), ad[mask].tolist()) if a >= 0)
        n = sum(float(max(x, lo) * -a) for x, a in zip(wd[mask].tolist(), ad[mask].tolist()) if a < 0)
        return math.inf if n <= 0 else p / (n + 1e-8)

    while share(lo, hi) < bapo_target and lo < bapo_lower_max and bapo_lower_step > 0:
        lo = min(lo + bapo_lower_step, bapo_lower_max)
    while share(lo, hi) < bapo_target and hi < bapo_upper_max and bapo_upper_step > 0:
        hi = min(hi + bapo_upper_step, bapo_upper_max)
    if form == "mask":
        keep = (w >= lo) & (w <= hi)
        objective = plain.eq5_mask(w, adv, keep)
        return torch.where((adv < 0) & (objective < dual_clip_c * adv), (dual_clip_c * adv).detach(), objective)
    ppo = plain.ppo_min(w, adv, lo, hi)
    return torch.where(adv < 0, torch.maximum(ppo, dual_clip_c * adv), ppo)


@register(
    "bapo",
    reference_form=bapo_reference,
    params={
        "bapo_lower_start": Param(0.6, gt=0, le=1, help="BAPO: the lower ratio bound the search starts from (its recipe's "
                                  "ratio_lower_start)"),
        "bapo_lower_max": Param(0.8, gt=0, le=1, help="BAPO: the highest lower bound (ratio_lower_max)"),
        "bapo_lower_step": Param(0.05, ge=0, help="BAPO: the lower bound's step (ratio_lower_step)"),
        "bapo_upper_start": Param(1.2, ge=1, help="BAPO: the upper ratio bound the search starts from "
                                  "(ratio_upper_start)"),
        "bapo_upper_max": Param(2.0, ge=1, help="BAPO: the highest upper bound (ratio_upper_max)"),
        "bapo_upper_step": Param(0.05, ge=0, help="BAPO: the upper bound's step (ratio_upper_step)"),
        "bapo_target": Param(1.0, ge=0, help="BAPO: the least P / N, positive over negative clipped contribution "
                             "(adv_ratio_target)"),
        "dual_clip_c": DUAL_CLIP_C,
    },
    default_form="min",
    forms=("min", "mask"),
    ratio_mask_gradient=True,
    peers=(
        PeerCode(
            "WooooDyy/BAPO (3b8389c)",
            "policy_loss.loss_mode=bapo",
            (
                ("ratio_lower_start", "bapo_lower_start"),
                ("ratio_lower_max", "bapo_lower_max"),
                ("ratio_lower_step", "bapo_lower_step"),
                ("ratio_upper_start", "bapo_upper_start"),
                ("ratio_upper_max", "bapo_upper_max"),
                ("ratio_upper_step", "bapo_upper_step"),
                ("adv_ratio_target", "bapo_target"),
                ("clip_ratio_c", "dual_clip_c"),
            ),
            "`recipe/bapo/policy_loss.py` `compute_policy_loss_bapo` with `_compute_effective_advantage`; its recipe "
            "`bapo_trainer.yaml` gives the defaults (the config class's own make the search inert)",
            _ORACLE,
        ),
    ),
    reference="Xi et al. 2025 (BAPO, 'Balanced Policy Optimization with Adaptive Clipping', arXiv 2510.18927); "
    "WooooDyy/BAPO",
)
def bapo(
    batch: TokenBatch,
    bapo_lower_start: float,
    bapo_lower_max: float,
    bapo_lower_step: float,
    bapo_upper_start: float,
    bapo_upper_max: float,
    bapo_upper_step: float,
    bapo_target: float,
    dual_clip_c: float,
) -> MethodResult:
    r"""Adaptive asymmetric bounds: PPO's range ``[l, u]`` chosen per batch (``bapo_bounds``), raising ``l`` from
    ``bapo_lower_start`` to ``bapo_lower_max``, then ``u`` from ``bapo_upper_start`` to ``bapo_upper_max``, until the
    positive tokens' clipped contribution ``sum min(w, u) A`` is at least ``bapo_target`` times the negative ones'
    ``sum max(w, l) |A|``; then dual-clip PPO (``c``) on ``[l, u]``. Batch-level: the bounds are chosen on the batch
    ``policy_loss`` sees (the authors' code sums ``P`` and ``N`` over data-parallel ranks first)."""
    lower, upper = bapo_bounds(
        batch.log_ratio,
        batch.advantages,
        batch.mask,
        _bapo_schedule(bapo_lower_start, bapo_lower_max, bapo_lower_step),
        _bapo_schedule(bapo_upper_start, bapo_upper_max, bapo_upper_step),
        bapo_target,
    )
    if batch.form == "min":
        return ratio_objective(batch, lower, upper, negative_cap=dual_clip_c)
    return apply_dual_clip(ratio_objective(batch, lower, upper), batch.advantages, dual_clip_c)
