"""policy_loss: values and gradients against independently written objectives, autograd and
finite differences; robustness; the registry."""

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import atr_theory as at
from tests.rule_inputs import rule_inputs

torch.set_default_dtype(torch.float64)

METHODS_MD = [
    "clip",
    "clip_higher",
    "dual_clip",
    "dcpo",
    "clip_cov",
    "kl_cov",
    "sapo",
    "trgppo",
    "tr_ppo",
    "truly_ppo",
    "kl1",
    "kl2",
    "atr",
    "kl3",
    "is_kl3",
    "gspo",
    "atr_seq",
]


def _batch(seed: int, B: int = 3, T: int = 6, scale: float = 0.6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 4 - 0.05
    logp = (old + scale * torch.randn(B, T, generator=g)).clamp(max=0.0).requires_grad_(True)
    adv = torch.randn(B, generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    return logp, old, adv, mask


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
    logp = torch.log(w).requires_grad_(True)
    adv = torch.tensor([-2.0], dtype=torch.float64)
    mask = torch.ones_like(w, dtype=torch.bool)
    out = at.policy_loss(
        logp, torch.zeros_like(w), adv, mask, method="dual_clip", dual_clip_c=1.125, form=form, aggregation="token_mean"
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
        old[0, :2] = 0.0  # so that log w = logp exactly
        logp[0, :2] = torch.log(torch.tensor([0.75, 1.25], dtype=torch.float64))
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


# --------------------------------------------------------------------------------------------
# the registry and bad input
# --------------------------------------------------------------------------------------------
def test_every_method_of_methods_md_is_registered_with_its_defaults():
    for name in METHODS_MD:
        assert name in at.METHODS
    assert at.METHODS["kl3"] is at.METHODS["atr"]
    assert at.METHODS["clip"].defaults == {"epsilon": 0.2}
    assert at.METHODS["clip_higher"].defaults == {"epsilon_low": 0.2, "epsilon_high": 0.28}
    assert at.METHODS["dual_clip"].defaults == {"epsilon": 0.2, "dual_clip_c": 3.0}
    assert at.METHODS["sapo"].defaults == {"tau_pos": 1.0, "tau_neg": 1.05}
    for name in ("atr", "kl1", "kl2", "is_kl3", "trgppo"):
        assert at.METHODS[name].defaults["delta"] == 0.07
    # every rule the paper lists with a range defaults to the form its source trains, PPO's min (METHODS.md's
    # "default form" column): PPO, DAPO, dual clip, DCPO, TRGPPO; ATR, KL1, KL2, IS-KL3 and TR-PPO (Table 3, Eq. 3)
    for name in ("clip", "clip_higher", "dual_clip", "dcpo", "clip_cov", "trgppo", "gspo"):
        assert at.METHODS[name].default_form == "min"
    for name in ("atr", "kl1", "kl2", "is_kl3", "tr_ppo"):
        assert at.METHODS[name].default_form == "min" and "mask" in at.METHODS[name].forms
    assert at.METHODS["atr_seq"].default_form == "mask"
    for spec in at.METHODS.values():
        assert spec.fn.__doc__ and spec.reference


def _bad(**kw):
    logp, old, adv, mask = _batch(0)
    args = dict(logp=logp, old_logp=old, advantages=adv, mask=mask)
    args.update(kw)
    return at.policy_loss(**args)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(delta=0.0), "delta must be a finite number > 0"),
        (dict(delta=-1.0), "delta"),
        (dict(delta=math.nan), "delta"),
        (dict(method="clip", epsilon=-0.1), "epsilon must be in"),
        (dict(method="clip_higher", epsilon_low=1.0), "epsilon_low must be in"),
        (dict(method="dual_clip", dual_clip_c=0.5), "dual_clip_c"),
        (dict(method="sapo", tau_pos=0.0), "tau_pos"),
        (  # the relation and every resolved value, whole
            dict(method="clip_cov", cov_lb=5.0, cov_ub=1.0),
            "^method 'clip_cov' needs cov_lb < cov_ub, got epsilon=0.2, cov_ratio=0.0002, cov_lb=5.0, cov_ub=1.0$",
        ),
        (dict(method="nope"), "unknown method 'nope'; known methods: atr, atr_seq"),
        (dict(aggregation="mean"), "unknown aggregation 'mean'; known: dr_grpo"),
        (dict(method="clip", delta=0.1), r"unknown parameter\(s\) \['delta'\] for method 'clip'"),
        (dict(method="sapo", form="mask"), "form 'mask' is not available for method 'sapo'"),
        (
            dict(method="tr_ppo"),
            "^method 'tr_ppo' needs the full distributions: pass old_full_logp and full_logp of shape \\(B, T, V\\), or their per-position KL as position_kl \\(B, T\\)$",
        ),
        (dict(method="tr_ppo", full_logp=torch.zeros(3, 6, 4)), "needs the full distributions"),  # one of two
        (dict(method="tr_ppo", old_full_logp=torch.zeros(3, 6, 4)), "needs the full distributions"),
        (
            dict(method="tr_ppo", old_full_logp=torch.zeros(3, 5, 4), full_logp=torch.zeros(3, 6, 4)),
            r"old_full_logp must have shape \(B, T, V\) with \(B, T\) = \(3, 6\), got \(3, 5, 4\)",
        ),
        (
            dict(method="tr_ppo", old_full_logp=torch.zeros(3, 6, 4), full_logp=torch.zeros(3, 6)),
            r"^full_logp must have shape \(B, T, V\) with \(B, T\) = \(3, 6\), got \(3, 6\)$",
        ),
        (dict(advantages=[1.0, 2.0, 3.0]), "advantages must be a torch.Tensor, got list"),
        (dict(logp=[[0.0] * 6] * 3), "^logp must be a torch.Tensor, got list$"),
        (dict(method="clip", epsilon=-0.1), r"epsilon must be in .*, got -0\.1 \(method 'clip'\)"),
        (dict(old_logp=torch.zeros(3, 5)), r"old_logp must have shape \(3, 6\)"),
        (dict(mask=torch.ones(2, 6)), "mask must have shape"),
        (dict(advantages=torch.zeros(4)), "advantages must have shape"),
        (dict(logp=torch.zeros(18)), r"logp must have shape \(B, T\)"),
        (dict(max_length=0), "max_length must be an integer >= T"),
        (dict(max_length=5), r"max_length must be an integer >= T = 6, got 5"),
        (
            dict(max_length=8, aggregation="token_mean"),
            "^max_length is used by aggregation 'dr_grpo' only, not by 'token_mean'; leave it None$",
        ),
        (dict(mask=torch.full((3, 6), 0.5)), "mask must be boolean or hold only 0 and 1, got the value 0.5"),
        (dict(mask=-torch.ones(3, 6)), "mask must be boolean or hold only 0 and 1, got the value -1"),
        (dict(mask=torch.full((3, 6), math.nan)), "mask must be boolean or hold only 0 and 1, got the value nan"),
        (  # the value named is the bad one, not the first padded 0 or valid 1 before it
            dict(mask=torch.tensor([[1.0, 0, 0, 0, 0, 0], [1, 1, 0.5, 0, 0, 0], [1, 1, 1, 1, 1, 1]])),
            "mask must be boolean or hold only 0 and 1, got the value 0.5",
        ),
        (dict(logp=torch.zeros(3, 6, dtype=torch.long)), "logp must be a floating-point tensor, got dtype torch.int64"),
        (dict(old_logp=torch.zeros(3, 6, dtype=torch.bool)), "old_logp must be a floating-point tensor"),
        (
            dict(logp=torch.zeros(0, 6), old_logp=torch.zeros(0, 6), mask=torch.ones(0, 6), advantages=torch.zeros(0)),
            "logp is empty",
        ),
        (dict(logp=torch.zeros(3, 0), old_logp=torch.zeros(3, 0), mask=torch.ones(3, 0)), "logp is empty"),
        (dict(method="tr_ppo", position_kl=torch.zeros(3, 5)), r"^position_kl must have shape \(3, 6\), got \(3, 5\)$"),
        (dict(method="truly_ppo", position_kl=[0.0]), "^position_kl must be a torch.Tensor, got list$"),
        # the messages whole (anchored): a search would also match them inside a garbled one
        (
            dict(token_weights=torch.full((3, 6), math.nan)),
            r"^token_weights has NaN at valid position \(0, 0\); values on valid tokens must be finite$",
        ),
        (
            dict(advantages=torch.tensor([0.0, math.inf, 1.0])),
            r"^advantages has \+inf at valid position \(1,\); values on valid tokens must be finite$",
        ),
        (  # finite as given, +inf once cast to the float32 loss
            dict(logp=torch.zeros(3, 6, dtype=torch.float32), advantages=torch.tensor([0.0, 1.0, 1e300])),
            r"^advantages cast to torch.float32 has \+inf at valid position \(2,\); ",
        ),
        (
            dict(method="tr_ppo", old_full_logp=torch.full((3, 6, 4), -math.inf), full_logp=torch.zeros(3, 6, 4)),
            r"^old_full_logp has -inf at every entry of valid position \(0, 0\); a distribution needs an entry of "
            r"probability > 0$",
        ),
        (dict(method="tr_ppo", full_logp=torch.zeros(3, 6, 4, dtype=torch.long)), "full_logp must be a floating"),
        (
            dict(entropies=torch.zeros(3, 6), top_entropy_quantile=0.5, behaviour_logp=torch.zeros(3, 6).to("meta")),
            "behaviour_logp is on meta, logp on cpu",
        ),
        (dict(delta="0.07"), "delta must be a real number, got str"),
        (dict(delta=True), "delta must be a real number, got bool"),
        (dict(delta=torch.tensor(0.07)), "delta must be a real number, got Tensor"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _bad(**kwargs)


@pytest.mark.parametrize("source", ["position_kl", "full distributions"])
def test_a_float32_kl_enters_a_float64_loss_as_its_exact_value(source):
    """Truly PPO's penalty ``alpha KL`` with a float32 KL (given as ``position_kl``, or computed from float32 full
    distributions) and float64 log-probs: the float32 KL values are upcast before the penalty is formed, so the loss
    equals the one given the same KL values in float64, bit for bit (a float32 product alpha KL would round)."""
    B, T, V = 3, 6, 5
    logp, old, adv, mask = (t.double() if t.is_floating_point() else t for t in _batch(0))
    mask = torch.ones_like(mask)  # all valid: no padding select to promote the KL on the way
    g = torch.Generator().manual_seed(1)
    ofl = torch.log_softmax(torch.randn(B, T, V, generator=g, dtype=torch.float32) * 3, -1)
    nfl = torch.log_softmax(torch.randn(B, T, V, generator=g, dtype=torch.float32) * 3, -1)
    kl32 = at.divergence.full_kl(ofl, nfl)
    kw = dict(method="truly_ppo", aggregation="token_mean")
    ref = at.policy_loss(logp, old, adv, mask, position_kl=kl32.double(), **kw).loss
    given = dict(position_kl=kl32) if source == "position_kl" else dict(old_full_logp=ofl, full_logp=nfl)
    out = at.policy_loss(logp, old, adv, mask, **given, **kw).loss
    assert out.dtype == torch.float64 and kl32.dtype == torch.float32
    assert out.item() == ref.item()


@pytest.mark.parametrize("method", ["atr", "clip", "trgppo", "gspo"])
def test_the_loss_is_computed_in_the_precision_of_logp(method):
    """A float64 old_logp (e.g. from another engine) does not promote a float32 loss: the result equals the one with
    old_logp rounded to float32 first, in float32."""
    logp, old, adv, mask = _batch(6, B=3, T=6)  # float64 (this module's default dtype)
    logp, adv = logp.detach().to(torch.float32).requires_grad_(True), adv.to(torch.float32)
    old64 = old.to(torch.float64) - 1e-9  # a value float32 cannot hold
    got = at.policy_loss(logp, old64, adv, mask, method=method)
    want = at.policy_loss(logp, old64.to(torch.float32), adv, mask, method=method)
    assert got.loss.dtype == torch.float32 and got.per_token.dtype == torch.float32
    torch.testing.assert_close(got.loss, want.loss, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8])
@pytest.mark.parametrize("method", ["atr", "clip", "gspo", "sapo"])
def test_a_numeric_0_1_mask_is_the_boolean_mask(dtype, method):
    """TRL passes its completion mask as integers, others as floats: any 0/1 mask equals the boolean one."""
    logp, old, adv, _ = _batch(4, B=3, T=6)
    lengths = torch.tensor([6, 3, 1])
    mask = torch.arange(6) < lengths[:, None]
    reference = at.policy_loss(logp, old, adv, mask, method=method)
    (g_ref,) = torch.autograd.grad(reference.loss, logp)
    got = at.policy_loss(logp, old, adv, mask.to(dtype), method=method)
    (g,) = torch.autograd.grad(got.loss, logp)
    torch.testing.assert_close(got.loss, reference.loss, rtol=0, atol=0)
    torch.testing.assert_close(g, g_ref, rtol=0, atol=0)


@pytest.mark.parametrize("value,kind", [(math.nan, "NaN"), (math.inf, r"\+inf"), (-math.inf, "-inf")])
@pytest.mark.parametrize("arg", ["logp", "old_logp"])
def test_non_finite_log_probs_on_valid_tokens_raise(value, kind, arg):
    logp, old, adv, mask = _batch(0)
    t = (logp if arg == "logp" else old).detach().clone()
    t[1, 2] = value
    with pytest.raises(ValueError, match=rf"{arg} has {kind} at valid position \(1, 2\)"):
        _bad(**{arg: t})


# --------------------------------------------------------------------------------------------
# NaN / +-inf in every tensor argument: refused on a valid position (naming the argument, the kind and the
# position), ignored on a padded one; each argument with the method or layer that reads it
# --------------------------------------------------------------------------------------------
_B, _T, _V = 3, 6, 5


def _full_distributions(g):
    old_full = torch.log_softmax(torch.randn(_B, _T, _V, generator=g), -1)
    return old_full, torch.log_softmax(old_full + 0.3 * torch.randn(_B, _T, _V, generator=g), -1)


# argument -> (its finite value, the options of the call that reads it); the value is a function of a generator
_READERS = {
    "logp": (lambda g, b: b[0].detach(), {}),
    "old_logp": (lambda g, b: b[1], {}),
    "advantages": (lambda g, b: torch.randn(_B, generator=g), {}),  # (B,): its position is (b,)
    "advantages (B, T)": (lambda g, b: torch.randn(_B, _T, generator=g), {}),
    "token_weights": (lambda g, b: torch.rand(_B, _T, generator=g) + 0.5, {}),
    "behaviour_logp": (lambda g, b: b[1] - 0.05, dict(rollout_correction=at.RolloutCorrection("token", "truncate"))),
    "behaviour_logp, sequence mask": (
        lambda g, b: b[1] - 0.05,
        dict(sequence_mask=at.SequenceMask("k3", "mean", 0.5, "all")),
    ),
    "old_full_logp": (lambda g, b: _full_distributions(g)[0], dict(method="tr_ppo")),
    "full_logp": (lambda g, b: _full_distributions(g)[1], dict(method="tr_ppo")),
    "position_kl": (lambda g, b: torch.rand(_B, _T, generator=g) * 0.1, dict(method="truly_ppo")),
    "entropies": (lambda g, b: torch.rand(_B, _T, generator=g) * 3, dict(top_entropy_quantile=0.5)),
}
_KINDS = {"NaN": math.nan, "+inf": math.inf, "-inf": -math.inf}


def _call_with(reader: str, value: torch.Tensor, mask: torch.Tensor, seed: int, **kw):
    """policy_loss with ``reader``'s argument set to ``value`` (the other tensors finite, from ``seed``)."""
    logp, old, adv, _ = _batch(seed, B=_B, T=_T)
    g = torch.Generator().manual_seed(seed + 1)
    name = reader.split(" ")[0].rstrip(",")
    args = dict(logp=logp.detach(), old_logp=old, advantages=adv, mask=mask)
    options = dict(_READERS[reader][1])
    if options.get("method") == "tr_ppo":  # both distributions, one of them replaced below
        args["old_full_logp"], args["full_logp"] = _full_distributions(g)
    if options.get("method") == "truly_ppo":
        args["position_kl"] = torch.rand(_B, _T, generator=g) * 0.1
    if "top_entropy_quantile" in options:
        args["entropies"] = torch.rand(_B, _T, generator=g) * 3
    args[name] = value
    return at.policy_loss(**args, **options, **kw)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), data=st.data())
