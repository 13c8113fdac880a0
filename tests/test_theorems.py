"""The paper's theorems, each against an exact independent computation.

Where a statement holds, the error is at floating-point level (or O(eta^2) for first-order
statements, checked by halving eta). Where it fails as written, the failure is asserted on a concrete
instance and the corrected statement is asserted on the same instances.
"""

import json
import math

import numpy as np
import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import atr_theory as at
from atr_theory import symbolic
from atr_theory import theorems as T

torch.set_default_dtype(torch.float64)


def _inst(seed, n=64, K=6, S=2, spread=0.5):
    return T.random_instances(n, K, S=S, spread=spread, generator=torch.Generator().manual_seed(seed))


def _with_event(seed, delta, event, n=400, K=6, S=1):
    th, tho, A = _inst(seed, n=n, K=K, S=S)
    ind = T.event_indicator(T.ratio(th, tho), delta, event).reshape(n, -1).any(-1)
    return th[ind], tho[ind], A[ind]


# ---------------------------------------------------------------- Thm 3.1
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 40), st.floats(0.01, 0.5), st.sampled_from(["pure-vs-pure", "min-vs-min"]))
def test_thm31_gradient_equivalence_holds_when_both_objectives_are_read_the_same_way(seed, K, delta, pairing):
    # pure clip against the mask form, and PPO's min against the general operator inside the same min
    lo, hi = at.kl3_clip_range(delta)
    th, tho, A = _inst(seed, K=K)
    c = T.check_gradient_equivalence(th, tho, A, lo, hi, pairing)
    assert float(c.abs_error().max()) < 1e-13
    assert float(c.exact.abs().max()) > 1e-3  # not 0 = 0


def test_thm31_under_min_vs_min_is_the_packages_min_form_of_atr():
    # the general operator inside PPO's min (autograd of an inline objective) against policy_loss(method="atr"),
    # whose default is that form: the same gradient, on instances where tokens lie outside the range on both sides
    lo, hi = at.kl3_clip_range(0.07)
    th, tho, A = _inst(8, n=128, K=7, spread=0.8)
    w = T.ratio(th, tho)
    assert bool((w < lo).any()) and bool((w > hi).any())
    thg = th.clone().requires_grad_(True)
    inside = lambda r: (r >= lo) & (r <= hi)
    (g_general,) = torch.autograd.grad(T.general_objective(thg, tho, A, inside, "general_min"), thg)
    thl = th.clone().requires_grad_(True)
    loss, _ = at.bandit.exact_surrogate(thl, tho, A, "atr", delta=0.07)
    (g_lib,) = torch.autograd.grad(-loss, thl)
    np.testing.assert_allclose(g_lib.numpy(), g_general.numpy(), rtol=1e-10, atol=1e-13)


def test_thm31_fails_only_for_the_mixed_pairing_and_the_corrected_constraint_holds():
    # a 2-action counterexample: A > 0 on an action whose ratio fell below l
    lo, hi = at.kl3_clip_range(0.07)
    tho = torch.tensor([[[0.0, 0.0]]])
    th = torch.tensor([[[-0.9, 0.0]]])  # w = (0.578, 1.42) -> action 0 below l
    A = torch.tensor([[[1.0, -0.5]]])
    w = T.ratio(th, tho)
    assert w[0, 0, 0] < lo
    c = T.check_gradient_equivalence(th, tho, A, lo, hi, "mixed")
    assert float(c.abs_error().max()) > 0.05  # PPO's min against the mask form misses by O(1)
    assert float(T.check_gradient_equivalence(th, tho, A, lo, hi, "min-vs-min").abs_error().max()) < 1e-15
    assert float(c.corrected_abs_error().max()) < 1e-15
    # and on random instances
    th, tho, A = _inst(3, n=256, K=8)
    c = T.check_gradient_equivalence(th, tho, A, lo, hi, "mixed")
    assert float(c.rel_error().max()) > 0.1
    assert float(c.corrected_abs_error().max()) < 1e-13


def test_thm31_general_gradient_via_policy_loss_equals_inline_autograd_of_pure_clip():
    # the library's mask form is the "general" objective; its gradient must equal autograd of clip(w) A
    lo, hi = 0.8, 1.3
    th, tho, A = _inst(5, K=9)
    thl = th.clone().requires_grad_(True)
    loss, _ = at.bandit.exact_surrogate(thl, tho, A, "clip_higher", form="mask", epsilon_low=0.2, epsilon_high=0.3)
    (g_lib,) = torch.autograd.grad(-loss, thl)
    thi = th.clone().requires_grad_(True)
    (g_inline,) = torch.autograd.grad(T.inline_objective(thi, tho, A, lo, hi, "clip"), thi)
    np.testing.assert_allclose(g_lib.numpy(), g_inline.numpy(), rtol=1e-11, atol=1e-14)


