"""policy_loss: values and gradients against independently written objectives, autograd and
finite differences; robustness; the registry."""

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import atr_theory as at
from tests.loss_batches import log_prob_pair
from tests.loss_batches import token_batch as _batch
from tests.rule_inputs import rule_inputs

torch.set_default_dtype(torch.float64)


# --------------------------------------------------------------------------------------------
# the mask form (paper Eq. 5) against a hand-written constraint in numpy float64
# --------------------------------------------------------------------------------------------
NUMPY_CONSTRAINTS = {
    "atr": lambda w, d: w - 1 - np.log(w) <= d,
    "kl1": lambda w, d: -np.log(w) <= d,
    "kl2": lambda w, d: np.log(w) ** 2 / 2 <= d,
    "is_kl3": lambda w, d: 1 - w + w * np.log(w) <= d,
}


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(sorted(NUMPY_CONSTRAINTS)), st.floats(0.01, 0.5))
def test_mask_form_gradient_is_zero_outside_and_A_w_dlogpi_inside(seed, method, delta):
    logp, old, adv, mask = _batch(seed)
    w = np.exp((logp - old).detach().numpy())
    k = NUMPY_CONSTRAINTS[method](w, delta)
    margin = np.abs(w - 1 - np.log(w) - delta)  # stay away from the boundary for the FD check
    assume(margin.min() > 1e-6)
    out = at.policy_loss(logp, old, adv, mask, method=method, form="mask", delta=delta, aggregation="token_mean")
    (grad,) = torch.autograd.grad(out.loss, logp)
    n = mask.sum().item()
    expected = np.where(k, -adv.numpy()[:, None] * w / n, 0.0)
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-12, atol=1e-15)
    # the value: w A inside, the frozen w_old A = A outside
    np.testing.assert_allclose(
        out.per_token.detach().numpy(), np.where(k, w, 1.0) * adv.numpy()[:, None], rtol=1e-12, atol=1e-14
    )


@pytest.mark.parametrize(
    "method,params",
    [
        ("atr", {}),
        ("kl2", {}),
        ("is_kl3", {}),
        ("clip", {}),
        ("clip_higher", {}),
        ("dual_clip", {}),
        ("dcpo", {}),
        ("trgppo", {}),
        ("sapo", {}),
        ("gspo", {"epsilon_low": 0.2, "epsilon_high": 0.3}),
        ("atr_seq", {"delta": 0.3}),
        ("kl_cov", {"cov_ratio": 0.2}),
    ],
)
@pytest.mark.parametrize("form", [None, "min", "mask"])
def test_gradient_matches_central_finite_differences(method, params, form):
    spec = at.get_method(method)
    if form is not None and form not in spec.forms:
        pytest.skip(f"{method} has no {form} form")
    logp, old, adv, mask = _batch(7, scale=0.4)
    f = lambda lp: at.policy_loss(lp, old, adv, mask, method=method, form=form, **params).loss
    (grad,) = torch.autograd.grad(f(logp), logp)
    h = 1e-6
    fd = torch.zeros_like(grad)
    with torch.no_grad():
        for idx in np.ndindex(*logp.shape):
            e = torch.zeros_like(logp)
            e[idx] = h
            fd[idx] = (f(logp + e) - f(logp - e)) / (2 * h)
    np.testing.assert_allclose(grad.numpy(), fd.numpy(), rtol=1e-5, atol=1e-8)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.005, 1.0))
def test_atr_min_form_equals_clip_higher_with_kl3_epsilons(seed, delta):
    lo, hi = at.kl3_clip_range(delta)
    logp, old, adv, mask = _batch(seed)
    a = at.policy_loss(logp, old, adv, mask, method="atr", form="min", delta=delta)
    b = at.policy_loss(logp, old, adv, mask, method="clip_higher", epsilon_low=1 - lo, epsilon_high=hi - 1)
    (ga,) = torch.autograd.grad(a.loss, logp)
    (gb,) = torch.autograd.grad(b.loss, logp)
    assert a.loss.item() == pytest.approx(b.loss.item(), rel=1e-14, abs=1e-15)
    np.testing.assert_allclose(ga.numpy(), gb.numpy(), rtol=1e-13, atol=1e-16)


