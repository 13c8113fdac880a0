"""The registry's fast path equals each rule's plain reference form (``MethodSpec.reference_form``, written beside the
rule in its family module): the same per-token objective and the same gradient, both forms, random batches with
padding and per-sequence or per-token advantages; and the reference forms share no helper with the fast path."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import atr_theory as at
from atr_theory.methods import _reference
from tests.loss_batches import loss_batch
from tests.strategies import rule_params

REFERENCED = sorted(n for n, s in at.METHODS.items() if n == s.name and s.reference_form is not None)


def _batch(seed, B, T, per_token_advantages):
    return loss_batch(seed, B, T, per_token=per_token_advantages)


def _no_tie_at_top_k(logp, advantages, mask, cov_ratio):
    adv = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
    a, lp = adv[mask], logp[mask]
    cov = torch.sort((a - a.mean()) * (lp - lp.mean()), descending=True).values
    k = max(1, int(cov_ratio * int(mask.sum())))
    return k >= cov.numel() or bool(cov[k - 1] - cov[k] > 1e-12 * (1 + cov[k - 1].abs()))


def _objective_and_gradient(fn, logp, *rest):
    logp = logp.clone().requires_grad_()
    objective = fn(logp, *rest)
    (grad,) = torch.autograd.grad(objective.sum(), logp)
    return objective.detach(), grad


@pytest.mark.parametrize("method", REFERENCED)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_the_registry_equals_the_plain_reference_form(method, data):
    spec = at.METHODS[method]
    form = data.draw(st.sampled_from(spec.forms), label="form")
    params = data.draw(rule_params(spec), label="params")  # from each Param's domain (tests/strategies.py)
    seed, B, T = data.draw(st.integers(0, 10_000)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 12))
    per_token = data.draw(st.booleans()) and method != "gspo"
    logp, old_logp, advantages, mask = _batch(seed, B, T, per_token)
    if method == "kl_cov":  # a tie at the top-k boundary is decided by index order, which neither side defines
        assume(_no_tie_at_top_k(logp, advantages, mask, params["cov_ratio"]))
    if method == "dppo_kl":  # a new probability of exactly 1: a known difference, pinned on its own (below)
        assume(not bool((logp[mask] == 0).any()))
    form_kw = {"form": form} if form in ("min", "mask") else {}

    def fast(lp, old, adv, m):
        return at.policy_loss(lp, old, adv, m, method=method, form=form, **params).per_token

    def plain(lp, old, adv, m):
        return torch.where(m, spec.reference_form(lp, old, adv, m, **params, **form_kw), 0.0)

    got, got_grad = _objective_and_gradient(fast, logp, old_logp, advantages, mask)
    want, want_grad = _objective_and_gradient(plain, logp, old_logp, advantages, mask)
    rtol = 1e-10
    if method == "vespo":
        # VESPO's weight exp(lambda + k log W - lambda W) against W^k e^{lambda (1 - W)}: log W (a sum over tokens,
        # |log W| <= 20) carries ~eps |log W| of rounding, which the exponent multiplies by k + lambda W (W up to
        # e^20): that is the weight's relative error (8 eps: a few operations); a wrong k, lambda or sign moves it
        # by O(1)
        lam = max(params["vespo_lambda_pos"], params["vespo_lambda_neg"])
        k = max(params["vespo_k_pos"], params["vespo_k_neg"])
        rtol = 8 * np.finfo(np.float64).eps * (1 + 20 * (k + lam * np.exp(20.0)))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(got_grad.numpy(), want_grad.numpy(), rtol=rtol * 10, atol=1e-12)


def test_a_wrong_formula_fails_the_comparison():
    """The comparison can fail: ATR with the symmetric range [l, 2 - l] instead of Thm 3.2's is caught."""
    logp, old_logp, advantages, mask = _batch(0, 8, 64, False)
    lower, _ = at.kl3_clip_range(0.07)
    symmetric = at.METHODS["clip"].reference_form(logp, old_logp, advantages, mask, epsilon=1 - lower, form="mask")
    fast = at.policy_loss(logp, old_logp, advantages, mask, method="atr", delta=0.07).per_token
    assert not torch.allclose(torch.where(mask, symmetric, 0.0), fast)


def _globals_used(fn) -> dict[str, object]:
    """Every global name ``fn``'s code (nested functions included) reads, with what it is bound to."""
    from atr_theory.docs import global_names

    return {n: fn.__globals__[n] for n in global_names(fn) if n in fn.__globals__}


def test_the_reference_forms_share_no_helper_with_the_fast_path():
    """What a reference form calls is torch, math, another reference form, a helper of its own module written for
    reference forms only (``_*_reference``) or ``atr_theory.methods._reference``; and that module calls nothing of
    the package. So a fault in the fast path's helpers (``_ratio``, ``ranges``, the registry) cannot hide in both."""
    import math
    import types

    references = {s.reference_form for s in at.METHODS.values() if s.reference_form is not None}
    allowed_modules = {torch, math, _reference}
    seen, todo = set(), list(references)
    assert len(references) == len(REFERENCED) >= 18
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        for name, value in _globals_used(fn).items():
            if isinstance(value, types.ModuleType):
                assert value in allowed_modules, (fn.__qualname__, name)
            elif isinstance(value, types.FunctionType):
                own = value.__module__ == _reference.__name__ or value.__name__.endswith("_reference")
                assert own, (fn.__qualname__, name, value.__module__)
                todo.append(value)
    assert all(
        not isinstance(v, types.FunctionType) or v.__module__ == _reference.__name__
        for f in vars(_reference).values()
        if isinstance(f, types.FunctionType)
        for v in _globals_used(f).values()
    )


def test_dppo_kl_drops_a_token_whose_new_probability_is_one():
    """Where the new probability is exactly 1 (``logp = 0``) the binary KL is infinite (``log((1 - p_old) / 0)``), so
    DPPO-KL must drop a token whose probability rose there, whatever the bound. Found by the domain-derived parameters
    (``delta_high`` up to 1): the fast path once computed ``1 - p_new`` as ``1 - p_old e^y``, which rounds to ~1e-16
    instead of 0, and kept the token (KL ~0.59). It now takes ``-expm1(old_logp + y)``, exactly 0 here."""
    old_logp = torch.tensor([[-0.01660750892818718]], dtype=torch.float64)
    logp = torch.zeros_like(old_logp)  # p_new = 1
    advantages, mask = torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool)
    params = {"delta_low": 1.0, "delta_high": 1.0, "is_cap": 2.0}

    def fast(lp, old, adv, m):
        return at.policy_loss(lp, old, adv, m, method="dppo_kl", **params).per_token

    def plain(lp, old, adv, m):
        return at.METHODS["dppo_kl"].reference_form(lp, old, adv, m, form="min", **params)

    _, plain_grad = _objective_and_gradient(plain, logp, old_logp, advantages, mask)
    assert float(plain_grad) == 0.0  # the reference drops it: no gradient
    _, fast_grad = _objective_and_gradient(fast, logp, old_logp, advantages, mask)
    assert float(fast_grad) == 0.0  # kept before: gradient min(w, is_cap) A = 1.0167
