r"""The registry of clipping methods: one small function per rule, one shared signature.

Every method receives a :class:`TokenBatch` (log-ratios, advantages, mask, ... as torch tensors)
and its own parameters, and returns a :class:`MethodResult`: the per-token objective to *maximise*
and boolean tensors saying which tokens kept their gradient and which were clipped low / high.

The paper's unified framework (Eq. 5) is :func:`ratio_objective` with ``form="mask"``: keep
``w A`` where the constraint holds, else the constant ``w_old A = A``. ``form="min"`` is PPO's
pessimistic ``min(w A, clip(w, l, u) A)``. A method with a ratio range supports both forms; its
constraint in the mask form is the divergence itself (``k3 <= delta`` for atr, not the pre-computed
range), so the equivalence of Thm 3.2 is something the tests check rather than assume.

Adding a rule: write one function decorated with :func:`register`; nothing else changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import torch

from . import ranges
from .divergence import full_kl, is_kl3_from_log_ratio, kl3_from_log_ratio

__all__ = ["METHODS", "MethodSpec", "TokenBatch", "MethodResult", "register", "get_method", "ratio_objective"]


@dataclass
class TokenBatch:
    """What a method sees. All tensors are (B, T) unless noted; ``mask`` is boolean."""

    log_ratio: torch.Tensor  # log w = logp - old_logp, zero on padding, clamped to +-LOG_RATIO_CLAMP
    advantages: torch.Tensor
    mask: torch.Tensor
    logp: torch.Tensor
    old_logp: torch.Tensor
    form: str
    generator: torch.Generator | None = None
    old_full_logp: torch.Tensor | None = None  # (B, T, V)
    full_logp: torch.Tensor | None = None  # (B, T, V)
    kl_chunk_size: int | None = None


@dataclass
class MethodResult:
    """Per-token objective (to maximise) and which tokens kept / lost their gradient.

    The boolean flags are computed lazily by ``flags()`` (metrics and tests need them, the training
    step does not): ``kept`` = the token's objective depends on theta through w; ``clipped_low`` /
    ``clipped_high`` = it lost that dependence because w was too low / too high (or, for penalty
    methods, it was penalised).
    """

    objective: torch.Tensor
    flags: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(repr=False)

    @cached_property
    def _resolved(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(f.detach() for f in self.flags())

    @property
    def kept(self) -> torch.Tensor:
        return self._resolved[0]

    @property
    def clipped_low(self) -> torch.Tensor:
        return self._resolved[1]

    @property
    def clipped_high(self) -> torch.Tensor:
        return self._resolved[2]


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its function, parameters with defaults, forms and reference."""

    name: str
    fn: Callable[..., MethodResult]
    params: Mapping[str, float] = field(default_factory=dict)
    default_form: str = "min"
    forms: tuple[str, ...] = ("min", "mask")
    reference: str = ""
    needs_full_distributions: bool = False


METHODS: dict[str, MethodSpec] = {}


def register(
    name: str,
    *,
    params: Mapping[str, float],
    default_form: str,
    forms: tuple[str, ...],
    reference: str,
    needs_full_distributions: bool = False,
    aliases: tuple[str, ...] = (),
) -> Callable[[Callable[..., MethodResult]], Callable[..., MethodResult]]:
    """Decorator: register ``fn`` under ``name`` (and ``aliases``) in :data:`METHODS`."""

    def deco(fn: Callable[..., MethodResult]) -> Callable[..., MethodResult]:
        spec = MethodSpec(
            name, fn, MappingProxyType(dict(params)), default_form, forms, reference, needs_full_distributions
        )
        for key in (name, *aliases):
            if key in METHODS:
                raise ValueError(f"method {key!r} is already registered")
            METHODS[key] = spec
        return fn

    return deco