def test_min_form_value_is_ppo_objective_written_inline():
    logp, old, adv, mask = _batch(3, B=4, T=50, scale=0.5)
    eps_l, eps_h = 0.2, 0.28
    w = torch.exp(logp - old)
    A = adv[:, None]
    ref = -(torch.minimum(w * A, torch.clamp(w, 1 - eps_l, 1 + eps_h) * A)).sum() / (4 * 50)
    out = at.policy_loss(logp, old, adv, mask, method="clip_higher")
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-14)
    (g1,) = torch.autograd.grad(out.loss, logp)
    (g2,) = torch.autograd.grad(ref, logp)
    np.testing.assert_allclose(g1.numpy(), g2.numpy(), rtol=1e-13, atol=1e-16)


def test_sapo_gradient_at_w_equal_1_is_the_vanilla_policy_gradient():
    logp, _, adv, mask = _batch(11)
    old = logp.detach().clone()  # on-policy: w == 1
    out = at.policy_loss(logp, old, adv, mask, method="sapo", aggregation="token_mean")
    (g,) = torch.autograd.grad(out.loss, logp)
    vanilla = -(logp * adv[:, None]).sum() / mask.sum()  # REINFORCE surrogate, its gradient is -A / n
    (gv,) = torch.autograd.grad(vanilla, logp)
    np.testing.assert_allclose(g.numpy(), gv.numpy(), rtol=1e-14)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.floats(1.5, 10.0))
def test_dual_clip_caps_negative_advantage_loss_at_c_abs_A(seed, c):
    logp, old, adv, mask = _batch(seed, scale=3.0)  # large ratios
    out = at.policy_loss(logp, old, adv, mask, method="dual_clip", dual_clip_c=c)
    loss_tok = -out.per_token.detach()
    A = adv[:, None].expand_as(loss_tok)
    neg = A < 0
    assert torch.all(loss_tok[neg] <= c * A[neg].abs() + 1e-12)
    w = torch.exp(logp - old).detach()
    capped = neg & (w > c)
    np.testing.assert_allclose(loss_tok[capped].numpy(), (c * A[capped].abs()).numpy(), rtol=1e-14)
    (g,) = torch.autograd.grad(out.loss, logp)
    assert torch.all(g[capped] == 0)


def test_gspo_uses_the_sequence_geometric_ratio():
    logp, old, adv, mask = _batch(5, scale=0.01)
    mask[1, 4:] = False
    out = at.policy_loss(logp, old, adv, mask, method="gspo", aggregation="seq_mean_token_mean")
    (g,) = torch.autograd.grad(out.loss, logp)
    y = (logp - old).detach()
    for i in range(3):
        m = mask[i]
        s = math.exp(float(y[i][m].mean()))
        if 1 - 3e-4 <= s <= 1 + 4e-4:  # unclipped: d/dlogp_t of -s A / B = -s A / (|y| B)
            np.testing.assert_allclose(g[i][m].numpy(), -s * adv[i].item() / (m.sum().item() * 3), rtol=1e-10)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.01, 0.5))
def test_atr_seq_keeps_only_sequences_whose_gspo_ratio_is_inside_the_kl3_range(seed, delta):
    logp, old, adv, mask = _batch(seed, B=8, T=5, scale=0.5)
    out = at.policy_loss(logp, old, adv, mask, method="atr_seq", delta=delta)
    kept_seq = out.result.kept.all(-1)
    y = (logp - old).detach()
    s = torch.exp(y.mean(-1))
    lo, hi = at.kl3_clip_range(delta)
    assert torch.all((s[kept_seq] >= lo) & (s[kept_seq] <= hi))
    # and the kept ones are exactly those with mean k3 <= delta (independent float64 numpy)
    k3 = (np.exp(y.numpy()) - 1 - y.numpy()).mean(-1)
    np.testing.assert_array_equal(kept_seq.numpy(), k3 <= delta)