@pytest.mark.parametrize("kind", sorted(_KINDS))
@pytest.mark.parametrize("reader", sorted(_READERS))
def test_a_non_finite_value_is_refused_at_a_valid_position_and_ignored_at_a_padded_one(reader, kind, seed, data):
    """A NaN / +inf / -inf put at one random position of a random mask: valid -> ValueError naming the argument,
    the kind and that position, except -inf in a full distribution (a vocabulary entry of probability 0), which is
    taken; padded -> the same loss and per-token values as the finite batch; ``validate=False`` reads nothing."""
    name = reader.split(" ")[0].rstrip(",")
    g = torch.Generator().manual_seed(seed)
    clean = _READERS[reader][0](g, _batch(seed, B=_B, T=_T))
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=_B * _T, max_size=_B * _T))).reshape(_B, _T)
    pos = tuple(data.draw(st.integers(0, n - 1)) for n in clean.shape)
    valid = data.draw(st.booleans(), label="valid")
    if clean.ndim == 1:  # (B,) advantages: position (b,) is valid where sequence b has a valid token
        mask[pos[0]] = False
        if valid:
            mask[pos[0], data.draw(st.integers(0, _T - 1))] = True
    else:
        mask[pos[:2]] = valid
    dirty = clean.clone()
    dirty[pos] = _KINDS[kind]
    if valid and not (kind == "-inf" and name in ("old_full_logp", "full_logp")):
        where = ", ".join(map(str, pos)) + ("," if len(pos) == 1 else "")
        with pytest.raises(ValueError, match=rf"^{name} has {re.escape(kind)} at valid position \({where}\); "):
            _call_with(reader, dirty, mask, seed)
        _call_with(reader, dirty, mask, seed, validate=False)  # nothing value-dependent is checked
        return
    want = _call_with(reader, clean, mask, seed)
    got = _call_with(reader, dirty, mask, seed)
    if valid:  # -inf in a full distribution: a probability 0, taken (TR-PPO's gate reads a KL, +inf at most)
        assert torch.isfinite(got.loss)
        return
    assert torch.equal(got.loss, want.loss) and torch.equal(got.per_token, want.per_token)