def get_method(name: str) -> MethodSpec:
    """The spec registered under ``name``; an unknown name raises ValueError listing the known ones."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}") from None


# ----------------------------------------------------------------------------------------------
# Shared building blocks
# ----------------------------------------------------------------------------------------------
def _bound_tensor(bound: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(bound, dtype=like.dtype, device=like.device)


def ratio_objective(
    batch: TokenBatch,
    lower: float | torch.Tensor,
    upper: float | torch.Tensor,
    constraint: torch.Tensor | None = None,
) -> MethodResult:
    r"""Objective of a ratio-range rule ``[lower, upper]`` in ``batch.form``.

    * ``"min"`` (PPO, Schulman 2017): ``min(w A, clip(w, l, u) A)``.
    * ``"mask"`` (paper Eq. 5): ``w A`` where ``constraint`` holds (default ``l <= w <= u``), else the
      constant ``w_old A = A``: zero gradient, finite value.

    ``lower``/``upper`` are floats or (B, T) tensors (per-token ranges: DCPO, TRGPPO).
    """
    y, adv = batch.log_ratio, batch.advantages
    # log w is clamped to +-LOG_RATIO_CLAMP upstream, so w = exp(y) is finite in float32 and a masked
    # token's zero gradient stays 0 (never 0 * inf)
    w = torch.exp(y)
    if batch.form == "mask":
        if constraint is None:
            with torch.no_grad():
                constraint = (w >= lower) & (w <= upper)
        keep = constraint
        objective = torch.where(keep, w * adv, adv)
        return MethodResult(objective, lambda: (keep, ~keep & (y < 0), ~keep & (y > 0)))
    if isinstance(lower, torch.Tensor) or isinstance(upper, torch.Tensor):
        clipped_w = torch.clamp(w, min=_bound_tensor(lower, y), max=_bound_tensor(upper, y))
    else:
        clipped_w = torch.clamp(w, min=lower, max=upper)
    objective = torch.minimum(w * adv, clipped_w * adv)

    def flags():
        low = (w < lower) & (adv < 0)
        high = (w > upper) & (adv > 0)
        return ~(low | high), low, high

    return MethodResult(objective, flags)


def _dual_clip(result: MethodResult, adv: torch.Tensor, c: float) -> MethodResult:
    """Dual clip (Ye et al. 2020; verl ``clip_ratio_c``): for ``A < 0`` the objective is at least ``c A``."""
    floor = c * adv
    below = result.objective.detach() < floor
    objective = torch.where((adv < 0) & below, floor, result.objective)

    def flags():
        capped = (adv < 0) & below
        return result.kept & ~capped, result.clipped_low, result.clipped_high | capped

    return MethodResult(objective, flags)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def _centred_cov(batch: TokenBatch) -> torch.Tensor:
    """Per-token ``(A - mean A)(log pi - mean log pi)`` over valid tokens, detached (Cui et al. 2025)."""
    adv = batch.advantages.detach()
    logp = batch.logp.detach()
    return (adv - _masked_mean(adv, batch.mask)) * (logp - _masked_mean(logp, batch.mask))


def _no_clip(objective: torch.Tensor, batch: TokenBatch) -> MethodResult:
    return MethodResult(
        objective, lambda: (torch.ones_like(batch.mask), torch.zeros_like(batch.mask), torch.zeros_like(batch.mask))
    )


# ----------------------------------------------------------------------------------------------
# Ratio-range methods
# ----------------------------------------------------------------------------------------------
@register(
    "clip",
    params={"epsilon": 0.2},
    default_form="min",
    forms=("min", "mask"),
    reference="Schulman et al. 2017 (PPO); Shao et al. 2024 (GRPO); TRL loss_type grpo family",
)
def clip(batch: TokenBatch, epsilon: float) -> MethodResult:
    r"""Symmetric ratio clipping, ``w in [1 - eps, 1 + eps]``."""
    return ratio_objective(batch, 1.0 - epsilon, 1.0 + epsilon)


@register(
    "clip_higher",
    params={"epsilon_low": 0.2, "epsilon_high": 0.28},
    default_form="min",
    forms=("min", "mask"),
    reference="Yu et al. 2025 (DAPO), Clip-Higher; TRL epsilon_high",
)
def clip_higher(batch: TokenBatch, epsilon_low: float, epsilon_high: float) -> MethodResult:
    r"""Asymmetric ratio clipping, ``w in [1 - eps_low, 1 + eps_high]``."""
    return ratio_objective(batch, 1.0 - epsilon_low, 1.0 + epsilon_high)


@register(
    "dual_clip",
    params={"epsilon": 0.2, "dual_clip_c": 3.0},
    default_form="min",
    forms=("min", "mask"),
    reference="Ye et al. 2020 (dual-clip PPO); verl 'vanilla' policy loss with clip_ratio_c",
)
def dual_clip(batch: TokenBatch, epsilon: float, dual_clip_c: float) -> MethodResult:
    r"""PPO clip, and for ``A < 0`` the objective ``max(min(wA, clip(w)A), c A)``: the loss is capped at ``-c A``."""
    base = ratio_objective(batch, 1.0 - epsilon, 1.0 + epsilon)
    return _dual_clip(base, batch.advantages, dual_clip_c)


@register(
    "dcpo",
    params={"epsilon_low": 0.16, "epsilon_high": 0.2, "dual_clip_c": 3.0},
    default_form="min",
    forms=("min", "mask"),
    reference="Yang et al. 2025 (DCPO, arXiv 2509.02333); lime-RL/DCPO clip_type='dynamic'",
)
def dcpo(batch: TokenBatch, epsilon_low: float, epsilon_high: float, dual_clip_c: float) -> MethodResult:
    r"""Dynamic clipping: per-token ``[l(p), u(p)]`` of :func:`atr_theory.ranges.dcpo_clip_range` with
    ``p = pi_old(token)``, ``u`` capped at ``max(c, 10)``, then the dual clip with ``c`` (as in the source)."""
    p_old = torch.exp(batch.old_logp.detach())
    lower, upper = ranges.dcpo_clip_range(p_old, epsilon_low, epsilon_high, ratio_cap=max(dual_clip_c, 10.0))
    return _dual_clip(ratio_objective(batch, lower, upper), batch.advantages, dual_clip_c)


@register(
    "trgppo",
    params={"delta": 0.07, "epsilon": 0.2},
    default_form="min",
    forms=("min", "mask"),
    reference="Wang et al. 2019 (TRGPPO), wangyuhuix/TRGPPO; paper Table 1 'Full KL-guided clipping'",
)
def trgppo(batch: TokenBatch, delta: float, epsilon: float) -> MethodResult:
    r"""Per-token range ``[min(l_KL(p), 1-eps), max(u_KL(p), 1+eps)]`` where ``l_KL, u_KL`` are the
    extreme ratios with binary ``KL(p || p w) <= delta``, ``p = pi_old(token)`` (Newton in float64 on the
    batch's device, :func:`atr_theory.ranges.trgppo_kl_log_range_torch`)."""
    p_old = torch.exp(batch.old_logp.detach().double()).clamp(min=1e-300, max=1.0)
    y_lo, y_hi = ranges.trgppo_kl_log_range_torch(p_old, delta)
    y = batch.log_ratio
    lower = torch.minimum(torch.exp(y_lo), torch.tensor(1.0 - epsilon, dtype=torch.float64)).to(y.dtype)
    upper = torch.maximum(torch.exp(y_hi), torch.tensor(1.0 + epsilon, dtype=torch.float64)).to(y.dtype)
    return ratio_objective(batch, lower, upper)


@register(
    "atr",
    params={"delta": 0.07},
    default_form="mask",
    forms=("mask", "min"),
    reference="this paper: ATR-GRPO, Eq. 5 with C = KL3 <= delta; Thm 3.2",
    aliases=("kl3",),
)
def atr(batch: TokenBatch, delta: float) -> MethodResult:
    r"""ATR-based clipping: keep ``w A`` while ``k3 = w - 1 - log w <= delta``.

    Mask form: the constraint is evaluated as ``k3(log w) <= delta`` directly (paper Sec. 3.2: "it is
    not necessary to explicitly compute the clipping ranges"). Min form: PPO's min objective with the
    equivalent range ``[l, u] = kl3_clip_range(delta)`` (= clip_higher with ``(1 - l, u - 1)``).
    """
    lower, upper = ranges.kl3_clip_range(delta)
    with torch.no_grad():
        y = batch.log_ratio
        constraint = (torch.expm1(y) - y <= delta) if batch.form == "mask" else None
    return ratio_objective(batch, lower, upper, constraint)


@register(
    "kl1",
    params={"delta": 0.07},
    default_form="mask",
    forms=("mask", "min"),
    reference="Schulman 2020, 'Approximating KL Divergence' (k1); paper Table 3",
)
def kl1(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Keep ``w A`` while ``k1 = -log w <= delta``.

    Our reading of the paper's loosely defined "KL1": the signed estimator, so the constraint is
    **one-sided** (``w >= e^{-delta}``, no upper limit). A symmetric ``|log w| <= delta`` variant is
    what :func:`kl2` gives with ``delta -> delta^2/2``.
    """
    lower, upper = ranges.kl1_clip_range(delta)
    return ratio_objective(batch, lower, upper, (-batch.log_ratio <= delta).detach())


@register(
    "kl2",
    params={"delta": 0.07},
    default_form="mask",
    forms=("mask", "min"),
    reference="Schulman 2020, 'Approximating KL Divergence' (k2); paper Table 3",
)
def kl2(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Keep ``w A`` while ``k2 = (log w)^2 / 2 <= delta`` (symmetric in ``log w``)."""
    lower, upper = ranges.kl2_clip_range(delta)
    return ratio_objective(batch, lower, upper, (0.5 * batch.log_ratio.detach() ** 2 <= delta))


@register(
    "is_kl3",
    params={"delta": 0.07},
    default_form="mask",
    forms=("mask", "min"),
    reference="paper Table 3 'IS-weighted KL3'; derivation in atr_theory.ranges.is_kl3_clip_range",
)
def is_kl3(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Keep ``w A`` while ``w k3(1/w) = 1 - w + w log w <= delta``.

    Our reading: importance-weighting k3 of the *reverse* ratio gives an unbiased, non-negative
    estimate of ``KL(pi || pi_old)`` from ``pi_old`` samples (``E_old[w log w - w + 1] = KL(pi||pi_old)``).
    Compared with KL3 its range is shifted down (lower ``l`` and lower ``u``, e.g. [0.650, 1.397] at
    delta = 0.07 against [0.671, 1.422]): it tolerates larger decreases and fewer increases of pi.
    """
    lower, upper = ranges.is_kl3_clip_range(delta)
    return ratio_objective(batch, lower, upper, is_kl3_from_log_ratio(batch.log_ratio.detach()) <= delta)


# ----------------------------------------------------------------------------------------------
# Methods beyond a per-token ratio range
# ----------------------------------------------------------------------------------------------
@register(
    "clip_cov",
    params={"epsilon": 0.2, "cov_ratio": 2e-4, "cov_lb": 1.0, "cov_ub": 5.0},
    default_form="min",
    forms=("min", "mask"),
    reference="Cui et al. 2025 (arXiv 2505.22617), Clip-Cov; verl 'clip_cov' policy loss",
)
def clip_cov(batch: TokenBatch, epsilon: float, cov_ratio: float, cov_lb: float, cov_ub: float) -> MethodResult:
    r"""PPO clip; then ``max(1, int(cov_ratio * n_valid))`` tokens drawn at random (``batch.generator``)
    among the unclipped valid tokens with centred ``cov(A, log pi)`` in ``(cov_lb, cov_ub)`` lose their
    gradient. (verl zeroes their loss value too; we keep the value and drop the gradient.)"""
    base = ratio_objective(batch, 1.0 - epsilon, 1.0 + epsilon)
    cov = _centred_cov(batch)
    candidates = batch.mask & base.kept & (cov > cov_lb) & (cov < cov_ub)
    idx = torch.nonzero(candidates.reshape(-1)).squeeze(-1)
    n_pick = min(max(int(cov_ratio * int(batch.mask.sum())), 1), idx.numel())
    drop = torch.zeros_like(candidates).reshape(-1)
    if n_pick > 0:
        perm = torch.randperm(idx.numel(), generator=batch.generator, device="cpu")[:n_pick]
        drop[idx[perm.to(idx.device)]] = True
    drop = drop.reshape(candidates.shape)
    objective = torch.where(drop, base.objective.detach(), base.objective)
    return MethodResult(objective, lambda: (base.kept & ~drop, base.clipped_low, base.clipped_high | drop))


@register(
    "kl_cov",
    params={"cov_ratio": 2e-3, "kl_coef": 1.0},
    default_form="none",
    forms=("none",),
    reference="Cui et al. 2025 (arXiv 2505.22617), KL-Cov; verl 'kl_cov' policy loss",
)
def kl_cov(batch: TokenBatch, cov_ratio: float, kl_coef: float) -> MethodResult:
    r"""No clipping: ``w A``, and the top ``max(1, int(cov_ratio * n_valid))`` valid tokens by centred
    ``cov(A, log pi)`` get the penalty ``- kl_coef * |log w|``."""
    y = batch.log_ratio
    objective = torch.exp(y) * batch.advantages
    cov = torch.where(batch.mask, _centred_cov(batch), torch.full_like(y, -math.inf))
    n_valid = int(batch.mask.sum())
    penalised = torch.zeros_like(batch.mask).reshape(-1)
    if n_valid > 0:
        k = max(1, int(cov_ratio * n_valid))
        penalised[torch.topk(cov.reshape(-1), k).indices] = True
    penalised = penalised.reshape(y.shape) & batch.mask
    objective = torch.where(penalised, objective - kl_coef * y.abs(), objective)
    none = torch.zeros_like(batch.mask)
    return MethodResult(objective, lambda: (torch.ones_like(batch.mask), none, penalised))


@register(
    "sapo",
    params={"tau_pos": 1.0, "tau_neg": 1.05},
    default_form="soft",
    forms=("soft",),
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
    return _no_clip(gate * adv, batch)


def _sequence_log_ratio(batch: TokenBatch) -> torch.Tensor:
    """``(1/|y|) sum_t log w_t`` over valid tokens, broadcast to (B, T) (GSPO's sequence ratio)."""
    m = batch.mask.to(batch.log_ratio.dtype)
    seq = (batch.log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    return seq.unsqueeze(-1).expand_as(batch.log_ratio)


@register(
    "gspo",
    params={"epsilon_low": 3e-4, "epsilon_high": 4e-4},
    default_form="min",
    forms=("min", "mask"),
    reference="Zheng et al. 2025 (GSPO); TRL importance_sampling_level='sequence'",
)
def gspo(batch: TokenBatch, epsilon_low: float, epsilon_high: float) -> MethodResult:
    r"""Sequence-level ratio ``s = exp(mean_t log w_t)`` clipped to ``[1 - eps_low, 1 + eps_high]``."""
    seq_batch = TokenBatch(**{**batch.__dict__, "log_ratio": _sequence_log_ratio(batch)})
    return ratio_objective(seq_batch, 1.0 - epsilon_low, 1.0 + epsilon_high)


@register(
    "atr_seq",
    params={"delta": 0.07},
    default_form="mask",
    forms=("mask",),
    reference="ours (the paper's future work): sequence-level approximate trust region with KL3",
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
    m = batch.mask.to(batch.log_ratio.dtype)
    seq_k3 = (kl3_from_log_ratio(batch.log_ratio) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    keep = (seq_k3 <= delta).unsqueeze(-1).expand_as(batch.mask)
    return ratio_objective(batch, 0.0, math.inf, keep)


def _require_full(batch: TokenBatch, name: str) -> None:
    if batch.old_full_logp is None or batch.full_logp is None:
        raise ValueError(
            f"method {name!r} needs the full distributions: pass old_full_logp and full_logp of shape (B, T, V)"
        )
    expected = tuple(batch.log_ratio.shape)
    for arg, t in (("old_full_logp", batch.old_full_logp), ("full_logp", batch.full_logp)):
        if t.ndim != 3 or tuple(t.shape[:2]) != expected:
            raise ValueError(f"{arg} must have shape (B, T, V) with (B, T) = {expected}, got {tuple(t.shape)}")


@register(
    "tr_ppo",
    params={"delta": 0.07},
    default_form="mask",
    forms=("mask",),
    reference="Wang et al. 2020 (Truly PPO); paper Eq. 3 (KL-based clipping)",
    needs_full_distributions=True,
)
def tr_ppo(batch: TokenBatch, delta: float) -> MethodResult:
    r"""Keep ``w A`` while the full ``KL(pi_old(.|s_t) || pi(.|s_t)) <= delta`` at the token's position.

    Note: the paper's Eq. 3 writes the reverse direction ``KL(pi || pi_old)``; we follow Truly PPO and
    METHODS.md (``KL(pi_old || pi)``, the direction TRPO constrains). The KL only gates, so it is
    computed without gradient, chunked over positions (``kl_chunk_size``).
    """
    _require_full(batch, "tr_ppo")
    with torch.no_grad():
        kl = full_kl(batch.old_full_logp, batch.full_logp, chunk_size=batch.kl_chunk_size).to(batch.log_ratio.dtype)
    return ratio_objective(batch, 0.0, math.inf, kl <= delta)


@register(
    "truly_ppo",
    params={"delta": 0.07, "alpha": 5.0},
    default_form="none",
    forms=("none",),
    reference="Wang et al. 2020 (Truly PPO, TR-PPO-RB), wangyuhuix/TrulyPPO",
    needs_full_distributions=True,
)
def truly_ppo(batch: TokenBatch, delta: float, alpha: float) -> MethodResult:
    r"""Trust-region rollback: where ``KL(pi_old || pi) >= delta`` and ``w A > A`` (the ratio moved
    past 1 in the direction the advantage favours) the objective is ``w A - alpha KL``; else ``w A``.
    The KL carries gradient here (it is the rollback force)."""
    _require_full(batch, "truly_ppo")
    kl = full_kl(batch.old_full_logp, batch.full_logp, chunk_size=batch.kl_chunk_size).to(batch.log_ratio.dtype)
    w = torch.exp(batch.log_ratio)
    adv = batch.advantages
    rollback = (kl.detach() >= delta) & (w * adv > adv)
    objective = torch.where(rollback, w * adv - alpha * kl, w * adv)
    none = torch.zeros_like(batch.mask)
    return MethodResult(objective, lambda: (torch.ones_like(batch.mask), none, rollback))
