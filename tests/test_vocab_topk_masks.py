"""DPPO with a top-K divergence (atr_theory.methods.vocab_topk_masks): pinned by TRL 1.8.0's own
``DPPOTrainer._compute_divergence_mask`` run on the same batch, by its two ends (K = 0 is the binary rule, K = V - 1
the full-vocabulary divergence), by the data-processing inequality between them, by a brute-force loop over each
position's explicit outcome sets, and by a hand-worked case."""

from __future__ import annotations

import ast
import math
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import atr_theory as at
from atr_theory.methods.divergence_masks import binary_kl, binary_tv
from atr_theory.methods.vocab_topk_masks import REST_FLOOR, topk_kl, topk_tv

ROOT = Path(__file__).resolve().parents[1]
D = torch.float64
RULES = {"dppo_topk_tv": "dppo_tv", "dppo_topk_kl": "dppo_kl"}


def _policies(seed: int, B: int = 4, T: int = 6, V: int = 9, spread: float = 0.4, dtype=D):
    """Old and new (B, T, V) log-probs, sampled tokens drawn from the old policy, the sampled tokens' log-probs,
    advantages of both signs and a padded mask."""
    g = torch.Generator().manual_seed(seed)
    old = torch.log_softmax(2.0 * torch.randn(B, T, V, generator=g, dtype=D), -1)
    new = torch.log_softmax(old + spread * torch.randn(B, T, V, generator=g, dtype=D), -1)
    tokens = torch.multinomial(old.exp().reshape(-1, V), 1, generator=g).reshape(B, T)
    adv = torch.randn(B, generator=g, dtype=D)
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]
    old, new = old.to(dtype), new.to(dtype)
    return (
        old,
        new,
        tokens,
        new.gather(-1, tokens[..., None])[..., 0],
        old.gather(-1, tokens[..., None])[..., 0],
        adv,
        mask,
    )


def _loss(method, k, old, new, tokens, lp, olp, adv, mask, **kw):
    o, n = at.topk_logps(old, new, tokens, k)
    return at.policy_loss(lp, olp, adv, mask, method=method, old_topk_logp=o, topk_logp=n, **kw)


# ---- the hand-worked case -----------------------------------------------------------------------------------------


def test_a_hand_worked_position():
    """p_old = (0.5, 0.3, 0.2), token 0 sampled, p = (0.6, 0.1, 0.3). K = 1 (token 1 the other; the rest 0.2 -> 0.3):
    TV = (0.1 + 0.2 + 0.1) / 2 = 0.2, KL = 0.5 ln(5/6) + 0.3 ln 3 + 0.2 ln(2/3) = 0.157330. K = 0 (binary): TV = 0.1,
    KL = 0.5 ln(5/6) + 0.5 ln(5/4) = 0.020411. K = 2: the full TV 0.2 and KL 0.157330 (token 2 is the rest)."""
    old = torch.tensor([[[0.5, 0.3, 0.2]]], dtype=D).log()
    new = torch.tensor([[[0.6, 0.1, 0.3]]], dtype=D).log()
    tokens = torch.tensor([[0]])
    lp, olp = new[..., 0], old[..., 0]
    want = {0: (0.1, 0.020411), 1: (0.2, 0.157330), 2: (0.2, 0.157330)}
    for k, (tv, kl) in want.items():
        o, n = at.topk_logps(old, new, tokens, k)
        assert float(topk_tv(lp, olp, n, o)) == pytest.approx(tv, abs=1e-12), k
        assert float(topk_kl(lp, olp, n, o)) == pytest.approx(kl, abs=1e-6), k


