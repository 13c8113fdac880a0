r"""The paper's theorems as executable checks.

Each check takes a batch of instances (logits ``theta`` = theta^k, ``theta_old``, advantages ``adv``,
all (N, S, K) float64; ``delta``, ``epsilon``, ``eta``) and returns a :class:`Check` holding what the
paper's statement predicts, what an *independent* exact computation gives (autograd of the clipped
objective, the entropy of the updated policy, mpmath root finding), and the error. Where the
statement as written fails, a ``corrected`` prediction (derived in the docstring) is checked the
same way.

Setting of Sec. 4: softmax policy per state, exact (full-batch) policy gradient, state distribution
``d(s) = 1/S``, one gradient-ascent step of size ``eta`` from the same ``theta^k`` for both methods:
``theta^{m,k+1} = theta^k + eta * grad J^m(theta^k)``.

Two objectives are considered for a ratio range [l, u]:

* ``"clip"``: the paper's appendix objective ``J = E_old[clip(w, l, u) A]`` (identical in gradient to
  the mask form of Eq. 5, by Thm 3.1);
* ``"min"``: PPO's ``J = E_old[min(w A, clip(w, l, u) A)]``, which PPO/GRPO/TRL/verl implement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mpmath as mp
import numpy as np
import torch
from scipy.special import lambertw

from .bandit import entropy, exact_surrogate
from .ranges import kl3_clip_range

__all__ = [
    "Check",
    "random_instances",
    "softmax_pg_direction",
    "kept_indicator",
    "one_step",
    "check_gradient_equivalence",
    "check_equivalence_and_asymmetry",
    "check_logit_difference",
    "check_entropy_difference",
]


@dataclass
class Check:
    """Predicted vs exact values for a batch of instances (tensors of equal shape)."""

    predicted: torch.Tensor
    exact: torch.Tensor
    corrected: torch.Tensor | None = None

    @staticmethod
    def _err(pred: torch.Tensor, exact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-instance max abs error and error relative to the instance's max |exact| (over all but dim 0)."""
        diff = (pred - exact).abs().reshape(pred.shape[0], -1).amax(-1)
        scale = exact.abs().reshape(exact.shape[0], -1).amax(-1)
        return diff, diff / scale.clamp_min(1e-300)

    def abs_error(self) -> torch.Tensor:
        return self._err(self.predicted, self.exact)[0]

    def rel_error(self) -> torch.Tensor:
        return self._err(self.predicted, self.exact)[1]

    def corrected_abs_error(self) -> torch.Tensor:
        return self._err(self.corrected, self.exact)[0]

    def corrected_rel_error(self) -> torch.Tensor:
        return self._err(self.corrected, self.exact)[1]


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


def _ratio(theta: torch.Tensor, theta_old: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.log_softmax(theta, -1) - torch.log_softmax(theta_old, -1))