def test_tr_ppo_masks_positions_whose_full_kl_exceeds_delta():
    g = torch.Generator().manual_seed(0)
    B, T, V = 2, 7, 11
    old_logits = torch.randn(B, T, V, generator=g)
    new_logits = (old_logits + 0.6 * torch.randn(B, T, V, generator=g)).requires_grad_(True)
    tok = torch.randint(0, V, (B, T), generator=g)
    ofl, nfl = torch.log_softmax(old_logits, -1), torch.log_softmax(new_logits, -1)
    lp, olp = nfl.gather(-1, tok[..., None])[..., 0], ofl.gather(-1, tok[..., None])[..., 0]
    adv = torch.randn(B, generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    out = at.policy_loss(lp, olp, adv, mask, method="tr_ppo", form="mask", delta=0.1, old_full_logp=ofl, full_logp=nfl)
    po = np.exp(ofl.detach().numpy())
    kl = (po * (np.log(po) - nfl.detach().numpy())).sum(-1)
    np.testing.assert_array_equal(out.result.kept.numpy(), kl <= 0.1)
    assert 0 < out.metrics["frac_kept"] < 1


def test_full_kl_is_stable_and_chunking_does_not_change_it():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 5, 50, generator=g) * 30  # very peaked: many pi_old underflow to 0
    b = torch.randn(3, 5, 50, generator=g) * 30
    a[0, 0, :10] = -math.inf  # exact zeros of pi_old
    kl = at.full_kl(torch.log_softmax(a, -1), torch.log_softmax(b, -1))
    assert torch.isfinite(kl).all() and (kl >= 0).all()
    kl_chunked = at.full_kl(a, b, chunk_size=4)
    np.testing.assert_allclose(kl.numpy(), kl_chunked.numpy(), rtol=1e-12)
    # against mpmath-free float64 reference on moderate logits
    a2, b2 = a.clamp(-5, 5) / 10, b / 60
    pa = torch.softmax(a2, -1)
    ref = (pa * (torch.log(pa) - torch.log_softmax(b2, -1))).sum(-1)
    np.testing.assert_allclose(at.full_kl(a2, b2).numpy(), ref.numpy(), rtol=1e-10)
    msg = r"^old_full_logp and full_logp must have the same shape, got \(3, 5, 50\) and \(3, 4, 50\)$"
    with pytest.raises(ValueError, match=msg):
        at.full_kl(a, b[:, :4])
    # half-precision inputs are evaluated in float32 (their exact values upcast), not in their own precision
    a16, b16 = a2.to(torch.bfloat16), b2.to(torch.bfloat16)
    kl16 = at.full_kl(a16, b16)
    assert kl16.dtype == torch.float32 and torch.equal(kl16, at.full_kl(a16.float(), b16.float()))
    for shape, chunk in (((0, 50), None), ((2, 0, 50), 4)):  # no position: an empty KL, not range()'s error
        empty = at.full_kl(torch.zeros(shape), torch.zeros(shape), chunk_size=chunk)
        assert empty.shape == shape[:-1]


@pytest.mark.parametrize("method", ["truly_ppo", "tr_ppo"])
def test_policy_loss_honours_kl_chunk_size(method, monkeypatch):
    # kl_chunk_size bounds the (positions, V) temporaries of the full-distribution KL: the largest tensor autograd
    # saves is one chunk's, not the batch's (a kl_chunk_size dropped on its way to the method leaves the loss equal)
    B, T, V, chunk = 3, 8, 64, 2
    g = torch.Generator().manual_seed(0)
    old_full = torch.log_softmax(torch.randn(B, T, V, generator=g), -1)
    full = torch.log_softmax(old_full + 0.3 * torch.randn(B, T, V, generator=g), -1).requires_grad_(True)
    tokens = torch.randint(0, V, (B, T), generator=g)
    logp, old = full.gather(-1, tokens[..., None])[..., 0], old_full.gather(-1, tokens[..., None])[..., 0]
    adv, mask = torch.randn(B, 1, generator=g).expand(B, T), torch.ones(B, T, dtype=torch.bool)

    def largest_saved(**kw):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            loss = at.policy_loss(
                logp, old, adv, mask, method=method, old_full_logp=old_full, full_logp=full, **kw
            ).loss
        return max(sizes), loss

    seen = []  # the chunk size the KL is computed with (tr_ppo's KL carries no gradient: nothing saved to measure)
    from atr_theory.methods import full_distribution

    monkeypatch.setattr(
        full_distribution,
        "full_kl",
        lambda a, b, chunk_size=None: seen.append(chunk_size) or at.full_kl(a, b, chunk_size=chunk_size),
    )
    whole, loss = largest_saved()
    chunked, loss_chunked = largest_saved(kl_chunk_size=chunk)
    assert seen == [None, chunk]
    if method == "truly_ppo":  # its KL carries gradient: autograd keeps one chunk's (chunk, V) values, not (B T, V)
        assert whole >= B * T * V and chunked <= chunk * V
    assert torch.allclose(loss, loss_chunked, rtol=1e-12, atol=0)


def test_clip_cov_is_reproducible_with_a_generator_and_drops_the_right_count():
    logp, old, adv, mask = _batch(2, B=16, T=64, scale=0.1)
    kw = dict(method="clip_cov", cov_ratio=0.01, cov_lb=-10.0, cov_ub=10.0)
    a = at.policy_loss(logp, old, adv, mask, generator=torch.Generator().manual_seed(3), **kw)
    b = at.policy_loss(logp, old, adv, mask, generator=torch.Generator().manual_seed(3), **kw)
    c = at.policy_loss(logp, old, adv, mask, generator=torch.Generator().manual_seed(4), **kw)
    base = at.policy_loss(logp, old, adv, mask, method="clip")
    dropped_a = base.result.kept & ~a.result.kept
    assert torch.equal(dropped_a, base.result.kept & ~b.result.kept)
    assert not torch.equal(dropped_a, base.result.kept & ~c.result.kept)
    assert int(dropped_a.sum()) == int(0.01 * 16 * 64)
    (g,) = torch.autograd.grad(a.loss, logp)
    assert torch.all(g[dropped_a] == 0)