@pytest.mark.parametrize("kl_source", ["full distributions", "position_kl"])
def test_the_detailed_scan_passes_over_padding_and_a_full_distributions_minus_inf(kl_source):
    """Once one value starts the detailed scan (here the last argument scanned, entropies, NaN at (2, 1)), every
    argument scanned before it is read on valid positions only and by its own rule: garbage on padding and a -inf
    entry of a full distribution at a valid position (a probability 0) are passed over, the error names entropies."""
    logp, old, _, _ = _batch(5, B=_B, T=_T)
    g = torch.Generator().manual_seed(5)
    mask = torch.ones(_B, _T, dtype=torch.bool)
    mask[0, 4:] = False
    tensors = dict(
        logp=logp.detach().clone(),
        old_logp=old.clone(),
        advantages=torch.randn(_B, _T, generator=g),
        token_weights=torch.ones(_B, _T),
        behaviour_logp=old - 0.05,
        entropies=torch.rand(_B, _T, generator=g),
    )
    if kl_source == "position_kl":
        tensors["position_kl"] = torch.rand(_B, _T, generator=g)
    else:
        tensors["old_full_logp"], tensors["full_logp"] = _full_distributions(g)
        tensors["old_full_logp"][1, 2, 0] = tensors["full_logp"][1, 3, 4] = -math.inf
    for t in tensors.values():
        t[0, 4], t[0, 5] = math.nan, -math.inf
    tensors["entropies"][2, 1] = math.nan
    options = dict(method="tr_ppo", top_entropy_quantile=0.5, sequence_mask=at.SequenceMask("k3", "mean", 0.5, "all"))
    with pytest.raises(ValueError, match=r"^entropies has NaN at valid position \(2, 1\); "):
        at.policy_loss(mask=mask, **tensors, **options)


