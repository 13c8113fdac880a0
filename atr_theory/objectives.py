r"""The softmax setting of the paper's Sec. 4, written once for the theorem checks (``atr_theory.theorems``): random
instances, the ratio, the softmax policy-gradient direction, the inline objectives of both readings of the paper
(``atr_theory.registry.READINGS``) and their pairings.

Inline objectives (sharing nothing with ``atr_theory.methods``), for a range [l, u] or a constraint C: ``"clip"``
``clip(w, l, u) A``; ``"min"`` ``min(w A, clip(w, l, u) A)``; the general operator (Eq. 5) ``g(w) = w if C else
w_old = 1`` alone (``"mask"``: ``g(w) A``) or inside PPO's min (``"general_min"``: ``min(w A, g(w) A)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "PAIRINGS",
    "Pairing",
    "general_objective",
    "inline_objective",
    "kept_indicator",
    "one_step",
    "pairing",
    "random_instances",
    "ratio",
    "softmax_pg_direction",
]


# ----------------------------------------------------------------------------------------------
# instances
# ----------------------------------------------------------------------------------------------
def random_instances(
    n: int, K: int, *, S: int = 1, spread: float = 0.5, old_scale: float = 1.5, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``theta_old ~ N(0, old_scale^2)``, ``theta = theta_old + N(0, spread^2)``, ``A ~ N(0, 1)``; (n, S, K) float64."""
    g = generator
    theta_old = old_scale * torch.randn(n, S, K, generator=g, dtype=torch.float64)
    theta = theta_old + spread * torch.randn(n, S, K, generator=g, dtype=torch.float64)
    adv = torch.randn(n, S, K, generator=g, dtype=torch.float64)
    return theta, theta_old, adv


def ratio(theta: torch.Tensor, theta_old: torch.Tensor) -> torch.Tensor:
    """``w = pi(a|s) / pi_old(a|s)`` from logits, (N, S, K)."""
    return torch.exp(torch.log_softmax(theta, -1) - torch.log_softmax(theta_old, -1))