# ---- the two ends -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_k_zero_is_the_binary_divergence_and_rule(seed):
    """K = 0: the divergences equal the binary ones (``binary_tv``, ``binary_kl``) and each rule's objective, gradient
    and flags equal dppo_tv's / dppo_kl's on the same batch, in both forms (bounds chosen so that tokens are dropped)."""
    old, new, tokens, lp, olp, adv, mask = _policies(seed, B=6, T=8, spread=1.0)
    o, n = at.topk_logps(old, new, tokens, 0)
    assert o.shape == (*lp.shape, 0)
    y = lp - olp
    torch.testing.assert_close(topk_tv(lp, olp, n, o), binary_tv(y, olp).abs(), rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(topk_kl(lp, olp, n, o), binary_kl(y, olp), rtol=1e-8, atol=1e-14)
    for topk_rule, binary_rule in RULES.items():
        for form in ("min", "mask"):
            params = dict(form=form, delta_low=0.01, delta_high=0.015, is_cap=1.5)
            leaf_a, leaf_b = lp.clone().requires_grad_(), lp.clone().requires_grad_()
            a = at.policy_loss(leaf_a, olp, adv, mask, method=topk_rule, old_topk_logp=o, topk_logp=n, **params)
            b = at.policy_loss(leaf_b, olp, adv, mask, method=binary_rule, **params)
            dropped = int((~b.result.kept & mask).sum())
            assert dropped > 0, "the bounds drop no token: the comparison would not see the mask"
            torch.testing.assert_close(a.loss, b.loss)
            (ga,), (gb,) = torch.autograd.grad(a.loss, leaf_a), torch.autograd.grad(b.loss, leaf_b)
            torch.testing.assert_close(ga, gb)
            for flag in ("kept", "clipped_low", "clipped_high"):
                assert torch.equal(getattr(a.result, flag) & mask, getattr(b.result, flag) & mask), (form, flag)


@pytest.mark.parametrize("seed", range(6))
def test_k_all_other_tokens_is_the_full_vocabulary_divergence(seed):
    """K = V - 1: the KL equals ``atr_theory.full_kl`` (KL(pi_old || pi) over the whole vocabulary) and the TV half the
    L1 distance of the two distributions, at every position (float64: 1e-12; float32: 1e-5)."""
    for dtype, tol in ((D, 1e-12), (torch.float32, 1e-5)):
        old, new, tokens, lp, olp, _, _ = _policies(seed, dtype=dtype)
        V = old.shape[-1]
        o, n = at.topk_logps(old, new, tokens, V - 1)
        full_tv = 0.5 * (old.double().exp() - new.double().exp()).abs().sum(-1)
        assert (topk_kl(lp, olp, n, o).double() - at.full_kl(old.double(), new.double())).abs().max() < tol
        assert (topk_tv(lp, olp, n, o).double() - full_tv).abs().max() < tol


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), V=st.integers(2, 12), spread=st.floats(0.01, 3.0))
def test_the_divergence_grows_with_k_from_the_binary_to_the_full_one(seed, V, spread):
    """Coarsening never increases a divergence (data processing): TV and KL are non-decreasing in K, from the binary
    value at K = 0 to the full-vocabulary value at K = V - 1."""
    old, new, tokens, lp, olp, _, _ = _policies(seed, B=2, T=3, V=V, spread=spread)
    for div in (topk_tv, topk_kl):
        values = [div(lp, olp, *reversed(at.topk_logps(old, new, tokens, k))) for k in range(V)]
        for k in range(V - 1):
            assert bool((values[k] <= values[k + 1] * (1 + 1e-9) + 1e-12).all()), (div.__name__, k)


# ---- brute force --------------------------------------------------------------------------------------------------


def _brute_force_divergences(old_p: list[float], new_p: list[float], sampled: int, k: int) -> tuple[float, float]:
    """One position, from the explicit outcome sets: the sampled token, the k other tokens of largest old probability
    (ties: the smaller id first, as any order gives the same sums), and everything else as one outcome."""
    others = sorted((i for i in range(len(old_p)) if i != sampled), key=lambda i: (-old_p[i], i))[:k]
    groups = [[sampled], *[[i] for i in others], [i for i in range(len(old_p)) if i != sampled and i not in others]]
    tv = kl = 0.0
    for group in groups:
        a, b = sum(old_p[i] for i in group), sum(new_p[i] for i in group)
        tv += abs(a - b) / 2
        if group is groups[-1]:
            a, b = max(a, REST_FLOOR), max(b, REST_FLOOR)
        kl += a * math.log(a / b) if a > 0 else 0.0
    return tv, kl


