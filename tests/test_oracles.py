"""Brute-force oracles for the rules no peer library implements (every formula pinned by an oracle).

For each of DCPO, TRGPPO, TR-PPO, Truly PPO, KL1 / KL2 / KL3 (atr) / IS-KL3 in both forms and atr_seq, the loss
is rebuilt here token by token from the rule's *definition*:

* each token's admissible ratio range by bisection at 50 digits (mpmath) on its divergence -- the KL
  estimator for KL1/KL2/KL3/IS-KL3, the binary ``KL(p || p w)`` for TRGPPO, DCPO's quadratic in ``w``;
* mask-form decisions by evaluating the divergence itself at the token's ratio (mpmath), full KLs by a
  sum over the vocabulary;
* the objective from its formula (PPO's min, Eq. 5's freeze, the dual clip, Truly PPO's rollback) as a
  Python sum of per-token torch scalars, aggregated by explicit loops; the gradient is autograd of that sum.

Nothing is shared with ``atr_theory`` except the parameter names. Hypothesis varies B, T, padding, per-sequence
or per-token advantages, extreme log-ratios, every parameter and every aggregation.
"""

import math

import mpmath as mp
import pytest
import torch
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from mp_reference import binary_kl_roots, bisect_log

import atr_theory as at

mp.mp.dps = 40
AGGREGATIONS = ["dr_grpo", "token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]


# --------------------------------------------------------------------------------------------
# definitions, in mpmath
# --------------------------------------------------------------------------------------------
DIVERGENCE = {  # per-sample estimators of the paper's Table 3, as functions of w
    "kl1": lambda w: -mp.log(w),
    "kl2": lambda w: mp.log(w) ** 2 / 2,
    "atr": lambda w: w - 1 - mp.log(w),
    "is_kl3": lambda w: 1 - w + w * mp.log(w),
}


_RANGES: dict = {}


def _range_of(constraint):
    """Sub-level set {w : g(w) <= 0} of a function convex in log w with g(1) < 0: [l, u] (0 / inf where unbounded)."""
    lo_floor, hi_cap = mp.mpf(10) ** -300, mp.mpf(10) ** 300
    lo = mp.mpf(0) if constraint(lo_floor) <= 0 else bisect_log(constraint, lo_floor, mp.mpf(1))
    hi = mp.inf if constraint(hi_cap) <= 0 else bisect_log(constraint, mp.mpf(1), hi_cap)
    return lo, hi


def trgppo_bounds(p, delta, eps):
    """[min(l_KL, 1 - eps), max(u_KL, 1 + eps)] with l_KL, u_KL the extreme w with binary KL(p || p w) <= delta."""
    p = mp.mpf(p)
    if p == 1:
        l_kl, u_kl = mp.exp(-delta), mp.mpf(1)  # w <= 1/p = 1; KL = -log w
    else:
        l_kl, u_kl = binary_kl_roots(p, delta)
    return min(l_kl, 1 - mp.mpf(eps)), max(u_kl, 1 + mp.mpf(eps))


def dcpo_bounds(p, eps_low, eps_high, c):
    """DCPO (arXiv 2509.02333, Eq. 6): w with p (w - 1) w <= eps_high above 1 and p (1 - w) w <= eps_low below,
    i.e. the roots of the quadratics w^2 - w -+ eps / p = 0 (the lower bound 1/2 when they have none), and
    the upper capped at max(c, 10) as in lime-RL/DCPO."""
    p = mp.mpf(p)
    up = bisect_log(lambda w: p * w * (w - 1) - eps_high, mp.mpf(1), mp.mpf(10) ** 30)
    low_quad = lambda w: p * w * (1 - w) - eps_low  # noqa: E731  (<= 0 on [w*, 1] above the larger root)
    lo = bisect_log(low_quad, mp.mpf("0.5"), mp.mpf(1)) if low_quad(mp.mpf("0.5")) > 0 else mp.mpf("0.5")
    return lo, min(up, mp.mpf(max(c, 10.0)))


def full_kl_by_sum(old_row, new_row):
    """KL(pi_old || pi) of one position from two rows of logits / log-probs (re-normalised), a torch scalar."""
    old = [mp.mpf(float(x)) for x in old_row]
    z_old = mp.log(mp.fsum(mp.exp(x) for x in old))
    z_new = torch.logsumexp(new_row, 0)  # the only torch reduction here; differentiable in new_row
    total = 0
    for a in range(len(old)):
        lp_old = old[a] - z_old
        total = total + float(mp.exp(lp_old)) * (float(lp_old) - (new_row[a] - z_new))
    return total


# --------------------------------------------------------------------------------------------
# the brute-force loss
# --------------------------------------------------------------------------------------------
class TieAtABound(Exception):
    """A token's ratio lies on a per-token bound to float64 precision: the brute force does not decide it."""


def brute_force_loss(
    method, form, params, logp, old, adv, mask, aggregation, old_full=None, full=None, max_length=None
):
    """-aggregate of the per-token objective, built token by token (torch scalars carry the gradient); Dr. GRPO
    divides the sum by B * max_length (Liu et al. 2025), max_length defaulting to T."""
    B, T = logp.shape
    per_seq_adv = adv.ndim == 1
    objective = {}
    # sequence-level decisions first (atr_seq)
    seq_keep = {}
    if method == "atr_seq":
        for b in range(B):
            ws = [mp.exp(mp.mpf(float(logp[b, t].detach())) - mp.mpf(float(old[b, t]))) for t in range(T) if mask[b, t]]
            mean_k3 = mp.fsum(DIVERGENCE["atr"](w) for w in ws) / max(len(ws), 1)
            seq_keep[b] = mean_k3 <= params["delta"]
    for b in range(B):
        for t in range(T):
            if not mask[b, t]:
                continue
            A = float(adv[b] if per_seq_adv else adv[b, t])
            y = logp[b, t] - float(old[b, t])
            y_mp = mp.mpf(float(logp[b, t].detach())) - mp.mpf(float(old[b, t]))
            y = torch.clamp(y, -60.0, 60.0)  # the documented clamp of log w
            y_mp = min(max(y_mp, -60), 60)
            w, w_mp = torch.exp(y), mp.exp(y_mp)
            p_old = mp.exp(mp.mpf(float(old[b, t])))
            if method in DIVERGENCE:
                d = params["delta"]
                if form == "mask":
                    inside = DIVERGENCE[method](w_mp) <= d
                    obj = w * A if inside else torch.tensor(A, dtype=torch.float64)
                else:
                    if (method, d) not in _RANGES:
                        _RANGES[method, d] = _range_of(lambda v: DIVERGENCE[method](v) - d)
                    lo, hi = _RANGES[method, d]
                    obj = torch.minimum(w * A, torch.clamp(w, float(lo), float(hi)) * A)
            elif method in ("trgppo", "dcpo"):
                if method == "trgppo":
                    lo, hi = trgppo_bounds(p_old, params["delta"], params["epsilon"])
                else:
                    lo, hi = dcpo_bounds(p_old, params["epsilon_low"], params["epsilon_high"], params["dual_clip_c"])
                if form == "mask":
                    if any(mp.almosteq(w_mp, bound, rel_eps=1e-12, abs_eps=0) for bound in (lo, hi)):
                        # w on a bound to float64 precision (e.g. pi = 1, where TRGPPO's u(p) = (1 - ~1e-22) / p):
                        # keeping or masking are both right to the precision of the inputs
                        raise TieAtABound(method, float(w_mp))
                    obj = w * A if lo <= w_mp <= hi else torch.tensor(A, dtype=torch.float64)
                else:
                    obj = torch.minimum(w * A, torch.clamp(w, float(lo), float(hi)) * A)
                if method == "dcpo" and A < 0 and obj.item() < params["dual_clip_c"] * A:  # dual clip
                    obj = torch.tensor(params["dual_clip_c"] * A, dtype=torch.float64)
            elif method == "tr_ppo":
                kl = float(full_kl_by_sum(old_full[b, t], full[b, t].detach()))
                if form == "mask":  # the paper's Eq. 3 in Eq. 5
                    obj = w * A if kl <= params["delta"] else torch.tensor(A, dtype=torch.float64)
                else:  # TR-PPO (Truly PPO paper, Eq. 8): min(w A, F A), F = w_old = 1 outside the trust region
                    obj = torch.minimum(w * A, torch.tensor(A, dtype=torch.float64)) if kl >= params["delta"] else w * A
            elif method == "truly_ppo":
                kl = full_kl_by_sum(old_full[b, t], full[b, t])
                rollback = kl.item() >= params["delta"] and float(w_mp) * A > A
                obj = w * A - params["alpha"] * kl if rollback else w * A
            elif method == "atr_seq":
                obj = w * A if seq_keep[b] else torch.tensor(A, dtype=torch.float64)
            else:
                raise AssertionError(method)
            objective[b, t] = obj
    zero = torch.tensor(0.0, dtype=torch.float64)
    n_valid = [sum(bool(mask[b, t]) for t in range(T)) for b in range(B)]
    seq_sums = [sum((objective[b, t] for t in range(T) if mask[b, t]), zero) for b in range(B)]
    if aggregation == "dr_grpo":
        value = sum(seq_sums, zero) / (B * (T if max_length is None else max_length))
    elif aggregation == "token_mean":
        value = sum(seq_sums, zero) / max(sum(n_valid), 1)
    elif aggregation == "seq_mean_token_mean":
        value = sum((s / max(n, 1) for s, n in zip(seq_sums, n_valid)), zero) / B
    else:
        value = sum(seq_sums, zero) / B
    return -value


# --------------------------------------------------------------------------------------------
# the comparison
# --------------------------------------------------------------------------------------------
CASES = [
    ("atr", "mask"),
    ("atr", "min"),
    ("kl1", "mask"),
    ("kl1", "min"),
    ("kl2", "mask"),
    ("kl2", "min"),
    ("is_kl3", "mask"),
    ("is_kl3", "min"),
    ("trgppo", "min"),
    ("trgppo", "mask"),
    ("dcpo", "min"),
    ("dcpo", "mask"),
    ("atr_seq", "mask"),
    ("tr_ppo", "mask"),
    ("tr_ppo", "min"),
    ("truly_ppo", "none"),
]


def _params(method, draw):
    delta = draw(st.sampled_from([0.005, 0.03, 0.07, 0.2, 0.8, 1.5]))
    if method in ("atr", "kl1", "kl2", "is_kl3", "atr_seq", "tr_ppo"):
        return {"delta": delta}
    if method == "trgppo":
        return {"delta": delta, "epsilon": draw(st.sampled_from([0.0, 0.1, 0.2, 0.5]))}
    if method == "truly_ppo":
        return {"delta": draw(st.sampled_from([0.001, 0.01, 0.05])), "alpha": draw(st.sampled_from([0.0, 0.3, 5.0]))}
    if method == "dcpo":
        return {
            "epsilon_low": draw(st.sampled_from([0.0, 0.05, 0.16, 0.3])),
            "epsilon_high": draw(st.sampled_from([0.0, 0.1, 0.2, 0.6])),
            "dual_clip_c": draw(st.sampled_from([1.5, 3.0, 12.0])),
        }
    raise AssertionError(method)


@st.composite
def problems(draw, method):
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * draw(st.sampled_from([0.5, 3.0, 12.0])) - 1e-4
    scale = draw(st.sampled_from([0.05, 0.3, 1.0, 3.0]))
    logp = (old + scale * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=0.0)
    if draw(st.booleans()):  # an extreme log-ratio, beyond the clamp (both log-probs stay <= 0)
        if draw(st.booleans()):
            logp[0, 0] = old[0, 0] - 80.0
        else:
            old[0, 0] = logp[0, 0] - 65.0
    per_token = draw(st.booleans())
    adv = torch.randn((B, T) if per_token else (B,), generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) > draw(st.sampled_from([0.0, 0.3]))
    mask[0, 0] = True
    full = old_full = None
    if at.METHODS[method].needs_full_distributions:
        V = 5
        old_full = torch.log_softmax(torch.randn(B, T, V, generator=g, dtype=torch.float64), -1)  # log-probs
        spread = draw(st.sampled_from([0.05, 0.3]))
        full = torch.log_softmax(old_full + spread * torch.randn(B, T, V, generator=g, dtype=torch.float64), -1)
    return logp, old, adv, mask, old_full, full


def _check(method, form, data):
    params = _params(method, data.draw)
    logp, old, adv, mask, old_full, full = data.draw(problems(method))
    aggregation = data.draw(st.sampled_from(AGGREGATIONS))
    max_length = None  # dr_grpo's divisor: the generation budget, any integer >= T
    if aggregation == "dr_grpo" and data.draw(st.booleans()):
        max_length = logp.shape[1] + data.draw(st.integers(0, 9))
    leaf = logp.clone().requires_grad_(True)
    full_leaf = None if full is None else full.clone().requires_grad_(True)
    kw = {} if full is None else dict(old_full_logp=old_full, full_logp=full_leaf)
    kw.update(aggregation=aggregation, max_length=max_length)
    ours = at.policy_loss(leaf, old, adv, mask, method=method, form=form, **kw, **params).loss
    leaves = [leaf] + ([full_leaf] if full is not None else [])
    g_ours = _grads(ours, leaves)

    leaf2 = logp.clone().requires_grad_(True)
    full2 = None if full is None else full.clone().requires_grad_(True)
    try:
        theirs = brute_force_loss(method, form, params, leaf2, old, adv, mask, aggregation, old_full, full2, max_length)
    except TieAtABound:
        reject()
    leaves2 = [leaf2] + ([full2] if full is not None else [])
    g_theirs = _grads(theirs, leaves2)

    assert ours.item() == pytest.approx(theirs.item(), rel=1e-9, abs=1e-12)
    for a, b in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)