@pytest.mark.parametrize("reader", ["behaviour_logp", "old_full_logp", "full_logp", "position_kl", "entropies"])
def test_a_tensor_this_call_does_not_read_is_refused_naming_it(reader):
    """behaviour_logp without a layer that reads it, the full distributions beside position_kl, position_kl for a
    method that needs no KL, entropies with top_entropy_quantile = 1: refused, naming the argument (a user's option is
    honoured or refused, never dropped); without it the call computes."""
    logp, old, adv, mask = _batch(0, B=_B, T=_T)
    given = torch.zeros((_B, _T, _V) if reader.endswith("full_logp") else (_B, _T))
    options = dict(method="truly_ppo", position_kl=torch.zeros(_B, _T))
    if reader in ("position_kl", "behaviour_logp", "entropies"):
        options = dict(method="atr")
    at.policy_loss(logp, old, adv, mask, **options)
    with pytest.raises(ValueError, match=rf"^{reader} is given, but nothing in this call reads it"):
        at.policy_loss(logp, old, adv, mask, **{**options, reader: given})


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(max_length=math.inf), "^max_length must be an integer >= T = 6, got inf$"),
        (dict(max_length=math.nan), "^max_length must be an integer >= T = 6, got nan$"),
        (dict(max_length=8.5), "^max_length must be an integer >= T = 6, got 8.5$"),
        (dict(max_length=True), "^max_length must be an integer >= T = 6, got True$"),
        (dict(max_length="8"), "^max_length must be an integer >= T = 6, got '8'$"),
        (dict(max_length=torch.tensor(8)), "^max_length must be an integer >= T = 6, got tensor"),
        (dict(max_length=np.int64(5)), "^max_length must be an integer >= T = 6, got "),
        (dict(top_entropy_quantile=True), r"^top_entropy_quantile must be in \[0, 1\], got True \(a real number"),
        (dict(top_entropy_quantile=False), r"^top_entropy_quantile must be in \[0, 1\], got False"),
        (dict(top_entropy_quantile=math.nan), r"^top_entropy_quantile must be in \[0, 1\], got nan"),
        (dict(top_entropy_quantile=-0.1), r"^top_entropy_quantile must be in \[0, 1\], got -0.1"),
        (dict(top_entropy_quantile="0.5"), r"^top_entropy_quantile must be in \[0, 1\], got '0.5'"),
        (dict(kl_chunk_size=0), "^kl_chunk_size must be None or an integer >= 1, got 0$"),
        (dict(kl_chunk_size=-1), "^kl_chunk_size must be None or an integer >= 1, got -1$"),
        (dict(kl_chunk_size=2.5), "^kl_chunk_size must be None or an integer >= 1, got 2.5$"),
        (dict(kl_chunk_size=True), "^kl_chunk_size must be None or an integer >= 1, got True$"),
        (dict(kl_chunk_size=math.inf), "^kl_chunk_size must be None or an integer >= 1, got inf$"),
        (dict(kl_chunk_size="4"), "^kl_chunk_size must be None or an integer >= 1, got '4'$"),
        (dict(generator=0), "^generator must be None or a torch.Generator, got int$"),
        (
            dict(generator=np.random.default_rng(0)),
            "^generator must be None or a torch.Generator, got numpy.random._generator.Generator$",
        ),
    ],
)
@pytest.mark.parametrize("validate", [True, False])
def test_a_scalar_outside_its_domain_is_refused_naming_it_and_its_value(kwargs, match, validate):
    with pytest.raises(ValueError, match=match):
        _bad(**kwargs, validate=validate, entropies=torch.rand(3, 6))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(max_length=8),
        dict(max_length=8.0),  # an integral float, as a config may write it
        dict(max_length=np.int64(6)),
        dict(top_entropy_quantile=0),
        dict(top_entropy_quantile=np.float32(0.5)),
        dict(kl_chunk_size=1, method="tr_ppo"),
        dict(kl_chunk_size=4.0, method="tr_ppo"),
        dict(generator=torch.Generator().manual_seed(0), method="clip_cov"),
    ],
)
def test_a_scalar_inside_its_domain_is_taken(kwargs):
    read = {}
    if kwargs.get("method") == "tr_ppo":
        read = dict(old_full_logp=torch.zeros(3, 6, 4), full_logp=torch.zeros(3, 6, 4))
    if kwargs.get("top_entropy_quantile", 1) < 1:
        read["entropies"] = torch.rand(3, 6)
    assert torch.isfinite(_bad(**kwargs, **read).loss)