def test_a_lone_valid_token_has_zero_centred_covariance_and_keeps_its_gradient():
    """The centred covariance of one valid token is 0 by definition (it is its own mean), outside Clip-Cov's
    (cov_lb, cov_ub) = (1, 5), so it is never dropped, although A log pi = 8 alone would lie inside; padding around
    it holds values that would matter if they were counted."""
    logp = torch.tensor([[-2.0, -7.0, -9.0], [-3.0, -1.0, -5.0]], dtype=torch.float64, requires_grad=True)
    old = logp.detach().clone()
    adv = torch.tensor([[-4.0, 30.0, -30.0], [25.0, 25.0, 25.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False, False], [False, False, False]])
    out = at.policy_loss(logp, old, adv, mask, method="clip_cov", cov_ratio=1.0, aggregation="token_mean")
    (g,) = torch.autograd.grad(out.loss, logp)
    assert bool(out.result.kept[0, 0]) and g[0, 0].item() == 4.0  # d(-w A)/d log pi at w = 1


@pytest.mark.parametrize("form", ["mask", "min"])
def test_the_dual_clip_keeps_the_gradient_of_a_ratio_exactly_at_c(form):
    """A tie ``w = c`` (A < 0) is inside the dual clip's range, as ``w = l`` and ``w = u`` are inside PPO's clip
    (the min form's clamp passes the gradient at its ends): the token keeps ``d(-w A)/d log pi = -w A``; just above
    ``c`` the gradient is 0. ``c = 1.125`` lies inside ``1 + eps = 1.2`` so the mask form's kept tokens reach it
    (exp(log 1.125) = 1.125 exactly in float64)."""
    w = torch.tensor([[1.125, 1.125 * (1 + 1e-12)]], dtype=torch.float64)
    logp, old = log_prob_pair(torch.log(w))  # logp - old == log w exactly, both <= 0
    logp.requires_grad_(True)
    adv = torch.tensor([-2.0], dtype=torch.float64)
    mask = torch.ones_like(w, dtype=torch.bool)
    out = at.policy_loss(
        logp, old, adv, mask, method="dual_clip", dual_clip_c=1.125, form=form, aggregation="token_mean"
    )
    (g,) = torch.autograd.grad(out.loss, logp)
    assert g[0, 0].item() == pytest.approx(2.0 * 1.125 / 2, rel=1e-15) and g[0, 1].item() == 0.0
    assert out.result.kept.tolist() == [[True, False]] and out.result.clipped_high.tolist() == [[False, True]]


def test_the_min_form_of_a_half_precision_batch_is_ppos_objective():
    """A direct ``ratio_objective`` call with bfloat16 log-ratios and advantages (``policy_loss`` would promote them)
    takes the ``torch.where`` path of the bound selection: PPO's objective written out in bfloat16, bit for bit."""
    g = torch.Generator().manual_seed(0)
    y = (torch.randn(4, 50, generator=g) * 0.5).to(torch.bfloat16)
    adv = torch.randn(4, 1, generator=g).to(torch.bfloat16).expand(4, 50).clone()
    zeros = torch.zeros_like(y)
    batch = at.TokenBatch(y, adv, torch.ones_like(y, dtype=torch.bool), zeros, zeros, "min")
    res = at.ratio_objective(batch, 0.8, 1.2)
    w = torch.exp(y)
    assert torch.equal(res.objective, torch.minimum(w * adv, torch.clamp(w, 0.8, 1.2) * adv))