@pytest.mark.parametrize("k", [1, 2, 5])
def test_the_rules_drop_what_a_brute_force_over_each_position_drops(k):
    """Every position's TV and KL from its explicit outcome sets (a Python loop in float64), and the rule's kept
    tokens from DPPO's decision on them (min form: the side the advantage pushes towards; mask: either side)."""
    old, new, tokens, lp, olp, adv, mask = _policies(7, B=5, T=7, V=10, spread=0.6)
    B, T, V = old.shape
    want_tv, want_kl = torch.zeros(B, T, dtype=D), torch.zeros(B, T, dtype=D)
    for b in range(B):
        for t in range(T):
            tv, kl = _brute_force_divergences(old[b, t].exp().tolist(), new[b, t].exp().tolist(), int(tokens[b, t]), k)
            want_tv[b, t], want_kl[b, t] = tv, kl
    o, n = at.topk_logps(old, new, tokens, k)
    torch.testing.assert_close(topk_tv(lp, olp, n, o), want_tv, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(topk_kl(lp, olp, n, o), want_kl, rtol=1e-9, atol=1e-13)
    bound = 0.05
    for rule, divergence in (("dppo_topk_tv", want_tv), ("dppo_topk_kl", want_kl)):
        for form in ("min", "mask"):
            out = _loss(rule, k, old, new, tokens, lp, olp, adv, mask, form=form, delta_low=bound, delta_high=bound)
            rose, past = lp > olp, divergence > bound
            drop = past if form == "mask" else past & (rose == (adv[:, None] > 0))
            assert torch.equal(out.result.kept & mask, ~drop & mask), (rule, form)
            assert 0 < int((drop & mask).sum()) < int(mask.sum()), "a bound that keeps or drops everything"


def test_topk_other_tokens_are_the_most_likely_tokens_other_than_the_sampled_one():
    old, _, tokens, *_ = _policies(3, V=8)
    for k in range(8):
        ids, logp = at.topk_other_tokens(old, tokens, k)
        assert ids.shape == logp.shape == (*tokens.shape, k)
        assert not bool((ids == tokens[..., None]).any()), "the sampled token is among the others"
        torch.testing.assert_close(logp, old.gather(-1, ids))
        masked = old.scatter(-1, tokens[..., None], -math.inf)
        torch.testing.assert_close(logp, masked.topk(k, -1).values)


@pytest.mark.parametrize("k", [-1, 8, 2.0, True])
def test_a_k_outside_the_vocabulary_is_refused_naming_it(k):
    old, _, tokens, *_ = _policies(0, V=8)
    with pytest.raises(ValueError, match=r"k must be an integer in \[0, V - 1\] = \[0, 7\], got"):
        at.topk_other_tokens(old, tokens, k)


# ---- TRL 1.8.0's own function -------------------------------------------------------------------------------------

TRL_WITH_TOPK = "1.8.0"  # trl.experimental.dppo shipped topk_tv / topk_kl from 1.6.0 to 1.8.0 (gone in 1.9.0)


@pytest.fixture(scope="module")
def trl_divergence_mask(tmp_path_factory):
    """``DPPOTrainer._compute_divergence_mask`` as TRL 1.8.0's wheel ships it: the function's own source, compiled
    alone (it reads ``torch`` and three attributes of ``self``), from ``pip download --no-deps trl==1.8.0``."""
    cache = ROOT / ".peer-wheels"
    wheels = sorted(cache.glob(f"trl-{TRL_WITH_TOPK}-*.whl"))
    if not wheels:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            f"trl=={TRL_WITH_TOPK}",
            "-d",
            str(cache),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheels = sorted(cache.glob(f"trl-{TRL_WITH_TOPK}-*.whl"))
        assert wheels, (
            f"pip download of trl=={TRL_WITH_TOPK} failed (the package registry is needed): {res.stderr[-2000:]}"
        )
    with zipfile.ZipFile(wheels[0]) as whl:
        source = whl.read("trl/experimental/dppo/dppo_trainer.py").decode()
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "DPPOTrainer")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_compute_divergence_mask")
    namespace = {"torch": torch, "math": math}
    exec(compile(ast.Module([fn], []), f"trl-{TRL_WITH_TOPK}/dppo_trainer.py", "exec"), namespace)
    return namespace["_compute_divergence_mask"]


def _trl_topk_set(old, new, tokens, topk):
    """TRL's outcome set, built as its DPPOTrainer generation step builds it: the rollout's ``topk`` most likely
    tokens, the sampled token in place of the last when it is not among them; both policies' log-probs there."""
    ids = old.topk(topk, -1).indices
    missing = ~(ids == tokens[..., None]).any(-1)
    ids[..., -1] = torch.where(missing, tokens, ids[..., -1])
    return new.gather(-1, ids), old.gather(-1, ids)