def softmax_pg_direction(theta: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    r"""``pi(a) [g(a) - E_{a' ~ pi}[g(a')]]``: the gradient of ``sum_a' pi(a') g(a')`` w.r.t. the logit of
    ``a`` with ``g`` held fixed (``d pi(a')/d theta_a = pi(a') (1[a=a'] - pi(a))``). With
    ``pi_old w = pi`` this is the closed form of ``d/d theta_a E_old[w g]`` used in App. A.2."""
    pi = torch.softmax(theta, -1)
    return pi * (g - (pi * g).sum(-1, keepdim=True))


def kept_indicator(w: torch.Tensor, adv: torch.Tensor, lower: float, upper: float, objective: str) -> torch.Tensor:
    r"""Which actions carry gradient ``A dw`` under the objective with range [lower, upper]:

    * ``"clip"`` / ``"mask"``: ``lower <= w <= upper`` (the constraint of Eq. 5);
    * ``"min"`` / ``"general_min"``: ``(A > 0 and w <= upper) or (A < 0 and w >= lower) or A = 0`` -- PPO's min only
      stops the gradient on the side where the surrogate would be optimistic.
    """
    inside = (w >= lower) & (w <= upper)
    if objective in ("clip", "mask"):
        return inside
    if objective in ("min", "general_min"):
        return ((adv > 0) & (w <= upper)) | ((adv < 0) & (w >= lower)) | (adv == 0)
    raise ValueError(f"objective must be 'clip', 'mask', 'min' or 'general_min', got {objective!r}")


def _expectation(theta_old, f):
    """``sum_n sum_s (1/S) sum_a pi_old(a|s) f(a|s)``."""
    return (torch.softmax(theta_old.detach(), -1) * f).sum(-1).mean(-1).sum()


def inline_objective(theta, theta_old, adv, lower, upper, objective):
    """Independently written ``sum_n sum_s (1/S) sum_a pi_old (clip(w) A | min(w A, clip(w) A))``."""
    lo = torch.log_softmax(theta_old.detach(), -1)
    w = torch.exp(torch.log_softmax(theta, -1) - lo)
    clipped = torch.clamp(w, lower, upper) * adv
    if objective not in ("clip", "min"):
        raise ValueError(f"objective must be 'clip' or 'min', got {objective!r}")
    f = clipped if objective == "clip" else torch.minimum(w * adv, clipped)
    return (lo.exp() * f).sum(-1).mean(-1).sum()


def general_objective(theta, theta_old, adv, constraint: Callable[[torch.Tensor], torch.Tensor], form: str):
    r"""The general clip operator (paper Eq. 5), ``g(w) = w`` where ``constraint(w)`` holds, else ``w_old = 1`` (no
    gradient), in the objective of ``form``: ``"mask"`` ``E_old[g(w) A]`` (the Section 4 pure-clip reading) or
    ``"general_min"`` ``E_old[min(w A, g(w) A)]`` (the Section 2 surrogate). ``constraint`` maps the ratio to a bool
    tensor and is evaluated without gradient."""
    w = ratio(theta, theta_old.detach())
    with torch.no_grad():
        keep = constraint(w)
    g = torch.where(keep, w, torch.ones_like(w))
    if form == "mask":
        return _expectation(theta_old, g * adv)
    if form == "general_min":
        return _expectation(theta_old, torch.minimum(w * adv, g * adv))
    raise ValueError(f"form must be 'mask' or 'general_min', got {form!r}")


def one_step(theta, theta_old, adv, lower: float, upper: float, objective: str, eta: float) -> torch.Tensor:
    """``theta + eta * grad J(theta)``, the gradient by autograd of the inline objective: ``"clip"`` / ``"min"`` with
    the range [lower, upper]; ``"mask"`` / ``"general_min"`` with the general operator for ``lower <= w <= upper``."""
    th = theta.detach().clone().requires_grad_(True)
    if objective in ("mask", "general_min"):
        J = general_objective(th, theta_old, adv, lambda w: (w >= lower) & (w <= upper), objective)
    else:
        J = inline_objective(th, theta_old, adv, lower, upper, objective)
    (g,) = torch.autograd.grad(J, th)
    return theta.detach() + eta * g


def one_step_kl3(theta, theta_old, adv, delta: float, form: str, eta: float) -> torch.Tensor:
    """ATR's update from its definition, not its range: the general operator with ``C = w - 1 - log w <= delta``."""
    th = theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(general_objective(th, theta_old, adv, lambda w: w - 1 - torch.log(w) <= delta, form), th)
    return theta.detach() + eta * g


@dataclass(frozen=True)
class Pairing:
    """A pairing of the two readings for a theorem that compares two objectives: ``first`` is the form of the
    ratio-based objective (Thm 3.1) or of ATR (Thms 4.1, 4.2), ``second`` that of the general operator (Thm 3.1) or
    of the ratio-based clip (Thms 4.1, 4.2); each ``"min"`` (Section 2 surrogate) or ``"pure"`` (Section 4 pure
    clip / mask form)."""

    id: str
    label: str
    first: str
    second: str


PAIRINGS: tuple[Pairing, ...] = (
    Pairing("min-vs-min", "min vs min: both in the Section 2 surrogate, the clip inside PPO's min", "min", "min"),
    Pairing("pure-vs-pure", "pure vs pure: both in the Section 4 pure-clip objective, the mask form", "pure", "pure"),
    Pairing(
        "mixed",
        "mixed: the ratio-based objective in PPO's min, the general operator / ATR in the mask form",
        "min",
        "pure",
    ),
)
_PAIRING = {p.id: p for p in PAIRINGS}


def pairing(pairing_id: str) -> Pairing:
    """The ``PAIRINGS`` entry named ``pairing_id``."""
    if pairing_id not in _PAIRING:
        raise ValueError(f"pairing must be one of {sorted(_PAIRING)}, got {pairing_id!r}")
    return _PAIRING[pairing_id]