# ---------------------------------------------------------------- Thm 3.2
def test_thm32_equivalence_and_asymmetry_hold_against_mpmath_roots():
    deltas = np.array([1e-12, 1e-6, 0.01, 0.07, 0.3, 1.0, 10.0, 50.0])
    rows = T.check_equivalence_and_asymmetry(deltas, n_ratios=50)["rows"]
    for r in rows:
        assert r["asymmetric"] and r["bounds_ordered"] and r["equivalence_on_random_ratios"]
        assert r["package_rel_err"] < 1e-14
    # the paper's closed form evaluated naively with scipy loses the excursion near the branch point
    assert rows[0]["paper_formula_excursion_rel_err"] > 1e-3
    assert rows[3]["paper_formula_excursion_rel_err"] < 1e-12


def test_symbolic_k3_is_convex_and_the_lambert_roots_solve_it():
    d1, d2 = symbolic.k3_derivatives()
    assert sp.simplify(d1 - (1 - 1 / symbolic.w)) == 0
    assert sp.simplify(d2 - 1 / symbolic.w**2) == 0
    assert symbolic.lambert_roots_solve_k3(0) == 0
    assert symbolic.lambert_roots_solve_k3(-1) == 0


def test_symbolic_series_shows_the_asymmetry_at_leading_order():
    lo, hi = symbolic.range_series(4)
    s = symbolic.s
    gap = sp.expand((hi - 1) - (1 - lo))
    assert sp.simplify(gap.coeff(s, 2) - sp.Rational(4, 3)) == 0  # (u-1) - (1-l) = 4/3 delta + O(delta^2)
    assert gap.coeff(s, 1) == 0
    for d in (1e-4, 1e-3):  # and the series agrees with the numerical range
        l_num, u_num = at.kl3_clip_range(d)
        assert float(hi.subs(s, math.sqrt(d))) == pytest.approx(u_num, abs=10 * d**2.5)
        assert float(lo.subs(s, math.sqrt(d))) == pytest.approx(l_num, abs=10 * d**2.5)


# ---------------------------------------------------------------- Thm 4.1
@pytest.mark.parametrize("event", ["X-", "X+"])
@pytest.mark.parametrize("delta", [0.02, 0.07, 0.2])
def test_thm41_logit_difference_holds_exactly_when_both_are_pure_clip(event, delta):
    th, tho, A = _with_event(1, delta, event)
    assert th.shape[0] > 10
    for eta in (0.5, 0.01):
        c = T.check_logit_difference(th, tho, A, delta, event, "pure-vs-pure", eta)
        assert float(c.abs_error().max()) < 1e-14 * max(1.0, eta * 10)
        assert float(c.exact.abs().max()) > 1e-4 * eta  # not a vacuous 0 = 0


@pytest.mark.parametrize("event", ["X-", "X+"])
@pytest.mark.parametrize("pairing", ["min-vs-min", "mixed"])
def test_thm41_fails_under_the_min_reading_and_the_corrected_indicator_holds(event, pairing):
    th, tho, A = _with_event(2, 0.07, event)
    c = T.check_logit_difference(th, tho, A, 0.07, event, pairing, 0.1)
    assert float(c.abs_error().max()) > 1e-3
    assert float(c.corrected_abs_error().max()) < 1e-14


# ---------------------------------------------------------------- Thm 4.2
@pytest.mark.parametrize("event", ["X-", "X+"])
@pytest.mark.parametrize("pairing", ["pure-vs-pure", "min-vs-min", "mixed"])
def test_thm42_entropy_difference_fails_as_stated_and_the_corrected_first_order_term_is_second_order_exact(
    event, pairing
):
    th, tho, A = _with_event(4, 0.07, event, n=600)
    errs = {}
    for eta in (2e-3, 1e-3):
        c = T.check_entropy_difference(th, tho, A, 0.07, event, pairing, eta)
        scale = float(c.exact.abs().max())
        errs[eta] = (float(c.abs_error().max()) / scale, float(c.corrected_abs_error().max()) / scale)
        # the paper's covariance misses by O(1) of the effect itself, at any eta
        assert errs[eta][0] > 0.3
        # ... and gets the sign wrong on some instances
        big = c.exact.abs() > 1e-2 * scale
        assert bool((torch.sign(c.predicted) != torch.sign(c.exact))[big].any())
        assert bool((torch.sign(c.corrected) == torch.sign(c.exact))[big].all())
    paper_ratio = errs[2e-3][0] / errs[1e-3][0]
    corrected_ratio = errs[2e-3][1] / errs[1e-3][1]
    assert paper_ratio < 1.2  # does not shrink with eta: not a first-order identity
    assert 1.7 < corrected_ratio < 2.3  # relative error O(eta): absolute O(eta^2)
    assert errs[1e-3][1] < 0.02