@pytest.mark.parametrize("k", [0, 1, 4, 8])
@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_the_rules_keep_the_tokens_trls_dppo_trainer_keeps(trl_divergence_mask, kind, k):
    """On the same float32 batch, TRL 1.8.0's mask with ``divergence_topk = K + 1`` keeps exactly the tokens the rule
    keeps (min form, TRL's), tokens within 1e-5 of a bound aside (TRL sums in another order; none at these seeds)."""
    old, new, tokens, lp, olp, adv, mask = _policies(11, B=8, T=16, V=9, spread=0.5, dtype=torch.float32)
    delta = 0.04 if kind == "kl" else 0.1
    trl_self = SimpleNamespace(divergence_type=f"topk_{kind}", epsilon_low=delta, epsilon_high=delta)
    current, sampling = _trl_topk_set(old, new, tokens, k + 1)
    theirs = trl_divergence_mask(trl_self, lp, olp, adv[:, None], mask.float(), current, sampling).bool()
    out = _loss(f"dppo_topk_{kind}", k, old, new, tokens, lp, olp, adv, mask, delta_low=delta, delta_high=delta)
    o, n = at.topk_logps(old, new, tokens, k)
    divergence = (topk_kl if kind == "kl" else topk_tv)(lp, olp, n, o)
    near = (divergence - delta).abs() < 1e-5
    assert not bool((near & mask).any())
    assert torch.equal(theirs, out.result.kept & mask)
    assert 0 < int((~theirs & mask).sum()) < int(mask.sum()), "TRL keeps or drops every token: a weak comparison"


# ---- what policy_loss refuses -------------------------------------------------------------------------------------


def test_policy_loss_refuses_missing_unread_mismatched_and_nan_top_k():
    old, new, tokens, lp, olp, adv, mask = _policies(0)
    o, n = at.topk_logps(old, new, tokens, 3)
    with pytest.raises(ValueError, match="method 'dppo_topk_kl' reads the top-K: pass topk_logp"):
        at.policy_loss(lp, olp, adv, mask, method="dppo_topk_kl", old_topk_logp=o)
    with pytest.raises(ValueError, match="old_topk_logp is given, but nothing in this call reads it"):
        at.policy_loss(lp, olp, adv, mask, method="dppo_kl", old_topk_logp=o, topk_logp=n)
    with pytest.raises(ValueError, match=r"old_topk_logp and topk_logp must have one shape \(B, T, K\)"):
        at.policy_loss(lp, olp, adv, mask, method="dppo_topk_tv", old_topk_logp=o, topk_logp=n[..., :2])
    with pytest.raises(ValueError, match=r"topk_logp must have shape \(B, T, K\) with \(B, T\) = \(4, 6\)"):
        at.policy_loss(lp, olp, adv, mask, method="dppo_topk_tv", old_topk_logp=o, topk_logp=n[:, :2])
    b, t = map(int, torch.nonzero(mask)[-1])
    bad = n.clone()
    bad[b, t, 2] = math.nan
    with pytest.raises(ValueError, match=rf"topk_logp has NaN at valid position \({b}, {t}, 2\)"):
        at.policy_loss(lp, olp, adv, mask, method="dppo_topk_tv", old_topk_logp=o, topk_logp=bad)
    # -inf is a probability of 0: allowed, and NaN on padding is ignored
    zero = n.clone()
    zero[b, t, 2] = -math.inf
    pad = torch.nonzero(~mask)
    if len(pad):
        zero[tuple(pad[0])] = math.nan
    out = at.policy_loss(lp, olp, adv, mask, method="dppo_topk_kl", form="mask", old_topk_logp=o, topk_logp=zero)
    assert bool(torch.isfinite(out.loss))
    assert not bool(out.result.kept[b, t]), "an outcome the new policy gives probability 0 has an infinite KL"


@pytest.mark.parametrize("k", [1, 3, 8])
def test_where_every_other_token_scales_by_one_factor_the_divergence_is_the_binary_one(k):
    """The claim of sims/trust_regions.py's docstring: when the other tokens' probabilities all scale by the sampled
    token's complement ratio ``(1 - p') / (1 - p)``, TV and KL at any K equal the binary ones."""
    old, _, tokens, _, olp, _, _ = _policies(5, V=9)
    lp = olp + 0.7 * torch.randn(olp.shape, generator=torch.Generator().manual_seed(1), dtype=D)
    lp = lp.clamp(max=-1e-3)
    scale = torch.log(-torch.expm1(lp)) - torch.log(-torch.expm1(olp))
    new = (old + scale[..., None]).scatter(-1, tokens[..., None], lp[..., None])
    torch.testing.assert_close(new.exp().sum(-1), torch.ones_like(lp))
    o, n = at.topk_logps(old, new, tokens, k)
    torch.testing.assert_close(topk_tv(lp, olp, n, o), binary_tv(lp - olp, olp).abs(), rtol=1e-9, atol=1e-13)
    torch.testing.assert_close(topk_kl(lp, olp, n, o), binary_kl(lp - olp, olp), rtol=1e-7, atol=1e-13)
