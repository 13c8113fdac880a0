"""M2PO, TOPR and Kimi k1.5 (``atr_theory.methods.weighted_off_policy``) against their peers' own code on the same
batches, and against cases worked by hand.

* M2PO: AReaL 1.0.4's own ``_apply_m2po_masking`` / ``_get_m2po_loss_mask`` and ``ppo_actor_loss_fn``, read from the
  installed ``areal`` distribution (``make install`` installs it with ``--no-deps``; importing ``areal`` would need
  its whole stack, so the functions' source is taken from the installed file and run with torch alone).
* TOPR and Kimi k1.5: ROLL's ``_compute_topr_loss`` / ``_compute_kimi15_loss``, copied in ``tests/roll_pg_variants.py``
  (ROLL is not on PyPI).

Where a peer differs by design, a test pins the difference: AReaL's tie at the cut, its token mean over the kept
tokens only, ROLL's split of TOPR by ``scores > 0`` instead of the advantage's sign, and Kimi k1.5's paper squaring
the whole response's log-ratio.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from roll_pg_variants import roll_kimi15_loss, roll_topr_loss

import atr_theory as at
from atr_theory.methods.weighted_off_policy import m2po_keep

AREAL_VERSION = "1.0.4"
# ROLL's metrics (not its loss) take a std over one sequence's scores
pytestmark = pytest.mark.filterwarnings(r"ignore:std\(\):UserWarning")


def _areal_functions(relative: str, names: tuple[str, ...], **globals_) -> dict:
    """``names`` defined in the installed areal's ``relative`` file, executed with torch and ``globals_`` only."""
    spec = importlib.util.find_spec("areal")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"areal is not installed (make install: pip install --no-deps areal=={AREAL_VERSION})")
    assert importlib.metadata.version("areal") == AREAL_VERSION
    path = Path(spec.submodule_search_locations[0]) / relative
    tree = ast.parse(path.read_text())
    body = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    assert {node.name for node in body} == set(names)
    namespace = {"torch": torch, **globals_}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}


@pytest.fixture(scope="module")
def areal():
    masking = _areal_functions("trainer/ppo/actor.py", ("_apply_m2po_masking", "_get_m2po_loss_mask"))
    loss = _areal_functions(
        "utils/functional/functional.py", ("ppo_actor_loss_fn",), RejectionSamplingConfig=object
    )  # its annotation only: rejection sampling stays off
    return masking["_apply_m2po_masking"], loss["ppo_actor_loss_fn"]


@st.composite
def batches(draw, per_token_advantages=True):
    B, T = draw(st.integers(1, 6)), draw(st.integers(1, 16))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.01
    scale = draw(st.sampled_from([0.02, 0.1, 0.3, 1.0]))
    logp = (old + scale * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=0.0)
    adv = torch.randn((B, T) if per_token_advantages else (B,), generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) > draw(st.sampled_from([0.0, 0.3]))
    mask[0, 0] = True
    return logp, old, adv, mask


def _loss_and_grad(fn, logp):
    leaf = logp.clone().requires_grad_(True)
    loss = fn(leaf)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


# ---------------------------------------------------------------------------------------------------------------
# M2PO against AReaL
# ---------------------------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from([1e-4, 0.01, 0.04, 0.2, 1.0]), st.sampled_from([torch.float64, torch.float32]))
def test_m2po_keeps_the_tokens_areal_keeps(areal, batch, threshold, dtype):
    """AReaL's mask from the behaviour log-probs (our ``old_logp``) and the proximal ones (the current policy before
    the step: our ``logp``), on random batches with padding."""
    apply_m2po_masking, _ = areal
    logp, old, adv, mask = (x.to(dtype) if x.is_floating_point() else x for x in batch)
    theirs = apply_m2po_masking(old, logp, mask, threshold)
    ours = at.policy_loss(logp, old, adv, mask, method="m2po", m2_threshold=threshold).result.kept & mask
    assert torch.equal(ours, theirs)