def test_thm42_counterexample_with_three_actions():
    """A concrete instance: the paper predicts a positive entropy difference, the exact one is negative."""
    delta, event = 0.07, "X-"
    lo, hi = at.kl3_clip_range(delta)
    found = None
    gen = torch.Generator().manual_seed(11)
    th, tho, A = T.random_instances(4000, 3, generator=gen)
    c = T.check_entropy_difference(th, tho, A, delta, event, "pure-vs-pure", 1e-3)
    ind = T.event_indicator(T.ratio(th, tho), delta, event).any(-1)[:, 0]
    flip = ind & (torch.sign(c.predicted[:, 0]) != torch.sign(c.exact[:, 0])) & (c.exact[:, 0].abs() > 1e-6)
    assert bool(flip.any())
    found = int(torch.nonzero(flip)[0])
    assert torch.sign(c.corrected[found, 0]) == torch.sign(c.exact[found, 0])


# ---------------------------------------------------------------- the report
def test_verify_theorems_quick_report_is_complete_and_reproducible(tmp_path):
    from sims import verify_theorems as mod

    mod.main(["--n", "150", "--out", str(tmp_path / "a")])
    mod.main(["--n", "150", "--out", str(tmp_path / "b")])
    a = (tmp_path / "a" / "theorem_report.json").read_text()
    assert a == (tmp_path / "b" / "theorem_report.json").read_text()
    report = json.loads(a)
    keys = {
        "id",
        "name",
        "statement",
        "holds_as_stated",
        "instances",
        "max_abs_error",
        "max_rel_error",
        "sign_agreement",
        "counterexample",
        "conditions",
        "corrected_statement",
        "corrected_holds",
    }
    for r in report:
        assert keys <= set(r)
        assert r["instances"] >= 150
        if not r["holds_as_stated"]:
            assert r["corrected_holds"] is True and r["counterexample"] is not None
    ids = " ".join(r["id"] for r in report)
    for word in ("entropy", "gradient-equivalence", "logit", "asymmetry"):
        assert word in ids
    held = {r["id"]: r["holds_as_stated"] for r in report}
    # three pairings of Thm 3.1, 4.1 and 4.2 each; Thm 3.1 holds as stated when both sides are read the same way
    for prefix in (
        "thm3.1-",
        *(
            f"thm4.{i}-{what}-{e}-"
            for i, what in ((1, "logit-difference"), (2, "entropy-difference"))
            for e in ("X-", "X+")
        ),
    ):
        assert sum(k.startswith(prefix) for k in held) >= 3, prefix
    assert held["thm3.1-gradient-equivalence-min-vs-min"] and held["thm3.1-gradient-equivalence-pure-vs-pure"]
    assert not held["thm3.1-gradient-equivalence-mixed"]
    assert held["thm4.1-logit-difference-X--pure-vs-pure"] and not held["thm4.1-logit-difference-X--min-vs-min"]
    assert held["thm3.2-equivalence-and-asymmetry"]
    assert not any(v for k, v in held.items() if k.startswith("thm4.2"))
    md = (tmp_path / "a" / "theorem_report.md").read_text()
    assert md.index("Findings") < md.index("All statements")
    # the report is the records, in order, with each record's own texts
    assert [r["id"] for r in report] == [t.id for t in T.THEOREMS]
    for r, thm in zip(report, T.THEOREMS):
        assert r["statement"] == thm.statement and r["conditions"] == thm.conditions
        assert r.get("pairing") == thm.pairing
        if thm.pairing is not None:
            assert T.pairing(thm.pairing).label in r["conditions"]


def test_every_theorem_record_names_a_tolerance_and_a_correction_where_it_can_fail():
    for thm in T.THEOREMS:
        assert thm.statement and thm.conditions and 0 < thm.tolerance < 1
        assert thm.corrected or thm.id.startswith("thm3.2")