@pytest.mark.parametrize("dtype,expected", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32)])
@pytest.mark.parametrize("padded", [False, True])
def test_a_method_sees_every_tensor_in_the_losss_precision(dtype, expected, padded):
    """Half-precision log-probs: the method's batch holds float32 ``logp`` / ``old_logp`` / advantages / log-ratio,
    with or without padding (a batch without padding takes another branch of ``policy_loss``)."""
    seen = {}

    def probe(batch):
        seen.update({k: getattr(batch, k).dtype for k in ("logp", "old_logp", "advantages", "log_ratio")})
        return at.methods._no_clip(torch.exp(batch.log_ratio) * batch.advantages, batch)

    at.register("dtype_probe", params={}, default_form="none", forms=("none",), reference="a test")(probe)
    try:
        logp, old, adv, _ = _batch(0)
        mask = torch.ones(logp.shape, dtype=torch.bool)
        mask[:, -1] = not padded
        at.policy_loss(logp.detach().to(dtype), old.to(dtype), adv.float(), mask, method="dtype_probe")
    finally:
        at.unregister("dtype_probe")
    assert seen == dict.fromkeys(("logp", "old_logp", "advantages", "log_ratio"), expected)


def test_a_log_ratio_that_overflows_from_finite_log_probs_raises():
    """float32 log-probs of opposite signs near the float32 limit: each finite, their difference -inf."""
    logp, old, adv, mask = (t.float() for t in _batch(0))
    logp, old = logp.detach().clone(), old.clone()
    logp[0, 1], old[0, 1] = -3e38, 3e38
    with pytest.raises(ValueError, match=r"^log-ratio logp - old_logp overflows; log-probs must be finite and <= 0$"):
        at.policy_loss(logp, old, adv, mask)