def test_clip_cov_in_the_mask_form_drops_only_tokens_its_clip_rule_keeps():
    """Mask-form Clip-Cov with every valid token a covariance candidate and cov_ratio = 1: the dropped tokens are
    exactly those the clip rule keeps, ``l <= w <= u`` (ties at both ends included: w = 0.75 and 1.25 exactly);
    a token clipped low is never also flagged clipped high."""
    logp, old, adv, mask = (t.double() if t.is_floating_point() else t for t in _batch(5, B=4, T=16, scale=0.4))
    with torch.no_grad():
        # log w = log 0.75 and log 1.25 exactly (log_prob_pair)
        logp[0, :2], old[0, :2] = log_prob_pair(torch.log(torch.tensor([0.75, 1.25], dtype=torch.float64)))
    assert torch.exp(logp - old)[0, :2].tolist() == [0.75, 1.25]
    kw = dict(form="mask", epsilon=0.25)
    base = at.policy_loss(logp, old, adv, mask, method="clip", **kw).result
    out = at.policy_loss(logp, old, adv, mask, method="clip_cov", cov_ratio=1.0, cov_lb=-1e9, cov_ub=1e9, **kw).result
    w = torch.exp(logp - old).detach()
    in_range = (w >= 0.75) & (w <= 1.25)
    assert torch.equal(base.kept, in_range) and bool(in_range[0, :2].all())
    assert bool(base.clipped_low.any()) and bool(base.clipped_high.any())  # both sides are out of range somewhere
    assert torch.equal(out.kept, torch.zeros_like(in_range))  # every kept token was dropped
    assert torch.equal(out.clipped_high, base.clipped_high | in_range)
    assert torch.equal(out.clipped_low, base.clipped_low) and not bool((out.clipped_low & out.clipped_high).any())


def test_kl_cov_penalises_the_top_covariance_tokens():
    logp, old, adv, mask = _batch(4, B=8, T=25, scale=0.3)
    out = at.policy_loss(logp, old, adv, mask, method="kl_cov", cov_ratio=0.05, kl_coef=2.0)
    cov = (adv[:, None] - adv.mean()) * (logp.detach() - logp.detach().mean())
    top = torch.zeros(200, dtype=torch.bool)
    top[torch.argsort(cov.reshape(-1), descending=True)[:10]] = True
    pen = out.result.clipped_high.reshape(-1)
    assert torch.equal(pen, top)
    y = (logp - old).detach().reshape(-1)
    expected = torch.exp(y) * adv[:, None].expand(8, 25).reshape(-1) - 2.0 * y.abs() * top
    np.testing.assert_allclose(out.per_token.detach().reshape(-1).numpy(), expected.numpy(), rtol=1e-13)


# --------------------------------------------------------------------------------------------
# aggregations against loops
# --------------------------------------------------------------------------------------------
def test_aggregations_match_python_loops():
    g = torch.Generator().manual_seed(0)
    obj = torch.randn(4, 9, generator=g)
    mask = torch.rand(4, 9, generator=g) > 0.3
    mask[2] = False
    rows = [[obj[i, t].item() for t in range(9) if mask[i, t]] for i in range(4)]
    flat = [v for r in rows for v in r]
    assert at.aggregate(obj, mask, "dr_grpo", 16).item() == pytest.approx(sum(flat) / (4 * 16))
    assert at.aggregate(obj, mask, "token_mean").item() == pytest.approx(sum(flat) / len(flat))
    assert at.aggregate(obj, mask, "seq_mean_token_mean").item() == pytest.approx(
        sum(sum(r) / len(r) if r else 0.0 for r in rows) / 4
    )
    assert at.aggregate(obj, mask, "seq_mean_token_sum").item() == pytest.approx(sum(sum(r) for r in rows) / 4)


# --------------------------------------------------------------------------------------------
# robustness: finite values and gradients for every method and form
# --------------------------------------------------------------------------------------------
def _all_method_forms():
    for name in sorted(at.METHODS):
        for form in at.METHODS[name].forms:
            yield name, form