@settings(max_examples=40, deadline=None)
@given(batches(), st.sampled_from([0.01, 0.04, 0.2]))
def test_m2po_loss_and_gradient_are_areals_on_the_kept_tokens(areal, batch, threshold):
    """AReaL's own PPO loss on its M2PO mask, with a clip that never binds (the paper's unclipped ``M w A``), is the
    rule's per-token objective summed and divided by the kept tokens (AReaL's token mean counts the kept ones)."""
    apply_m2po_masking, ppo_actor_loss_fn = areal
    logp, old, adv, mask = batch
    keep = apply_m2po_masking(old, logp, mask, threshold)

    def theirs(lp):
        loss, _ = ppo_actor_loss_fn(lp, old, old, adv, eps_clip=1 - 1e-9, loss_mask=keep, eps_clip_higher=1e9)
        return loss

    def ours(lp):
        out = at.policy_loss(lp, old, adv, mask, method="m2po", m2_threshold=threshold, aggregation="token_sum")
        return out.loss / keep.sum()

    (l_theirs, g_theirs), (l_ours, g_ours) = _loss_and_grad(theirs, logp), _loss_and_grad(ours, logp)
    torch.testing.assert_close(l_ours, l_theirs, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-14)


def _one_sequence(log_ratios, advantage=1.0):
    y = torch.tensor([log_ratios], dtype=torch.float64)
    old = torch.full_like(y, -3.0)
    return old + y, old, torch.tensor([advantage], dtype=torch.float64), torch.ones_like(y, dtype=torch.bool)


@pytest.mark.parametrize(
    "log_ratios, threshold, kept",
    [
        # q = (1, 0.09, 0.01, 0): mean 0.275 >= 0.04, without the 1: 0.1 / 3 = 0.0333 < 0.04 -> drop one
        ([1.0, -0.3, 0.1, 0.0], 0.04, [False, True, True, True]),
        # the same with 0.03: 0.0333 >= 0.03, without 0.09 too: 0.01 / 2 = 0.005 < 0.03 -> drop two
        ([1.0, -0.3, 0.1, 0.0], 0.03, [False, False, True, True]),
        # mean (0.0025 + 0.0016 + 0.0004) / 3 = 0.0015 < 0.04: nothing dropped
        ([0.05, -0.04, 0.02], 0.04, [True, True, True]),
        # every q >= 0.25: no suffix mean is below 0.04, only the smallest (q = 0.25) stays
        ([0.5, -0.6, 0.7], 0.04, [True, False, False]),
    ],
)
def test_m2po_drops_what_a_hand_count_drops(log_ratios, threshold, kept):
    logp, old, adv, mask = _one_sequence(log_ratios)
    leaf = logp.clone().requires_grad_(True)
    out = at.policy_loss(leaf, old, adv, mask, method="m2po", m2_threshold=threshold, aggregation="token_sum")
    assert out.result.kept[0].tolist() == kept
    (grad,) = torch.autograd.grad(out.loss, leaf)
    w = [math.exp(y) for y in log_ratios]
    # kept: the loss -w A has gradient -w A in logp; dropped: 0 (and 0 in the objective)
    assert grad[0].tolist() == pytest.approx([-wi if k else 0.0 for wi, k in zip(w, kept)], rel=1e-12)
    assert out.per_token[0].tolist() == pytest.approx([wi if k else 0.0 for wi, k in zip(w, kept)], rel=1e-12)


def test_m2po_drops_every_token_tied_at_the_cut_where_areal_drops_one(areal):
    """q = (0.09, 0.09, 0, 0), threshold 0.04: the mean 0.045 is too large, the mean without one 0.09 is 0.03. AReaL
    drops one of the two identical tokens (its sort decides which); the rule drops both, as it would whatever the
    order of the batch. Either way the kept tokens' mean is below the threshold."""
    apply_m2po_masking, _ = areal
    logp, old, adv, mask = _one_sequence([0.3, 0.3, 0.0, 0.0])
    ours = at.policy_loss(logp, old, adv, mask, method="m2po").result.kept[0]
    theirs = apply_m2po_masking(old, logp, mask, 0.04)[0]
    assert ours.tolist() == [False, False, True, True]
    assert theirs.sum() == 3 and theirs[2:].all()
    for keep in (ours, theirs):
        assert float(((logp - old)[0][keep] ** 2).mean()) < 0.04


@settings(max_examples=40, deadline=None)
@given(batches(), st.sampled_from([0.01, 0.04, 0.3]), st.integers(0, 2**31 - 1))
def test_m2po_is_the_same_on_a_permuted_batch_and_keeps_its_mean_below_the_threshold(batch, threshold, seed):
    logp, old, adv, mask = batch
    keep = m2po_keep(logp - old, mask, threshold)
    perm = torch.randperm(logp.numel(), generator=torch.Generator().manual_seed(seed))
    flat = lambda x: x.flatten()[perm].view(1, -1)  # noqa: E731
    assert torch.equal(m2po_keep(flat(logp - old), flat(mask), threshold), flat(keep))
    q = ((logp - old) ** 2)[keep]
    if bool(((logp - old) ** 2)[mask].min() < threshold):  # else only the smallest stays (and its q >= threshold)
        assert float(q.mean()) < threshold
    assert bool((((logp - old) ** 2)[mask & ~keep] > threshold).all())  # only tokens above the threshold go


