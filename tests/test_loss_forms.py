"""Where the min and mask forms part (``atr_theory.outside_by_advantage``, the metrics
``frac_outside_against_advantage`` / ``frac_outside_with_advantage``): the fractions against a brute-force count
whose "outside" is read from autograd (a token the mask form keeps has a nonzero gradient, one it freezes has none),
and the two forms' gradients equal on every batch with no token outside against its advantage."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import atr_theory as at
from tests.loss_batches import loss_batch
from tests.rule_inputs import rule_inputs

WITH_MASK_FORM = [
    n for n in at.method_names(aliases=False) if "mask" in at.METHODS[n].forms and not at.METHODS[n].stochastic
]
BOTH_FORMS = [n for n in WITH_MASK_FORM if "min" in at.METHODS[n].forms]
SEQUENCE_ADVANTAGES = {"gspo", "atr_seq"}  # read one advantage per sequence


def _batch(name: str, seed: int, scale: float):
    per_token = name not in SEQUENCE_ADVANTAGES
    logp, old, adv, mask = loss_batch(seed, 4, 9, scale=scale, per_token=per_token, min_length=2)
    logp = torch.where(torch.arange(9) % 3 == 0, old, logp)  # ratio 1: outside only by a top-K divergence
    extra = {k: v.double() for k, v in rule_inputs(name, 4, 9, torch.float64, scale=2.0).items()}
    return logp, old, adv, mask, extra


def _loss_and_grad(name, form, logp, old, adv, mask, extra):
    leaf = logp.clone().requires_grad_(True)
    out = at.policy_loss(leaf, old, adv, mask, method=name, form=form, aggregation="token_sum", **extra)
    (grad,) = torch.autograd.grad(out.loss, leaf)
    return out, grad


def test_every_two_form_rule_and_every_mask_rule_is_covered():
    assert {"clip", "atr", "dppo_tv", "dppo_topk_kl", "gspo", "trgppo"} <= set(BOTH_FORMS)
    assert {"m2po", "atr_seq"} <= set(WITH_MASK_FORM) - set(BOTH_FORMS)


@pytest.mark.parametrize("name", WITH_MASK_FORM)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([0.1, 0.4, 1.0]))
def test_the_fractions_outside_are_a_count_of_where_the_mask_forms_gradient_vanishes(name, seed, scale):
    logp, old, adv, mask, extra = _batch(name, seed, scale)
    metrics = at.policy_loss(logp, old, adv, mask, method=name, **extra).metrics  # the rule's default form
    _, grad = _loss_and_grad(name, "mask", logp, old, adv, mask, extra)
    against = with_ = 0
    a = adv if adv.dim() == 2 else adv[:, None].expand_as(logp)
    for b, t in mask.nonzero().tolist():
        A, y = float(a[b, t]), float(logp[b, t] - old[b, t])
        if A == 0.0 or float(grad[b, t]) != 0.0:  # kept by the mask form (or no side)
            continue
        if (A > 0 and y <= 0) or (A < 0 and y > 0):
            against += 1
        else:
            with_ += 1
    n = int(mask.sum())
    assert metrics["frac_outside_against_advantage"] == against / n
    assert metrics["frac_outside_with_advantage"] == with_ / n


@pytest.mark.parametrize("name", BOTH_FORMS)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([0.1, 0.4, 1.0]))
def test_with_no_token_outside_against_its_advantage_the_two_forms_give_one_gradient(name, seed, scale):
    """The tokens outside against their advantage get advantage 0 (their sequence, for a rule that reads one
    advantage per sequence) until none is left; then min and mask give the same gradient, and the same loss where
    no token is outside with its advantage either (else the losses differ by a constant: the frozen value)."""
    logp, old, adv, mask, extra = _batch(name, seed, scale)
    for _ in range(4):
        out = at.policy_loss(logp, old, adv, mask, method=name, form="mask", **extra)
        against, _ = at.outside_by_advantage(out.result.kept, out.log_ratio, out.advantages, mask)
        if at.METHODS[name].needs_full_distributions:  # tr_ppo's min(w A, A) at w = 1 is a tie: torch.minimum
            tie = mask & ~out.result.kept & (out.log_ratio == 0) & (out.advantages != 0)
            against = against | tie  # gives each term half of its gradient
        if not bool(against.any()):
            break
        adv = torch.where(against, 0.0, adv) if adv.dim() == 2 else torch.where(against.any(-1), 0.0, adv)
    assume(not bool(against.any()))
    out_min, grad_min = _loss_and_grad(name, "min", logp, old, adv, mask, extra)
    out_mask, grad_mask = _loss_and_grad(name, "mask", logp, old, adv, mask, extra)
    assert out_mask.metrics["frac_outside_against_advantage"] == 0.0
    torch.testing.assert_close(grad_min, grad_mask, rtol=1e-12, atol=1e-15)
    if out_mask.metrics["frac_outside_with_advantage"] == 0.0:
        torch.testing.assert_close(out_min.loss, out_mask.loss, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["clip", "atr", "dppo_kl"])
def test_a_token_outside_against_its_advantage_is_where_the_forms_part(name):
    """One token pushed below the range with A > 0: the min form keeps its gradient (pulls it back), the mask form
    does not; the metric counts it as against, on the form run and on the other."""
    old = torch.tensor([[-0.05, -0.5, -0.5]], dtype=torch.float64)  # the first: p_old 0.95, which falls to 0.35
    logp = old + torch.tensor([[-1.0, 0.0, 0.0]], dtype=torch.float64)  # w = 0.37 below every range's lower end
    adv, mask = torch.tensor([[1.0, 1.0, -1.0]], dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool)
    for form in ("min", "mask"):
        out, grad = _loss_and_grad(name, form, logp, old, adv, mask, {})
        assert out.metrics["frac_outside_against_advantage"] == pytest.approx(1 / 3)
        assert out.metrics["frac_outside_with_advantage"] == 0.0
        assert (float(grad[0, 0]) != 0.0) == (form == "min")


def test_a_rule_without_a_mask_form_and_a_stochastic_one_run_in_its_min_form_report_no_fraction():
    logp, old, adv, mask = loss_batch(1, 3, 6)
    for name in ("cispo", "reinforce", "sapo"):
        assert "frac_outside_against_advantage" not in at.policy_loss(logp, old, adv, mask, method=name).metrics
    assert "frac_outside_against_advantage" not in at.policy_loss(logp, old, adv, mask, method="clip_cov").metrics
    masked = at.policy_loss(logp, old, adv, mask, method="clip_cov", form="mask").metrics
    assert "frac_outside_against_advantage" in masked


def _evaluated_once_and_matching(name, seed, scale, dtype, params):
    logp, old, adv, mask, extra = _batch(name, seed, scale)
    logp, old, adv = logp.to(dtype), old.to(dtype), adv.to(dtype)
    extra = {k: v.to(dtype) for k, v in extra.items()}
    spec = at.METHODS[name]
    calls = []

    def counted(batch, **rule_params):
        calls.append(batch.form)
        return spec.fn(batch, **rule_params)

    choice = at.resolve(name, "min", **params)
    out = at.policy_loss(logp, old, adv, mask, method=replace(choice, spec=replace(spec, fn=counted)), **extra)
    metrics = out.metrics
    assert calls == ["min"]
    if spec.stochastic:
        assert out.mask_form_kept is None and "frac_outside_against_advantage" not in metrics
        return
    masked = at.policy_loss(logp, old, adv, mask, method=name, form="mask", **params, **extra)
    assert torch.equal(out.mask_form_kept() & mask, masked.result.kept & mask)
    assert metrics["frac_outside_against_advantage"] == masked.metrics["frac_outside_against_advantage"]
    assert metrics["frac_outside_with_advantage"] == masked.metrics["frac_outside_with_advantage"]


DTYPES = st.sampled_from([torch.float32, torch.float64])


@pytest.mark.parametrize("name", BOTH_FORMS + ["clip_cov"])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([0.1, 0.4, 1.0]), dtype=DTYPES)
def test_the_forms_metric_reads_the_rules_one_evaluation_and_matches_a_mask_form_run(name, seed, scale, dtype):
    """Reading the metrics of a min-form call evaluates the rule once (its registered function is counted), and the
    tokens it says the mask form keeps are those a separate mask-form call keeps, bit for bit, in float32 (the
    table-read bounds of trgppo, dcpo's per-sign bounds) and float64. clip_cov, whose mask form would draw its
    random tokens among other candidates, reports no fraction rather than evaluate twice."""
    _evaluated_once_and_matching(name, seed, scale, dtype, {})


@pytest.mark.parametrize(
    "name, params",
    [
        ("dual_clip", {"epsilon": 0.9, "dual_clip_c": 1.2}),
        ("dual_clip_higher", {"epsilon_high": 3.0, "dual_clip_c": 1.5}),
        ("dcpo", {"epsilon_high": 3.0, "dual_clip_c": 1.1}),
    ],
)
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dtype=DTYPES)
def test_a_dual_clip_inside_the_range_takes_its_capped_tokens_out_of_the_mask_forms_kept_set(name, params, seed, dtype):
    """With ``c`` below the range's upper end the mask form's dual clip caps tokens it would keep (``w > c``,
    ``A < 0``): the min form's answer must leave them out too."""
    _evaluated_once_and_matching(name, seed, 1.0, dtype, params)