@pytest.mark.parametrize("name,form", list(_all_method_forms()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_method_is_finite_on_extreme_inputs(name, form, dtype):
    if name == "cfpo" and dtype == torch.float32:
        pytest.skip("cfpo's value overflows float32 there: test_cfpo_overflows_float32_only_where_its_value_does")
    B, T = 3, 8
    y = torch.linspace(-50, 50, B * T, dtype=dtype).reshape(B, T)
    old = torch.full((B, T), -1e4, dtype=dtype)
    old[0] = -0.5
    logp = (old + y).clamp(max=0.0).requires_grad_(True)
    adv = torch.tensor([3.0, -2.0, 0.0], dtype=dtype)
    extra = rule_inputs(name, B, T, dtype, scale=20)
    for mask in (torch.ones(B, T, dtype=torch.bool), torch.zeros(B, T, dtype=torch.bool)):
        out = at.policy_loss(logp, old, adv, mask, method=name, form=form, **extra)
        (g,) = torch.autograd.grad(out.loss, logp)
        assert torch.isfinite(out.loss) and torch.isfinite(g).all(), (name, form)
        assert all(math.isfinite(v) for v in out.metrics.values())
        if not mask.any():
            assert out.loss.item() == 0.0
    # a batch of one token
    one = at.policy_loss(
        logp[:1, :1],
        old[:1, :1],
        adv[:1],
        torch.ones(1, 1, dtype=torch.bool),
        method=name,
        form=form,
        **({k: v[:1, :1] for k, v in extra.items()}),
    )
    assert torch.isfinite(one.loss)


def test_cfpo_overflows_float32_only_where_its_value_does():
    """CFPO's penalty ``|A| (w - 1)^2 / (2 eps)`` is a quadratic in ``w``: at its defaults (eps 0.2) and ``|A| = 3`` it
    passes float32's largest number (3.4e38) at ``w`` about 6.7e18 (``log w`` about 43.4), inside the +-60 the loss
    clamps ``log w`` to. Below that the float32 loss and gradient are finite; above, the value is not representable
    (the proposing code overflows the same way) and float64 still holds it."""
    old = torch.full((1, 2), -60.0, dtype=torch.float32)
    adv = torch.tensor([3.0], dtype=torch.float32)
    for log_w, finite in ((43.0, True), (44.0, False)):
        logp = (old + log_w).requires_grad_(True)
        out = at.policy_loss(logp, old, adv, torch.ones(1, 2, dtype=torch.bool), method="cfpo")
        (g,) = torch.autograd.grad(out.loss, logp)
        assert bool(torch.isfinite(out.loss)) == finite and bool(torch.isfinite(g).all()) == finite, log_w
        wide = at.policy_loss(logp.detach().double(), old.double(), adv.double(), torch.ones(1, 2, dtype=torch.bool),
                              method="cfpo")
        assert torch.isfinite(wide.loss)


def test_padding_garbage_is_ignored():
    logp, old, adv, mask = _batch(0)
    mask[:, 4:] = False
    clean = at.policy_loss(logp, old, adv, mask)
    dirty_logp = logp.detach().clone()
    dirty_logp[:, 4:] = math.nan
    dirty_old = old.clone()
    dirty_old[:, 4:] = math.inf
    dirty = at.policy_loss(dirty_logp, dirty_old, adv, mask)
    assert dirty.loss.item() == pytest.approx(clean.loss.item(), rel=1e-15)


def test_metrics_report_fractions_and_quantiles():
    logp, old, adv, mask = _batch(9, B=8, T=32, scale=0.5)
    out = at.policy_loss(logp, old, adv, mask, method="atr", form="mask")  # the mask form: kept = k3 <= delta
    m = out.metrics
    w = torch.exp(logp - old).detach()
    k3 = w - 1 - torch.log(w)
    assert m["frac_kept"] == pytest.approx(float((k3 <= 0.07).double().mean()))
    assert m["frac_kept"] + m["frac_masked"] == pytest.approx(1.0)
    assert m["frac_clipped_low"] == pytest.approx(float(((k3 > 0.07) & (w < 1)).double().mean()))
    assert m["frac_clipped_high"] == pytest.approx(float(((k3 > 0.07) & (w > 1)).double().mean()))
    assert 0 < m["frac_clipped_low"] < m["frac_masked"] and 0 < m["frac_clipped_high"] < m["frac_masked"]
    assert m["mean_k3"] == pytest.approx(float(k3.mean()), rel=1e-12)
    assert m["ratio_p50"] == pytest.approx(float(w.median()), rel=0.05)
    assert m["ratio_min"] <= m["ratio_p05"] <= m["ratio_p50"] <= m["ratio_p95"] <= m["ratio_max"]


# ----------------------------------------------------------------------------------------------
# found by mutation testing (make mutation)
# ----------------------------------------------------------------------------------------------
def test_aggregate_defaults_max_length_to_the_number_of_columns():
    # Dr. GRPO divides by B * max_length; without max_length that is B * T (here B != T, so T cannot be confused)
    x = torch.arange(12.0).reshape(3, 4)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[0, 3] = False
    assert float(at.aggregate(x, mask, "dr_grpo")) == pytest.approx((x.sum() - x[0, 3]).item() / (3 * 4))


def test_gspo_on_a_one_token_sequence_is_token_level_clipping():
    # GSPO's sequence ratio is the mean log-ratio over valid tokens: with one valid token it is that token's ratio,
    # so GSPO (per-sequence advantage) and clip_higher with the same epsilons give the same loss and gradient
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -0.2, -3.0]], dtype=torch.float64)
    old = logp.detach() - torch.tensor([[0.3, 0.0, 0.0], [-0.01, 0.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    mask = torch.tensor([[True, False, False], [True, False, False]])
    eps = {"epsilon_low": 0.1, "epsilon_high": 0.2}
    results = []
    for method in ("gspo", "clip_higher"):
        leaf = logp.clone().requires_grad_(True)
        out = at.policy_loss(leaf, old, adv, mask, method=method, aggregation="seq_mean_token_mean", **eps)
        results.append((out.loss.detach(), torch.autograd.grad(out.loss, leaf)[0]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-14, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-14, atol=0)
    assert results[0][1][0, 0] == 0.0 and results[0][1][1, 0] != 0.0  # the first row is clipped, the second is not


@pytest.mark.parametrize("form", ["min", "mask"])
def test_float64_clip_bounds_are_not_rounded_to_float32(form):
    # 1 + eps = 1.2 in float64, but float32(1.2) = 1.20000005: a ratio between the two lies outside the float64 range
    # and must be frozen (zero gradient); a bound built in float32 would keep it
    w = torch.tensor([[1.2 + 2e-8, 1.2 - 2e-8]], dtype=torch.float64)
    assert float(torch.tensor(1.2, dtype=torch.float32)) > w[0, 0].item() > 1.2
    old = torch.full_like(w, -1.0)
    logp = (old + torch.log(w)).requires_grad_(True)
    out = at.policy_loss(logp, old, torch.ones_like(w), torch.ones_like(w, dtype=torch.bool), method="clip", form=form)
    out.loss.backward()
    assert logp.grad[0, 0] == 0.0 and logp.grad[0, 1] != 0.0


def test_ratio_objective_keeps_a_float_bound_in_the_batchs_dtype_beside_a_tensor_bound():
    # public ratio_objective with a per-token tensor lower bound and a Python-float upper bound (a user's own rule):
    # the float must become a float64 tensor for a float64 batch even under torch's float32 default (float32(1.2) =
    # 1.20000005 would keep w = 1.2 + 2e-8 unclipped in the min form)
    torch.set_default_dtype(torch.float32)  # restored after the test by conftest
    w = torch.tensor([[1.2 + 2e-8, 1.0]], dtype=torch.float64)
    y = torch.log(w).requires_grad_(True)
    zeros = torch.zeros_like(w)
    batch = at.TokenBatch(y, torch.ones_like(w), torch.ones_like(w, dtype=torch.bool), zeros, zeros, "min")
    res = at.ratio_objective(batch, torch.full_like(w, 0.8), 1.2)
    res.objective.sum().backward()
    assert res.objective.dtype == torch.float64
    assert res.objective[0, 0].item() == pytest.approx(1.2, abs=1e-15)  # clipped to float64 1.2 exactly
    assert y.grad[0, 0] == 0.0 and y.grad[0, 1] == 1.0


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from([torch.float32, torch.float64]),
    st.sampled_from(["floats", "tensors", "one bound by sign"]),
    st.sampled_from([math.inf, 1.5, 3.0]),
    st.sampled_from(["the ratio's", torch.float64, torch.float16, torch.bfloat16]),
)
def test_the_min_form_is_ppos_min_objective_and_the_dual_clip(seed, dtype, bounds, cap, adv_dtype):
    """``ratio_objective``'s min form (one clamp between bounds chosen by the sign of A) against PPO's objective written
    out, ``min(w A, clip(w, l, u) A)``, floored at ``c A`` for ``A < 0`` by the dual clip (``max(., c A)``): values bit
    for bit, gradients equal, ties ``w = l``, ``w = u`` included; the clip flags against their definitions. Advantages
    of another dtype than the ratio's (a direct call; ``policy_loss`` promotes both) take the ``torch.where`` path of
    the bound selection instead of the bit select."""
    g = torch.Generator().manual_seed(seed)
    shape = (6, 40)
    y = (torch.randn(shape, generator=g, dtype=torch.float64) * 0.6).to(dtype)
    adv_dtype = dtype if adv_dtype == "the ratio's" else adv_dtype
    adv = torch.randn(shape[0], 1, generator=g, dtype=torch.float64).to(adv_dtype).expand(shape).clone()
    adv[0], adv[1] = 0.0, -0.0
    adv[2:4], adv[4:] = adv[2:4].abs(), -adv[4:].abs()
    if bounds == "floats":
        lower, upper = 0.8, 1.28
        w_tie = torch.tensor([lower, upper], dtype=dtype)
    else:
        lower = (0.5 + 0.45 * torch.rand(shape, generator=g, dtype=torch.float64)).to(dtype)
        upper = (1.05 + torch.rand(shape, generator=g, dtype=torch.float64)).to(dtype)
        w_tie = torch.stack([lower[2, 0], upper[2, 0]])
    y[2, :2] = torch.log(w_tie)  # ties at the ends of a positive-advantage row's range (if exp(log) returns them)
    y[4, :2] = torch.log(w_tie)
    zeros = torch.zeros(shape, dtype=dtype)
    mask = torch.ones(shape, dtype=torch.bool)
    yy = y.clone().requires_grad_(True)
    batch = at.TokenBatch(yy, adv, mask, zeros, zeros, "min")
    if bounds == "one bound by sign":
        res = at.ratio_objective(batch, *(2 * (at.token_bounds.bound_by_sign(lower, upper, adv),)), negative_cap=cap)
    else:
        res = at.ratio_objective(batch, lower, upper, negative_cap=cap)
    (grad,) = torch.autograd.grad(res.objective.sum(), yy)
    # PPO written out, the way TRL and verl write it
    y_ref = y.clone().requires_grad_(True)
    w = torch.exp(y_ref)
    ppo = torch.minimum(w * adv, torch.clamp(w, lower, upper) * adv)
    ref = torch.where(adv < 0, torch.maximum(ppo, cap * adv.to(ppo.dtype)), ppo) if cap != math.inf else ppo
    (grad_ref,) = torch.autograd.grad(ref.sum(), y_ref)
    assert torch.equal(res.objective.detach(), ref.detach())
    torch.testing.assert_close(grad, grad_ref, rtol=0, atol=0)
    wd = w.detach()
    low = (wd < lower) & (adv < 0)
    high = ((wd > upper) & (adv > 0)) | ((wd > cap) & (adv < 0))
    assert torch.equal(res.clipped_low, low) and torch.equal(res.clipped_high, high)
    assert torch.equal(res.kept, ~(low | high))
    assert bool(low.any()) and bool(((wd > upper) & (adv > 0)).any())  # both sides clip: the comparison means something


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.5, 0.9, 1.0, 1.0 + 1e-12, 1.3, 2.0, float("inf")]) | st.floats(0, 10), min_size=1),
    st.lists(st.floats(0, 1), min_size=1, max_size=5),
    st.sampled_from(["auto", "partition", "kthvalue"]),
    st.sampled_from([torch.float64, torch.float32]),
)
def test_nearest_rank_quantiles_equal_the_sorted_tensor_at_the_rank(values, fractions, selection, dtype):
    """Selection (numpy.partition / torch.kthvalue) picks the value a full sort puts at rank round(f (n - 1)), ties
    and repeated fractions included -- the rule the metrics used before (``torch.sort`` then indexing)."""
    from atr_theory.loss import nearest_rank_quantiles

    t = torch.tensor(values, dtype=dtype)
    n = t.numel()
    ws = torch.sort(t).values
    want = [float(ws[min(n - 1, max(0, round(f * (n - 1))))]) for f in fractions]
    assert nearest_rank_quantiles(t, tuple(fractions), selection=selection) == want


