"""The sync-free path of ``policy_loss`` (``validate=False``) and TRGPPO's float32 bound table.

* ``validate=False`` gives the same loss and gradient as the default path (padding garbage, extreme
  log-ratios, per-token advantages), and traces into one graph under ``torch.compile(fullgraph=True)``
  for every per-token method but clip_cov (whose draw reproduces verl's ``randperm`` of a data-dependent
  number of candidates).
* The table's TRGPPO bounds against the float64 Newton roots over every binade of float32 ``log p_old``,
  and against mpmath root finding of the binary KL at 50 digits.
"""

import math

import mpmath as mp
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mp_reference import binary_kl_roots, float32_log_p_grid

import atr_theory as at
from atr_theory import ranges, token_bounds
from tests.loss_batches import loss_batch
from tests.rule_inputs import rule_inputs

PER_TOKEN = [n for n in at.method_names(aliases=False) if not at.METHODS[n].needs_full_distributions]
COMPILABLE = [n for n in PER_TOKEN if n != "clip_cov"]


def _batch(seed, B=4, T=24, dtype=torch.float32, per_token=False, scale=0.5):
    """The shared batch with one log-ratio of 70 (beyond the clamp) and garbage on the padding."""
    logp, old, adv, mask = loss_batch(
        seed, B, T, old_spread=5.0, old_offset=1e-3, scale=scale, per_token=per_token, min_length=T // 3
    )
    logp[0, 0], old[0, 0] = -0.5, -70.5  # a log-ratio of 70, beyond the clamp (both log-probs < 0)
    mask[0, 0] = True
    # garbage on padding must change nothing, on either path
    logp = torch.where(mask, logp, torch.nan)
    old = torch.where(mask, old, -torch.inf)
    return logp.to(dtype), old.to(dtype), adv.to(dtype), mask


def _loss_and_grad(fn, logp, *rest):
    leaf = logp.clone().requires_grad_(True)
    loss = fn(leaf, *rest)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), torch.nan_to_num(grad)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10_000), st.sampled_from(PER_TOKEN), st.booleans(), st.sampled_from([torch.float32, torch.float64])
)
def test_unvalidated_path_equals_the_default_path(seed, method, per_token, dtype):
    logp, old, adv, mask = _batch(seed, dtype=dtype, per_token=per_token)
    gen = lambda: torch.Generator().manual_seed(seed)  # noqa: E731

    extra = rule_inputs(method, *logp.shape, dtype)

    def run(validate):
        return lambda lp, o, a, m: (
            at.policy_loss(
                lp, o, a, m, method=method, generator=at.rule_generator(method, gen()), validate=validate, **extra
            ).loss
        )

    l0, g0 = _loss_and_grad(run(True), logp, old, adv, mask)
    l1, g1 = _loss_and_grad(run(False), logp, old, adv, mask)
    torch.testing.assert_close(l1, l0, rtol=0, atol=0)
    torch.testing.assert_close(g1, g0, rtol=0, atol=0)


@pytest.mark.parametrize("method", COMPILABLE)
def test_every_per_token_method_compiles_into_one_graph(method):
    """dynamo with fullgraph=True raises on any graph break (a host read, a data-dependent branch or shape);
    the traced graph then gives the eager loss and gradient."""
    import torch._dynamo

    torch._dynamo.reset()
    logp, old, adv, mask = _batch(3, per_token=True)
    extra = rule_inputs(method, *logp.shape)

    def loss_fn(lp, o, a, m):
        return at.policy_loss(lp, o, a, m, method=method, validate=False, **extra).loss

    compiled = torch.compile(loss_fn, backend="eager", fullgraph=True)
    l0, g0 = _loss_and_grad(loss_fn, logp, old, adv, mask)
    l1, g1 = _loss_and_grad(compiled, logp, old, adv, mask)
    torch.testing.assert_close(l1, l0)
    torch.testing.assert_close(g1, g0)


def test_clip_cov_is_the_documented_exception_to_fullgraph():
    import torch._dynamo

    torch._dynamo.reset()
    logp, old, adv, mask = _batch(4)
    fn = torch.compile(
        lambda lp: at.policy_loss(lp, old, adv, mask, method="clip_cov", validate=False).loss,
        backend="eager",
        fullgraph=True,
    )
    with pytest.raises(Exception, match="(?i)unsupported|data-dependent|graph break"):
        fn(logp)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "method", [pytest.param(m, marks=pytest.mark.slow) if m == "trgppo" else m for m in COMPILABLE]
)  # trgppo's float64 Newton solver takes ~20 s to trace
def test_traced_flags_equal_the_eager_flags(method, dtype):
    """Under ``torch.compile`` the rules combine their masks with ``torch.where`` (``methods.mask_and`` and kin: Inductor's
    float64 ``&`` is slow), in eager with ``&``: the kept / clipped flags of every form agree exactly."""
    import torch._dynamo

    logp, old, adv, mask = _batch(7, dtype=dtype, per_token=True, scale=0.8)
    extra = rule_inputs(method, *logp.shape, dtype)
    for form in at.METHODS[method].forms:
        torch._dynamo.reset()

        def flags(lp, o, a, m, form=form):
            return at.policy_loss(lp, o, a, m, method=method, form=form, validate=False, **extra).result.flags()

        eager = flags(logp, old, adv, mask)
        traced = torch.compile(flags, backend="eager", fullgraph=True)(logp, old, adv, mask)
        never_clip = ("sapo", "gspo", "vespo", "reinforce", "dro", "kimi15", "pspo", "cfpo")
        assert any(f[mask].any() for f in eager[1:]) or method in never_clip, (
            method,
            form,
        )  # something clipped (sapo, vespo, reinforce, dro, kimi15, pspo, cfpo never clip)
        for e, t in zip(eager, traced):
            assert torch.equal(e[mask], t[mask]), (method, form)


