"""The bandit simulator: its surrogates against exact policy gradients and its dynamics."""

import math

import numpy as np
import pytest
import torch

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