def test_frac_ratio_moved_counts_tokens_whose_ratio_left_one_beyond_float_noise():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.5]], dtype=torch.float64))
    mask = torch.tensor([[True, True, True, False]])
    same = at.policy_loss(logp, logp + 1e-7, torch.ones(1), mask).metrics
    assert same["frac_ratio_moved"] == 0.0
    moved = at.policy_loss(
        logp, logp + torch.tensor([[0.0, 1e-3, -0.2, 5.0]], dtype=torch.float64), torch.ones(1), mask
    )
    assert moved.metrics["frac_ratio_moved"] == pytest.approx(2 / 3)  # the padded token does not count


@pytest.mark.parametrize(
    "method", [n for n in at.method_names(aliases=False) if not at.METHODS[n].needs_full_distributions]
)
def test_non_finite_values_on_padding_change_nothing(method):
    """policy_loss promises that padding is ignored: NaN / inf advantages, token weights and behaviour log-probs
    there must not reach the loss, the gradient or a method's token selection (GSPO's and GMPO's sequence means,
    Clip-/KL-Cov's covariance), nor the rollout correction's or the sequence mask's sequence statistics."""
    logp, old, adv, _ = _batch(3, B=4, T=7)
    adv_t = adv[:, None].expand(4, 7).clone()
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[:, 5:] = False
    weights = torch.ones(4, 7)
    behaviour = old + 0.05
    layers = dict(
        rollout_correction=at.RolloutCorrection("sequence", "truncate", 1.5),
        sequence_mask=at.SequenceMask("k3", "mean", 0.5, "all"),
    )
    kw = dict(method=method, generator=None)
    topk = rule_inputs(method, 4, 7)  # a rule that reads the top-K: NaN there on padding too
    dirty_topk = {k: torch.where(mask[..., None], v, math.nan) for k, v in topk.items()}

    def run(a, w, b=behaviour, topk=topk):
        lp = logp.detach().clone().requires_grad_(True)
        g = torch.Generator().manual_seed(0)
        kw_here = {**kw, **topk, "generator": g}
        out = at.policy_loss(lp, old, a, mask, token_weights=w, behaviour_logp=b, **layers, **kw_here)
        out.loss.backward()
        return out.loss.detach(), lp.grad, out.metrics

    clean = run(adv_t, weights)
    dirty_adv, dirty_w = adv_t.clone(), weights.clone()
    dirty_adv[:, 5:] = math.nan
    dirty_adv[0, 6] = math.inf
    dirty_w[:, 5:] = math.nan
    dirty_b = behaviour.clone()
    dirty_b[:, 5:] = math.nan
    dirty_b[1, 6] = -math.inf
    dirty = run(dirty_adv, dirty_w, dirty_b, dirty_topk)
    assert torch.isfinite(clean[0]) and torch.equal(clean[0], dirty[0])
    assert torch.equal(clean[1], dirty[1]) and bool(torch.isfinite(dirty[1]).all())
    assert clean[2] == dirty[2]