@settings(max_examples=80, deadline=None)
@given(batches(), st.sampled_from([1e-4, 0.01, 0.04, 0.3]), st.booleans())
def test_m2po_sorts_only_the_candidates_on_a_cpu_and_keeps_what_the_whole_sort_keeps(batch, threshold, ties):
    """The eager CPU path (the candidates compacted, then sorted) against the path a device or a compilation takes
    (every token sorted, no host read), forced here by reading as if compiling; ``ties``: each value twice."""
    logp, old, _, mask = batch
    y = logp - old
    if ties:
        y, mask = torch.cat([y, y], 1), torch.cat([mask, mask], 1)
    compacted = m2po_keep(y, mask, threshold)
    original = torch.compiler.is_compiling
    try:
        torch.compiler.is_compiling = lambda: True
        whole = m2po_keep(y, mask, threshold)
    finally:
        torch.compiler.is_compiling = original
    assert torch.equal(compacted, whole)


def test_m2po_compiles_into_one_graph_without_a_host_read():
    import torch._dynamo

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(1)
    y = torch.randn(4, 9, generator=g) * 0.4
    mask = torch.rand(4, 9, generator=g) > 0.3
    compiled = torch.compile(m2po_keep, backend="eager", fullgraph=True)
    assert torch.equal(compiled(y, mask, 0.04), m2po_keep(y, mask, 0.04))


# ---------------------------------------------------------------------------------------------------------------
# TOPR against ROLL
# ---------------------------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(batches(per_token_advantages=False), st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.sampled_from([0.0, 1.0, 3.0]))
def test_topr_is_rolls_loss(batch, positive_weight, negative_weight):
    """ROLL splits by the sequence's score (``scores > 0``: the positive set); with scores of the advantage's sign
    (GRPO's advantages of 0/1 rewards) its per-token loss is minus the rule's objective, in value and gradient."""
    logp, old, adv, mask = batch
    scores = (adv > 0).double()
    adv_t = adv[:, None].expand_as(logp)
    weights = dict(topr_positive_weight=positive_weight, topr_negative_weight=negative_weight)

    def theirs(lp):
        return torch.where(mask, roll_topr_loss(lp, old, adv_t, scores, **weights), 0.0).sum()

    def ours(lp):
        return at.policy_loss(lp, old, adv, mask, method="topr", aggregation="token_sum", **weights).loss

    (l_theirs, g_theirs), (l_ours, g_ours) = _loss_and_grad(theirs, logp), _loss_and_grad(ours, logp)
    torch.testing.assert_close(l_ours, l_theirs, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-14)