def softmax_pg_direction(theta: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    r"""``pi(a) [g(a) - E_{a' ~ pi}[g(a')]]``: the gradient of ``sum_a' pi(a') g(a')`` w.r.t. the logit of
    ``a`` with ``g`` held fixed (``d pi(a')/d theta_a = pi(a') (1[a=a'] - pi(a))``). With
    ``pi_old w = pi`` this is the closed form of ``d/d theta_a E_old[w g]`` used in App. A.2."""
    pi = torch.softmax(theta, -1)
    return pi * (g - (pi * g).sum(-1, keepdim=True))


def kept_indicator(w: torch.Tensor, adv: torch.Tensor, lower: float, upper: float, objective: str) -> torch.Tensor:
    r"""Which actions carry gradient ``A dw`` under the objective with range [lower, upper]:

    * ``"clip"``: ``lower <= w <= upper`` (the constraint of Eq. 5);
    * ``"min"``: ``(A > 0 and w <= upper) or (A < 0 and w >= lower) or A = 0`` -- PPO's min only stops
      the gradient on the side where the surrogate would be optimistic.
    """
    inside = (w >= lower) & (w <= upper)
    if objective == "clip":
        return inside
    if objective == "min":
        return ((adv > 0) & (w <= upper)) | ((adv < 0) & (w >= lower)) | (adv == 0)
    raise ValueError(f"objective must be 'clip' or 'min', got {objective!r}")


def _inline_objective(theta, theta_old, adv, lower, upper, objective):
    """Independently written ``sum_n sum_s (1/S) sum_a pi_old (clip(w) A | min(w A, clip(w) A))``."""
    lo = torch.log_softmax(theta_old.detach(), -1)
    w = torch.exp(torch.log_softmax(theta, -1) - lo)
    clipped = torch.clamp(w, lower, upper) * adv
    f = clipped if objective == "clip" else torch.minimum(w * adv, clipped)
    return (lo.exp() * f).sum(-1).mean(-1).sum()


def one_step(theta, theta_old, adv, lower: float, upper: float, objective: str, eta: float) -> torch.Tensor:
    """``theta + eta * grad J(theta)``, the gradient by autograd of the inline objective."""
    th = theta.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(_inline_objective(th, theta_old, adv, lower, upper, objective), th)
    return theta.detach() + eta * g


# ----------------------------------------------------------------------------------------------
# Thm 3.1 Gradient equivalence
# ----------------------------------------------------------------------------------------------
def check_gradient_equivalence(theta, theta_old, adv, lower: float, upper: float, objective: str = "clip") -> Check:
    r"""Thm 3.1: ``grad L^ratio = grad L^ratio_general`` with ``C = {l <= w <= u}``.

    predicted: the gradient of the general (mask) objective, in closed form
    ``d(s) pi(a) [g(a) - E_pi g]`` with ``g = A 1[C]``; also computed through
    :func:`atr_theory.policy_loss` (``form="mask"``) and required to agree with it.
    exact: autograd of the ratio-based objective written inline (``"clip"`` or PPO ``"min"``).
    corrected (for ``"min"``): the same closed form with the min objective's kept set
    (:func:`kept_indicator`): ``C' = {A > 0, w <= u} u {A < 0, w >= l}``.
    """
    S = theta.shape[1]
    w = _ratio(theta, theta_old)
    predicted = softmax_pg_direction(theta, adv * kept_indicator(w, adv, lower, upper, "clip")) / S
    th = theta.detach().clone().requires_grad_(True)
    (exact,) = torch.autograd.grad(_inline_objective(th, theta_old, adv, lower, upper, objective), th)
    th2 = theta.detach().clone().requires_grad_(True)
    loss, _ = exact_surrogate(
        th2, theta_old, adv, "clip_higher", form="mask", epsilon_low=1 - lower, epsilon_high=upper - 1
    )
    (via_library,) = torch.autograd.grad(-loss, th2)
    if not torch.allclose(via_library, predicted, rtol=1e-10, atol=1e-13):
        raise AssertionError("policy_loss(form='mask') disagrees with the closed-form general gradient")
    corrected = softmax_pg_direction(theta, adv * kept_indicator(w, adv, lower, upper, objective)) / S
    return Check(predicted, exact, corrected)


# ----------------------------------------------------------------------------------------------
# Thm 3.2 Equivalence and asymmetry
# ----------------------------------------------------------------------------------------------
def _mp_kl3_roots(delta: float, dps: int = 60, iters: int = 260) -> tuple[mp.mpf, mp.mpf]:
    """Roots of ``w - 1 - log w = delta`` by bisection in ``y = log w`` at ``dps`` digits (no Lambert W).

    Brackets: ``f(y) = e^y - 1 - y - delta`` is ``e^y > 0`` at ``y = -(1 + delta)`` and ``-delta`` at 0;
    for ``y > 0``, ``f(sqrt(2 delta)) >= 0`` since ``e^y - 1 - y >= y^2 / 2``.
    """
    with mp.workdps(dps):
        d = mp.mpf(delta)
        f = lambda y: mp.expm1(y) - y - d

        def bisect(a, b):  # f(a) > 0 > f(b) or f(a) < 0 < f(b)
            fa = f(a)
            for _ in range(iters):
                m = (a + b) / 2
                if (f(m) > 0) == (fa > 0):
                    a, fa = m, f(m)
                else:
                    b = m
            return (a + b) / 2

        y_lo = bisect(-(1 + d), mp.mpf(0))
        y_hi = bisect(mp.mpf(0), mp.sqrt(2 * d))
        return mp.exp(y_lo), mp.exp(y_hi)


def check_equivalence_and_asymmetry(deltas: np.ndarray, n_ratios: int = 200, seed: int = 0) -> dict:
    r"""Thm 3.2 over a grid of ``delta``.

    (1) the paper's closed form ``[-W0(-e^{-1-d}), -W_{-1}(-e^{-1-d})]`` (scipy's lambertw, as written)
    against the roots of ``k3(w) = delta`` found by mpmath at 50 digits (no Lambert W involved), and
    ``k3(w) <= delta  <=>  l <= w <= u`` on random ratios; (2) ``1 - l < u - 1``.
    Also reports the error of :func:`atr_theory.kl3_clip_range` (Newton-polished) on the same grid.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for d in deltas:
        L, U = _mp_kl3_roots(float(d))
        z = -math.exp(-1.0 - float(d))
        l_paper, u_paper = -lambertw(z, 0).real, -lambertw(z, -1).real
        l_pkg, u_pkg = kl3_clip_range(float(d))
        w = np.exp(rng.uniform(math.log(float(L)) - 1, math.log(float(U)) + 1, n_ratios))
        with mp.workdps(30):
            k3 = np.array([float(mp.mpf(x) - 1 - mp.log(mp.mpf(x))) for x in w])
        equiv = np.all((k3 <= d) == ((w >= l_pkg) & (w <= u_pkg)))
        rows.append(
            {
                "delta": float(d),
                "l_exact": float(L),
                "u_exact": float(U),
                "paper_formula_rel_err": float(max(abs(l_paper - L) / L, abs(u_paper - U) / U)),
                "paper_formula_excursion_rel_err": float(
                    max(abs((1 - l_paper) - (1 - L)) / (1 - L), abs((u_paper - 1) - (U - 1)) / (U - 1))
                ),
                "package_rel_err": float(max(abs(l_pkg - L) / L, abs(u_pkg - U) / U)),
                "asymmetric": bool((1 - L) < (U - 1)),
                "bounds_ordered": bool(0 < L < 1 < U),
                "equivalence_on_random_ratios": bool(equiv),
            }
        )
    return {"rows": rows}


# ----------------------------------------------------------------------------------------------
# Thm 4.1 Policy logits difference, Thm 4.2 Entropy difference
# ----------------------------------------------------------------------------------------------
def event_epsilon(delta: float, event: str) -> float:
    """The ratio-clip epsilon under which the event is defined: X-: ``1 + eps = u``; X+: ``1 - eps = l``."""
    lo, hi = kl3_clip_range(delta)
    if event == "X-":
        return hi - 1.0
    if event == "X+":
        return 1.0 - lo
    raise ValueError(f"event must be 'X-' or 'X+', got {event!r}")


def event_indicator(w: torch.Tensor, delta: float, event: str) -> torch.Tensor:
    """``1[a in X-(s)] = 1[1 - eps <= w <= l]`` (eps = u - 1), ``1[a in X+(s)] = 1[1 + eps <= w <= u]`` (eps = 1 - l)."""
    lo, hi = kl3_clip_range(delta)
    eps = event_epsilon(delta, event)
    if event == "X-":
        return (w >= 1 - eps) & (w <= lo)
    return (w >= 1 + eps) & (w <= hi)


def _updates(theta, theta_old, adv, delta, event, objective, eta):
    lo, hi = kl3_clip_range(delta)
    eps = event_epsilon(delta, event)
    th_atr = one_step(theta, theta_old, adv, lo, hi, objective, eta)
    th_ratio = one_step(theta, theta_old, adv, 1 - eps, 1 + eps, objective, eta)
    return th_atr, th_ratio


def _logit_difference_formulas(theta, theta_old, adv, delta, event, objective, eta):
    """Paper's Thm 4.1 prediction and the corrected one (sign: - for X-, + for X+)."""
    S = theta.shape[1]
    w = _ratio(theta, theta_old)
    ind = event_indicator(w, delta, event).to(adv.dtype)
    sign = -1.0 if event == "X-" else 1.0
    paper = sign * eta / S * softmax_pg_direction(theta, adv * ind)
    if objective == "min":  # the min objective keeps the gradient of the optimistic side anyway
        ind = ind * ((adv < 0) if event == "X-" else (adv > 0)).to(adv.dtype)
    corrected = sign * eta / S * softmax_pg_direction(theta, adv * ind)
    return paper, corrected


def check_logit_difference(
    theta, theta_old, adv, delta: float, event: str, objective: str = "clip", eta: float = 0.1
) -> Check:
    r"""Thm 4.1: ``Delta theta = theta^{ATR,k+1} - theta^{ratio,k+1}``.

    predicted: ``-+ eta d(s) pi(a) [A 1_X(a) - E_pi[A 1_X]]`` (paper). exact: the difference of the two
    autograd updates. For ``"clip"`` the statement is exact (both sides are linear in eta).
    corrected (``"min"``): ``1_X`` becomes ``1_X 1[A < 0]`` under X- and ``1_X 1[A > 0]`` under X+.
    """
    th_atr, th_ratio = _updates(theta, theta_old, adv, delta, event, objective, eta)
    paper, corrected = _logit_difference_formulas(theta, theta_old, adv, delta, event, objective, eta)
    return Check(paper, th_atr - th_ratio, corrected)


def _centred_cov(pi: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``Cov_{a ~ pi}(x, y)`` over the last axis."""
    ex = (pi * x).sum(-1, keepdim=True)
    ey = (pi * y).sum(-1, keepdim=True)
    return (pi * (x - ex) * (y - ey)).sum(-1)


def check_entropy_difference(
    theta, theta_old, adv, delta: float, event: str, objective: str = "clip", eta: float = 1e-3
) -> Check:
    r"""Thm 4.2: ``Delta H = H(theta^{ATR,k+1}|s) - H(theta^{ratio,k+1}|s)`` per state, shape (N, S).

    predicted (paper): ``+- eta d(s) Cov_{pi}(A 1_X, log pi)`` (+ under X-, - under X+).
    exact: the entropies of the two updated softmax policies (float64).
    corrected: the first-order term the paper's own proof leads to, keeping the factor ``pi(a)`` of
    ``Delta theta_a`` (Thm 4.1) that the last step of the proof drops:
    ``Delta H = -sum_a pi(a) Delta theta_a (log pi(a) + H) + O(eta^2)
    = +- eta d(s) Cov_pi(pi (A 1_X - E_pi[A 1_X]), log pi) + O(eta^2)``
    (with the corrected indicator of Thm 4.1 for the ``"min"`` objective). Cf. Cui et al. 2025,
    whose softmax-PG entropy lemma carries the same ``pi(a)`` factor.
    """
    th_atr, th_ratio = _updates(theta, theta_old, adv, delta, event, objective, eta)
    exact = entropy(th_atr) - entropy(th_ratio)
    S = theta.shape[1]
    pi = torch.softmax(theta, -1)
    logpi = torch.log_softmax(theta, -1)
    w = _ratio(theta, theta_old)
    ind = event_indicator(w, delta, event).to(adv.dtype)
    sign = 1.0 if event == "X-" else -1.0
    paper = sign * eta / S * _centred_cov(pi, adv * ind, logpi)
    _, dtheta = _logit_difference_formulas(theta, theta_old, adv, delta, event, objective, eta)
    corrected = -(pi * dtheta * (logpi + entropy(theta).unsqueeze(-1))).sum(-1)
    return Check(paper, exact, corrected)