@pytest.mark.parametrize("padded", [False, True], ids=["all_valid", "padded"])
def test_float64_token_weights_enter_a_float32_loss_in_float32(padded):
    """The loss is computed in logp's precision (at least float32): float64 token weights are cast to it, on the
    padded path (where they pass through a select) as on the all-valid one, so loss and per-token values stay
    float32 and equal those given the same weights in float32."""
    logp, old, adv, mask = (t.detach().float() if t.is_floating_point() else t for t in _batch(4))
    if padded:
        mask[1, 4:] = False
    w64 = torch.rand(3, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64) + 0.5
    out64 = at.policy_loss(logp, old, adv, mask, token_weights=w64)
    out32 = at.policy_loss(logp, old, adv, mask, token_weights=w64.float())
    assert out64.loss.dtype == torch.float32 and out64.per_token.dtype == torch.float32
    assert torch.equal(out64.loss, out32.loss) and torch.equal(out64.per_token, out32.per_token)


def test_tensors_on_two_devices_are_refused_naming_them():
    logp, old, adv, mask = _batch(0)
    with pytest.raises(ValueError, match="advantages is on meta, logp on cpu"):
        at.policy_loss(logp, old, adv.to("meta"), mask)


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
    old = -torch.rand(16, 512, generator=g, dtype=torch.float64) * 3
    logp = old + 0.2 * torch.randn(16, 512, generator=g, dtype=torch.float64)
    mask = torch.rand(16, 512, generator=g) > 0.3
    out = at.policy_loss(logp, old, torch.randn(16, generator=g, dtype=torch.float64), mask, method="atr")
    w = torch.sort(torch.exp(logp - old)[mask]).values
    n = w.numel()
    for key, f in (("ratio_p05", 0.05), ("ratio_p50", 0.5), ("ratio_p95", 0.95)):
        assert out.metrics[key] == float(w[round(f * (n - 1))])


def test_a_chunk_size_nothing_reads_and_a_validate_that_is_not_a_bool_are_refused():
    logp, old, adv, mask = _batch(0, B=_B, T=_T)
    with pytest.raises(ValueError, match=r"^kl_chunk_size is given, but nothing in this call reads it"):
        at.policy_loss(logp, old, adv, mask, method="atr", kl_chunk_size=16)
    for bad in ("false", 0, None):
        with pytest.raises(ValueError, match=r"^validate must be True or False"):
            at.policy_loss(logp, old, adv, mask, method="atr", validate=bad)