def test_topr_by_hand_and_where_roll_splits_by_score_instead():
    """p_old = (0.4, 0.25, 0.5), p = (0.5, 0.2, 0.5): w = (1.25, 0.8, 1). With A = -1 the weights are min(w, 1) =
    (1, 0.8, 1): objective w' A log p, gradient in log p: w' A. With A = 2 the weight is 1 whatever w."""
    old = torch.log(torch.tensor([[0.4, 0.25, 0.5]], dtype=torch.float64))
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.5]], dtype=torch.float64))
    mask = torch.ones_like(logp, dtype=torch.bool)
    for adv, weights, clipped in (
        (-1.0, [1.0, 0.8, 1.0], [True, False, False]),
        (2.0, [1.0, 1.0, 1.0], [False, False, False]),
    ):
        leaf = logp.clone().requires_grad_(True)
        out = at.policy_loss(leaf, old, torch.tensor([adv]).double(), mask, method="topr", aggregation="token_sum")
        (grad,) = torch.autograd.grad(-out.loss, leaf)
        assert out.per_token[0].tolist() == pytest.approx(
            [wi * adv * math.log(p) for wi, p in zip(weights, (0.5, 0.2, 0.5))], rel=1e-12
        )
        assert grad[0].tolist() == pytest.approx([wi * adv for wi in weights], rel=1e-12)
        assert out.result.clipped_high[0].tolist() == clipped and out.result.kept.all()
    # a sequence ROLL counts as positive (score 0.3 > 0) with A < 0 (the group's mean score is higher): ROLL gives it
    # the untapered weight 1 where w = 1.25; the rule, splitting by the advantage's sign, tapers it to 1 there too but
    # to 0.8 where w = 0.8
    roll = roll_topr_loss(logp, old, torch.full_like(logp, -1.0), torch.tensor([0.3], dtype=torch.float64))
    assert (-roll[0]).tolist() == pytest.approx([-math.log(p) for p in (0.5, 0.2, 0.5)], rel=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Kimi k1.5 against ROLL (and DRO)
# ---------------------------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from([0.01, 0.1, 1.0, 5.0]))
def test_kimi15_is_rolls_loss_and_dros_objective(batch, tau):
    logp, old, adv, mask = batch

    def theirs(lp):
        return torch.where(mask, roll_kimi15_loss(lp, old, adv, kimi15_tau=tau), 0.0).sum()

    def ours(lp, method="kimi15", **params):
        return at.policy_loss(lp, old, adv, mask, method=method, aggregation="token_sum", **params).loss

    (l_theirs, g_theirs), (l_ours, g_ours) = (
        _loss_and_grad(theirs, logp),
        _loss_and_grad(lambda lp: ours(lp, kimi15_tau=tau), logp),
    )
    torch.testing.assert_close(l_ours, l_theirs, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-14)
    l_dro, g_dro = _loss_and_grad(lambda lp: ours(lp, "dro", dro_beta=tau), logp)
    assert torch.equal(l_dro, l_ours) and torch.equal(g_dro, g_ours)


def test_kimi15_by_hand_and_the_papers_response_level_square():
    """A = 1, p_old = 0.4, p = 0.5, tau = 0.2: objective log 0.5 - 0.1 (log 1.25)^2 = -0.6981265, gradient in log p
    1 - 0.2 log 1.25 = 0.9553713. The paper's Eq. 3 squares the response's log-ratio: for log-ratios (0.1, 0.2) its
    penalty is tau/2 0.3^2 = 0.045 tau, the rule's (ROLL's) tau/2 (0.1^2 + 0.2^2) = 0.025 tau."""
    old = torch.log(torch.tensor([[0.4]], dtype=torch.float64))
    leaf = torch.log(torch.tensor([[0.5]], dtype=torch.float64)).requires_grad_(True)
    mask, adv = torch.ones(1, 1, dtype=torch.bool), torch.tensor([1.0], dtype=torch.float64)
    out = at.policy_loss(leaf, old, adv, mask, method="kimi15", kimi15_tau=0.2, aggregation="token_sum")
    (grad,) = torch.autograd.grad(-out.loss, leaf)
    assert float(out.per_token.detach()) == pytest.approx(-0.6981265, abs=5e-8)
    assert float(grad) == pytest.approx(0.9553713, abs=5e-8)
    logp, old, adv, mask = _one_sequence([0.1, 0.2], advantage=0.0)
    penalty = -float(
        at.policy_loss(logp, old, adv, mask, method="kimi15", kimi15_tau=1.0, aggregation="token_sum").loss
    )
    assert penalty == pytest.approx(-0.025, rel=1e-12) and penalty != pytest.approx(-0.045)


# ---------------------------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------------------------
def test_the_three_rules_are_registered_with_their_peers_defaults_and_refuse_bad_values():
    assert at.METHODS["m2po"].defaults == {"m2_threshold": 0.04}
    assert at.METHODS["topr"].defaults == {"topr_positive_weight": 1.0, "topr_negative_weight": 1.0}
    assert at.METHODS["kimi15"].defaults == {"kimi15_tau": 0.1}
    assert [at.METHODS[n].forms for n in ("m2po", "topr", "kimi15")] == [("mask",), ("soft",), ("none",)]
    for method, name, bad in (
        ("m2po", "m2_threshold", 0.0),
        ("topr", "topr_negative_weight", -1.0),
        ("kimi15", "kimi15_tau", math.nan),
    ):
        with pytest.raises(ValueError, match=rf"{name} must be a finite number .* got {bad!r} \(method '{method}'\)"):
            at.resolve(method, **{name: bad})
    assert {p.peer.split()[0] for n in ("m2po", "topr", "kimi15") for p in at.METHODS[n].peers} == {"AReaL", "ROLL"}
