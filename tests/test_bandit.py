"""The bandit simulator: its surrogates against exact policy gradients and its dynamics."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import atr_theory as at
from atr_theory import bandit

torch.set_default_dtype(torch.float64)


def test_entropy_and_kl_match_numpy():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 2, 7, generator=g), torch.randn(3, 2, 7, generator=g)
    pa = np.exp(a.numpy()) / np.exp(a.numpy()).sum(-1, keepdims=True)
    pb = np.exp(b.numpy()) / np.exp(b.numpy()).sum(-1, keepdims=True)
    np.testing.assert_allclose(bandit.entropy(a).numpy(), -(pa * np.log(pa)).sum(-1), rtol=1e-12)
    np.testing.assert_allclose(bandit.kl_divergence(a, b).numpy(), (pa * np.log(pa / pb)).sum(-1), rtol=1e-12)


@pytest.mark.parametrize("method", ["atr", "clip", "clip_higher", "kl2", "is_kl3", "dual_clip", "sapo", "dcpo"])
def test_exact_surrogate_at_theta_old_gives_the_true_policy_gradient(method):
    g = torch.Generator().manual_seed(1)
    N, S, K = 4, 3, 9
    theta = torch.randn(N, S, K, generator=g)
    r = torch.rand(S, K, generator=g)
    th = theta.clone().requires_grad_(True)
    loss, _ = bandit.exact_surrogate(th, theta, bandit.exact_advantages(theta, r), method)
    (g_sur,) = torch.autograd.grad(-loss, th)
    th2 = theta.clone().requires_grad_(True)
    (g_true,) = torch.autograd.grad(bandit.expected_return(th2, r).sum(), th2)
    np.testing.assert_allclose(g_sur.numpy(), g_true.numpy(), rtol=1e-10, atol=1e-14)


def test_sampled_dr_grpo_gradient_is_unbiased_up_to_the_leave_in_baseline_factor():
    """E[(r_i - mean_G r) grad log pi(a_i)] = (G - 1)/G * grad J: checked by averaging 40,000 groups."""
    G, K, N = 4, 5, 40_000
    g = torch.Generator().manual_seed(2)
    theta1 = torch.randn(1, 1, K, generator=g)
    r = torch.rand(1, K, generator=g)
    theta = theta1.expand(N, 1, K).clone()
    probs = torch.softmax(theta, -1).reshape(N, K)
    actions = torch.multinomial(probs, G, replacement=True, generator=g).reshape(N, 1, G)
    rew = r.expand(N, 1, K).gather(-1, actions)
    adv = rew - rew.mean(-1, keepdim=True)
    th = theta.clone().requires_grad_(True)
    loss, _ = bandit.sampled_surrogate(th, theta, actions, adv, "atr")
    (gs,) = torch.autograd.grad(-loss, th)
    mean, se = gs.mean(0), gs.std(0) / math.sqrt(N)
    th1 = theta1.clone().requires_grad_(True)
    (g_true,) = torch.autograd.grad(bandit.expected_return(th1, r).sum(), th1)
    expected = (G - 1) / G * g_true[0]
    assert torch.all((mean - expected).abs() < 5 * se + 1e-12)


def test_training_is_reproducible_and_moves_the_ratio_so_clipping_acts():
    g = torch.Generator().manual_seed(3)
    theta0 = bandit.zipf_logits(4, 2, 50, generator=g)
    r = (torch.rand(2, 50, generator=g) < 0.1).double()
    runs = []
    for _ in range(2):
        _, h = bandit.train(
            r,
            theta0,
            "atr",
            iterations=5,
            inner_steps=4,
            lr=5.0,
            mode="sampled",
            group_size=8,
            generator=torch.Generator().manual_seed(7),
        )
        runs.append(h)
    for k in ("entropy", "return", "kl"):
        assert torch.equal(runs[0].as_tensors()[k], runs[1].as_tensors()[k])
    assert max(runs[0].frac_masked) > 0  # the constraint really masked tokens


def test_exact_training_increases_return():
    g = torch.Generator().manual_seed(4)
    theta0 = bandit.zipf_logits(3, 2, 20, generator=g)
    r = torch.rand(2, 20, generator=g)
    for method in ("atr", "clip", "clip_higher", "sapo"):
        _, h = bandit.train(r, theta0, method, iterations=10, inner_steps=3, lr=2.0)
        t = h.as_tensors()
        assert torch.all(t["return"][-1] > t["return"][0])


def test_a_real_vocabulary_size_works():
    K = 151_936
    g = torch.Generator().manual_seed(5)
    theta0 = bandit.zipf_logits(2, 1, K, generator=g)
    r = torch.zeros(1, K)
    r[0, :5] = 1.0
    theta, h = bandit.train(r, theta0, "atr", iterations=2, inner_steps=2, lr=50.0)
    t = h.as_tensors()
    assert torch.isfinite(theta).all() and torch.isfinite(t["entropy"]).all()
    assert torch.all(t["return"][-1] > t["return"][0])


def test_train_rejects_bad_modes():
    theta0 = torch.zeros(1, 1, 3)
    with pytest.raises(ValueError, match="mode"):
        bandit.train(torch.ones(1, 3), theta0, mode="nope")
    with pytest.raises(ValueError, match="advantage"):
        bandit.train(torch.ones(1, 3), theta0, advantage="nope")
    assert at.METHODS  # the simulator uses the registry


def test_train_with_adam_follows_kingma_and_bas_update():
    """bandit.train(optimizer="adam") against Adam's update written out (Kingma & Ba 2015, Alg. 1: bias-corrected
    moments, betas 0.9 / 0.999, eps 1e-8), applied to the same exact-mode surrogate gradients."""
    g = torch.Generator().manual_seed(0)
    theta0 = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    r = torch.rand(3, 6, generator=g, dtype=torch.float64)
    got, _ = bandit.train(r, theta0, "atr", iterations=3, inner_steps=2, lr=0.05, optimizer="adam")
    theta, m, v, t = theta0.clone(), torch.zeros_like(theta0), torch.zeros_like(theta0), 0
    for _ in range(3):
        theta_old = theta.clone()
        adv = bandit.exact_advantages(theta_old, r)
        for _ in range(2):
            th = theta.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(bandit.exact_surrogate(th, theta_old, adv, "atr")[0], th)
            t += 1
            m = 0.9 * m + 0.1 * grad
            v = 0.999 * v + 0.001 * grad * grad
            theta = theta - 0.05 * (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + 1e-8)
    torch.testing.assert_close(got, theta, rtol=1e-12, atol=1e-14)


def test_train_with_adam_records_ratio_quantiles_and_refuses_unknown_optimizers():
    theta0 = bandit.zipf_logits(2, 2, 20, generator=torch.Generator().manual_seed(0))
    r = torch.zeros(2, 20, dtype=torch.float64)
    r[:, :3] = 1.0
    _, h = bandit.train(
        r,
        theta0,
        "atr",
        iterations=3,
        inner_steps=2,
        lr=0.1,
        mode="sampled",
        optimizer="adam",
        generator=torch.Generator().manual_seed(1),
    )
    assert len(h.ratio_quantiles) == 6 and all(lo <= mid <= hi for lo, mid, hi in h.ratio_quantiles)
    assert h.ratio_quantiles[0] == (1.0, 1.0, 1.0)  # the first inner step is on-policy
    with pytest.raises(ValueError, match="optimizer must be 'sgd' or 'adam'"):
        bandit.train(r, theta0, "atr", iterations=1, optimizer="rmsprop")


# ----------------------------------------------------------------------------------------------
# closed-form exact gradient
# ----------------------------------------------------------------------------------------------
RATIO_MASK = [n for n in at.method_names(aliases=False) if at.METHODS[n].ratio_mask_gradient]


def test_the_declared_ratio_mask_methods_are_the_fifteen_rules_of_a_ratio_range_or_mask():
    assert sorted(RATIO_MASK) == sorted(
        [
            "clip",
            "clip_higher",
            "dual_clip",
            "dual_clip_higher",
            "dcpo",
            "trgppo",
            "atr",
            "kl1",
            "kl2",
            "is_kl3",
            "clip_cov",
            "atr_seq",
            "tr_ppo",
            "m2po",
            "bapo",
        ]
    )


def _random_logits(seed, N=3, S=4, K=9, spread=0.6):
    g = torch.Generator().manual_seed(seed)
    theta_old = torch.randn(N, S, K, generator=g, dtype=torch.float64)
    theta = theta_old + spread * torch.randn(N, S, K, generator=g, dtype=torch.float64)
    return theta, theta_old, torch.randn(N, S, K, generator=g, dtype=torch.float64)


def _autograd_gradient(theta, theta_old, adv, method, **kw):
    th = theta.clone().requires_grad_(True)
    loss, out = bandit.exact_surrogate(th, theta_old, adv, method, generator=torch.Generator().manual_seed(7), **kw)
    return torch.autograd.grad(loss, th)[0], out


@given(seed=st.integers(0, 10_000), spread=st.sampled_from([0.05, 0.6, 3.0]))
@settings(max_examples=15, deadline=None)
def test_closed_form_gradient_equals_autograd_for_every_ratio_mask_method_and_form(seed, spread):
    theta, theta_old, adv = _random_logits(seed, spread=spread)
    for name in RATIO_MASK:
        for form in at.METHODS[name].forms:
            reference, _ = _autograd_gradient(theta, theta_old, adv, name, form=form)
            grad, _ = bandit.exact_gradient(
                theta, theta_old, adv, name, form=form, generator=torch.Generator().manual_seed(7)
            )
            torch.testing.assert_close(grad, reference, rtol=1e-10, atol=1e-14, msg=f"{name} {form}")


def test_the_closed_forms_premise_fails_for_every_method_outside_the_set():
    # c = -(1/S) pi A kept is wrong for the methods left out (a smooth gate, the sequence ratio, a penalty,
    # a rollback): the set is not smaller than it must be
    theta, theta_old, adv = _random_logits(3, spread=0.8)
    N, S, K = theta.shape
    for name in sorted(set(at.method_names(aliases=False)) - set(RATIO_MASK)):
        for form in at.METHODS[name].forms:
            wide = {"epsilon_low": 0.9, "epsilon_high": 9.0} if name == "gspo" else {}  # its defaults clip all here
            if name.startswith("dppo"):  # below its cap DPPO's gradient is kept * w A grad log pi: truncate
                wide = {"is_cap": 1.01}
            reference, out = _autograd_gradient(theta, theta_old, adv, name, form=form, **wide)
            pi = torch.softmax(theta, -1)
            c = -pi * adv * out.result.kept.reshape(N, S, K) / S
            premise = c - pi * c.sum(-1, keepdim=True)
            assert float((premise - reference).abs().max()) > 1e-4, (name, form)
        with pytest.raises(ValueError, match=name):
            bandit.exact_gradient(theta, theta_old, adv, name)


def test_full_distribution_methods_share_one_kl_per_state_as_the_expanded_distributions_do():
    # exact_surrogate passes each state's KL(pi_old || pi) as position_kl (O(K)); the oracle is policy_loss on
    # the (N*S, K, K) expanded full distributions, loss and gradient (truly_ppo's KL carries gradient)
    theta, theta_old, adv = _random_logits(5, spread=0.5)
    N, S, K = theta.shape
    for name, kw in (("tr_ppo", {"form": "mask"}), ("tr_ppo", {"form": "min"}), ("truly_ppo", {})):
        th = theta.clone().requires_grad_(True)
        loss, _ = bandit.exact_surrogate(th, theta_old, adv, name, delta=0.02, **kw)
        (grad,) = torch.autograd.grad(loss, th)
        th2 = theta.clone().requires_grad_(True)
        logp = torch.log_softmax(th2, -1).reshape(N * S, K)
        old = torch.log_softmax(theta_old, -1).reshape(N * S, K)
        out = at.policy_loss(
            logp,
            old,
            adv.reshape(N * S, K),
            torch.ones(N * S, K, dtype=torch.bool),
            method=name,
            aggregation="seq_mean_token_sum",
            token_weights=old.exp(),
            full_logp=logp.unsqueeze(1).expand(N * S, K, K),
            old_full_logp=old.unsqueeze(1).expand(N * S, K, K),
            delta=0.02,
            **kw,
        )
        (grad2,) = torch.autograd.grad(out.loss * N, th2)
        torch.testing.assert_close(loss, out.loss * N, rtol=1e-12, atol=0)
        torch.testing.assert_close(grad, grad2, rtol=1e-10, atol=1e-15)
        assert bool((~out.result.kept | out.result.clipped_high).any())  # the KL gate (or rollback) acts here


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_with_the_closed_form_follows_autograd(optimizer):
    g = torch.Generator().manual_seed(0)
    theta0 = bandit.zipf_logits(4, 3, 50, generator=g)
    rewards = torch.rand(3, 50, generator=g, dtype=torch.float64)
    lr = 0.3 if optimizer == "adam" else 40.0
    runs = {
        grad: bandit.train(
            rewards, theta0, "atr", iterations=6, inner_steps=3, lr=lr, optimizer=optimizer, gradient=grad
        )
        for grad in ("autograd", "closed_form", "auto")
    }
    reference, hist = runs["autograd"]
    assert max(hist.frac_masked) > 0.01  # the trust region acts along the way
    for grad in ("closed_form", "auto"):
        torch.testing.assert_close(runs[grad][0], reference, rtol=0, atol=1e-11)
    with pytest.raises(ValueError, match="sapo"):
        bandit.train(rewards, theta0, "sapo", iterations=1, gradient="closed_form")
    with pytest.raises(ValueError, match="sampled"):
        bandit.train(rewards, theta0, "atr", iterations=1, mode="sampled", gradient="closed_form")
    with pytest.raises(ValueError, match="'fast'"):
        bandit.train(rewards, theta0, "atr", iterations=1, gradient="fast")


# the mask forms of dual_clip / dcpo trace since 2026-11-26 (their flags read result.flags(), not the cached .kept,
# whose lock dynamo refused); their min forms traced before
@pytest.mark.parametrize(
    "method, form",
    [("atr", None), ("trgppo", None), ("tr_ppo", None), ("dual_clip", "min"), ("dual_clip", "mask"), ("dcpo", "mask")],
)
def test_closed_form_gradient_compiles_into_one_graph(method, form):
    theta, theta_old, adv = _random_logits(11, K=33)
    kw = {} if form is None else {"form": form}
    compiled = torch.compile(
        lambda a, b, c: bandit.exact_gradient(a, b, c, method, validate=False, **kw)[0], fullgraph=True, backend="eager"
    )
    reference, _ = _autograd_gradient(theta, theta_old, adv, method, **kw)
    torch.testing.assert_close(compiled(theta, theta_old, adv), reference, rtol=1e-10, atol=1e-15)