def _grads(loss, leaves):
    """d loss / d leaves, zeros where a leaf does not reach the loss (a fully frozen brute-force sum is a constant)."""
    if not loss.requires_grad:
        return [torch.zeros_like(x) for x in leaves]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]


@pytest.mark.parametrize("method, form", CASES, ids=[f"{m}-{f}" for m, f in CASES])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_policy_loss_equals_the_brute_force_definition(method, form, data):
    _check(method, form, data)


def test_the_oracle_catches_a_perturbed_formula(monkeypatch):
    """Mutations that used to leave the suite green (the list the older suite missed) now fail the oracle."""
    import atr_theory.ranges as ranges

    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 6, generator=g, dtype=torch.float64) * 4 - 0.05
    logp = (old + 0.8 * torch.randn(3, 6, generator=g, dtype=torch.float64)).clamp(max=0.0)
    adv = torch.randn(3, generator=g, dtype=torch.float64)
    old[1] = old[1] - 1.5  # so that logp stays <= 0 below
    logp[1], adv[1] = old[1] + 1.5, -1.0  # w = e^1.5 > c = 3 with A < 0: the dual clip acts
    mask = torch.ones(3, 6, dtype=torch.bool)

    def agree(method, form, params):
        ours = at.policy_loss(logp, old, adv, mask, method=method, form=form, **params).loss
        return math.isclose(float(ours), float(brute_force_loss(method, form, params, logp, old, adv, mask, "dr_grpo")))

    cases = [("trgppo", "min", {"delta": 0.07, "epsilon": 0.1}), ("dcpo", "min", {})]
    for method, form, params in cases:
        full = {**at.METHODS[method].defaults, **params}
        assert agree(method, form, full)
    # TRGPPO with delta doubled inside the solver
    real = ranges.trgppo_kl_log_range_torch
    monkeypatch.setattr(ranges, "trgppo_kl_log_range_torch", lambda p, d, **k: real(p, 2 * d, **k))
    assert not agree("trgppo", "min", {"delta": 0.07, "epsilon": 0.1})
    monkeypatch.undo()
    # DCPO without its dual clip
    import atr_theory.methods.divergence_ranges as methods  # dcpo looks ratio_objective up here

    real_objective = methods.ratio_objective
    monkeypatch.setattr(methods, "ratio_objective", lambda batch, lo, hi, *a, **k: real_objective(batch, lo, hi))
    assert not agree("dcpo", "min", dict(at.METHODS["dcpo"].defaults))