def test_mask_helpers_compile_to_the_boolean_operators():
    """The compiled C++ kernels of ``methods.mask_and`` / ``_or`` / ``mask_and_not`` give ``&``, ``|``, ``& ~`` on every
    combination, for masks of float64 and float32 comparisons."""
    import torch._dynamo

    from atr_theory.methods import _ratio as methods

    def combine(x, y):
        a, b = x > 0, y > 0
        return methods.mask_and(a, b), methods._or(a, b), methods.mask_and_not(a, b)

    torch._dynamo.reset()
    compiled = torch.compile(combine, fullgraph=True)
    for dtype in (torch.float64, torch.float32):
        x = torch.tensor([1.0, 1.0, -1.0, -1.0] * 9, dtype=dtype)
        y = torch.tensor([1.0, -1.0, 1.0, -1.0] * 9, dtype=dtype)
        a, b = x > 0, y > 0
        for got, want in zip(compiled(x, y), (a & b, a | b, a & ~b)):
            assert torch.equal(got, want)


@pytest.mark.slow
def test_inductor_compiles_atr_and_trgppo_to_the_eager_values():
    """The real compiler (C++ kernels on CPU), not just the tracer."""
    import torch._dynamo

    for method in ("atr", "trgppo"):
        torch._dynamo.reset()
        logp, old, adv, mask = _batch(5)

        def loss_fn(lp, o, a, m, method=method):
            return at.policy_loss(lp, o, a, m, method=method, validate=False).loss

        l0, g0 = _loss_and_grad(loss_fn, logp, old, adv, mask)
        l1, g1 = _loss_and_grad(torch.compile(loss_fn, fullgraph=True), logp, old, adv, mask)
        torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(g1, g0, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------------------------
# TRGPPO's table against the float64 roots and mpmath
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("delta", [0.01, 0.07, 0.3, 2.0])
def test_trgppo_table_matches_the_float64_roots_in_every_binade(delta):
    u = float32_log_p_grid()
    lo, hi = token_bounds.trgppo_kl_range_table(u, delta)
    p = torch.exp(u.double()).clamp(min=1e-300)
    y_lo, y_hi = ranges.trgppo_kl_log_range_torch(p, delta)
    assert lo.dtype == hi.dtype == torch.float32
    assert float((lo.double() - torch.exp(y_lo)).abs().max()) < 1e-7
    # u_KL to float32 rounding: of log u_KL (2^-24 relative), of u = exp(.) (2^-24), interpolation (< 3e-8);
    # where u_KL is beyond float32, inf (w = pi / p_old can never reach it)
    finite = y_hi < math.log(torch.finfo(torch.float32).max) - 1e-3
    err = (torch.log(hi.double()) - y_hi)[finite].abs()
    assert bool((err <= 2.0**-23 * (1 + y_hi[finite].abs()) + 3e-8).all()), float(err.max())
    assert bool((hi[~finite] > 1e38).all())


@pytest.mark.parametrize("log_p", [-1e-6, -0.01, -0.3, -1.0, -2.5, -6.0, -15.0])
def test_trgppo_table_against_mpmath(log_p):
    delta = 0.07
    u = torch.tensor([log_p], dtype=torch.float32)
    p = float(torch.exp(u.double()))  # the float32 input, exactly
    y_lo, y_hi = (float(mp.log(w)) for w in binary_kl_roots(p, delta))
    lo, hi = token_bounds.trgppo_kl_range_table(u, delta)
    assert abs(float(lo) - math.exp(y_lo)) < 1e-7
    assert abs(math.log(float(hi)) - y_hi) <= 2.0**-23 * (1 + abs(y_hi)) + 3e-8


@pytest.mark.parametrize("seed", range(5))
def test_trgppo_float32_loss_equals_the_float64_solver_to_float32_precision(seed):
    logp, old, adv, mask = _batch(seed, dtype=torch.float32)
    l32, g32 = _loss_and_grad(lambda lp: at.policy_loss(lp, old, adv, mask, method="trgppo").loss, logp)
    l64, g64 = _loss_and_grad(
        lambda lp: at.policy_loss(lp, old.double(), adv.double(), mask, method="trgppo").loss, logp.double()
    )
    torch.testing.assert_close(l32.double(), l64, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g32.double(), g64, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_trgppo_float64_newton_solver_compiles_into_one_graph():
    """A float64 batch takes TRGPPO's bounds from the Newton solver, not the float32 table: under torch.compile that
    solver must read nothing on the host (``tracing``: a fixed number of steps, no input scan) to stay one graph."""
    import torch._dynamo

    torch._dynamo.reset()
    logp, old, adv, mask = _batch(5, dtype=torch.float64, per_token=True)

    def loss_fn(lp, o, a, m):
        return at.policy_loss(lp, o, a, m, method="trgppo", validate=False).loss

    compiled = torch.compile(loss_fn, backend="eager", fullgraph=True)
    l0, g0 = _loss_and_grad(loss_fn, logp, old, adv, mask)
    l1, g1 = _loss_and_grad(compiled, logp, old, adv, mask)
    torch.testing.assert_close(l1, l0, rtol=1e-12, atol=0)
    torch.testing.assert_close(g1, g0, rtol=1e-12, atol=0)