def test_nearest_rank_quantiles_refuse_what_has_no_rank():
    from atr_theory.loss import nearest_rank_quantiles

    with pytest.raises(ValueError, match=r"non-empty 1-D tensor, got shape \(0,\)"):
        nearest_rank_quantiles(torch.zeros(0), (0.5,))
    with pytest.raises(ValueError, match=r"got shape \(2, 2\)"):
        nearest_rank_quantiles(torch.zeros(2, 2), (0.5,))
    with pytest.raises(ValueError, match="'sort'"):
        nearest_rank_quantiles(torch.zeros(3), (0.5,), selection="sort")


def test_metrics_quantiles_are_the_nearest_ranks_of_the_valid_ratios():
    """ratio_p05 / p50 / p95 of policy_loss's metrics on a batch large enough that a rank error would show."""
    g = torch.Generator().manual_seed(4)
    old = -torch.rand(16, 512, generator=g, dtype=torch.float64) * 3 - 1.5  # so that logp stays < 0 (7 sd)
    logp = old + 0.2 * torch.randn(16, 512, generator=g, dtype=torch.float64)
    mask = torch.rand(16, 512, generator=g) > 0.3
    out = at.policy_loss(logp, old, torch.randn(16, generator=g, dtype=torch.float64), mask, method="atr")
    w = torch.sort(torch.exp(logp - old)[mask]).values
    n = w.numel()
    for key, f in (("ratio_p05", 0.05), ("ratio_p50", 0.5), ("ratio_p95", 0.95)):
        assert out.metrics[key] == float(w[round(f * (n - 1))])
