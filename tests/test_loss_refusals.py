"""What ``atr_theory.policy_loss`` refuses, and what it ignores: the registry's declarations, bad arguments (each
refused naming the argument and the value expected), NaN and +-inf in every tensor argument (refused on a valid
position, naming the argument, the kind and the position; ignored on a padded one), scalars outside their domain,
tensors nothing in the call reads, precision and devices."""

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import atr_theory as at
from tests.loss_batches import token_batch as _batch
from tests.rule_inputs import rule_inputs

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
        (dict(method="nope"), "unknown method 'nope'; known methods: aspo, atr, atr_seq"),
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
            r"^token_weights has NaN at valid position \(0, 0\); a token weight must be finite$",
        ),
        (
            dict(advantages=torch.tensor([0.0, math.inf, 1.0])),
            r"^advantages has \+inf at valid position \(1,\); values on valid tokens must be finite$",
        ),
        (  # finite as given, +inf once cast to the float32 loss
            dict(
                logp=torch.zeros(3, 6, dtype=torch.float32),
                advantages=torch.tensor([0.0, 1.0, 1e300], dtype=torch.float64),
            ),
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


def _draw_position(reader: str, seed: int, data):
    """``reader``'s argument name, its finite value from ``seed``, a random mask, one random position of the value
    and whether that position is to be valid (the mask is set by the caller)."""
    g = torch.Generator().manual_seed(seed)
    clean = _READERS[reader][0](g, _batch(seed, B=_B, T=_T))
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=_B * _T, max_size=_B * _T))).reshape(_B, _T)
    pos = tuple(data.draw(st.integers(0, n - 1)) for n in clean.shape)
    return reader.split(" ")[0].rstrip(","), clean, mask, pos, data.draw(st.booleans(), label="valid")


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), data=st.data())
@pytest.mark.parametrize("kind", sorted(_KINDS))
@pytest.mark.parametrize("reader", sorted(_READERS))
def test_a_non_finite_value_is_refused_at_a_valid_position_and_ignored_at_a_padded_one(reader, kind, seed, data):
    """A NaN / +inf / -inf put at one random position of a random mask: valid -> ValueError naming the argument,
    the kind and that position, except -inf in a full distribution (a vocabulary entry of probability 0), which is
    taken; padded -> the same loss and per-token values as the finite batch; ``validate=False`` reads nothing."""
    name, clean, mask, pos, valid = _draw_position(reader, seed, data)
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


_LOG_PROB_READERS = ("logp", "old_logp", "behaviour_logp", "behaviour_logp, sequence mask", "old_full_logp", "full_logp")


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), data=st.data())
@pytest.mark.parametrize("reader", [*_LOG_PROB_READERS, "token_weights"])
def test_a_log_prob_above_0_or_a_negative_weight_is_refused_where_valid_and_ignored_on_padding(reader, seed, data):
    """A log-prob above ``LOGP_TOLERANCE`` (logits or probabilities passed as log-probs), or a negative token weight,
    put at one random position: valid -> ValueError naming the argument, the value and the position; padded -> the
    same loss as the clean batch; a log-prob of 0 < v <= ``LOGP_TOLERANCE`` (rounding) or a weight of 0 is taken."""
    name, clean, mask, pos, valid = _draw_position(reader, seed, data)
    mask[pos[:2]] = valid
    weight = name == "token_weights"
    bad = -data.draw(st.floats(1e-6, 10.0)) if weight else data.draw(st.floats(2 * at.LOGP_TOLERANCE, 30.0))
    dirty = clean.clone()
    dirty[pos] = bad
    if valid:
        where = ", ".join(map(str, pos))
        kind = "a token weight is >= 0" if weight else "a log-probability is <= 0"
        with pytest.raises(ValueError, match=rf"^{name} holds .* at valid position \({where}\): {kind}"):
            _call_with(reader, dirty, mask, seed)
        edge = clean.clone()
        edge[pos] = 0.0 if weight else at.LOGP_TOLERANCE
        assert torch.isfinite(_call_with(reader, edge, mask, seed).loss)  # the boundary is taken
        return
    want, got = _call_with(reader, clean, mask, seed), _call_with(reader, dirty, mask, seed)
    assert torch.equal(got.loss, want.loss) and torch.equal(got.per_token, want.per_token)


def test_a_top_k_log_prob_above_0_is_refused_naming_it():
    """The top-K log-probs are log-probs too: a value above ``LOGP_TOLERANCE`` is refused (a -inf is taken)."""
    logp, old, adv, mask = _batch(2, B=_B, T=_T)
    topk = rule_inputs("dppo_topk_tv", _B, _T)
    topk["topk_logp"] = topk["topk_logp"].clone()
    topk["topk_logp"][1, 2, 0] = 0.75
    with pytest.raises(ValueError, match=r"^topk_logp holds 0\.7\d* at valid position \(1, 2, 0\): a log-prob"):
        at.policy_loss(logp, old, adv, torch.ones_like(mask), method="dppo_topk_tv", **topk)


def test_a_generator_is_refused_by_a_rule_that_never_draws_and_rule_generator_passes_it_only_to_one_that_does():
    logp, old, adv, mask = _batch(4, B=_B, T=_T)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"^generator is given, but nothing in this call reads it: .* not by 'atr'"):
        at.policy_loss(logp, old, adv, mask, method="atr", generator=g)
    assert at.rule_generator("atr", g) is None and at.rule_generator(at.resolve("clip_cov"), g) is g
    out = at.policy_loss(logp, old, adv, mask, method="clip_cov", generator=at.rule_generator("clip_cov", g))
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_a_sequence_mask_below_0_on_a_non_negative_estimator_is_refused(estimator):
    """k2 and k3 are >= 0 on every token: a negative threshold would drop every sequence it tests; k1 (a mean log
    ratio, of either sign) takes one (verl's lower bound log(lo) < 0)."""
    with pytest.raises(ValueError, match=rf"^SequenceMask threshold -0\.1 is below 0, but {estimator} is >= 0"):
        at.SequenceMask(estimator, "mean", -0.1, "all")
    assert at.SequenceMask("k1", "mean", -0.1, "all", lower=-0.5).threshold == -0.1


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
        return at.methods.unclipped_result(torch.exp(batch.log_ratio) * batch.advantages, batch)

    at.register("dtype_probe", params={}, default_form="none", forms=("none",), reference="a test")(probe)
    try:
        logp, old, adv, _ = _batch(0)
        mask = torch.ones(logp.shape, dtype=torch.bool)
        mask[:, -1] = not padded
        at.policy_loss(logp.detach().to(dtype), old.to(dtype), adv.float(), mask, method="dtype_probe")
    finally:
        at.unregister("dtype_probe")
    assert seen == dict.fromkeys(("logp", "old_logp", "advantages", "log_ratio"), expected)


def test_finite_log_probs_whose_difference_overflows_are_refused_as_a_log_prob_above_0():
    """float32 log-probs of opposite signs near the float32 limit (each finite, their difference -inf): the positive
    one is no log-probability, and is named (two finite log-probs <= 0 cannot overflow their difference)."""
    logp, old, adv, mask = (t.float() for t in _batch(0))
    logp, old = logp.detach().clone(), old.clone()
    logp[0, 1], old[0, 1] = -3e38, 3e38
    with pytest.raises(ValueError, match=r"^old_logp holds 3\.0\d*e\+38 at valid position \(0, 1\): a log-probability"):
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
        kw_here = {**kw, **topk, "generator": at.rule_generator(method, g)}
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


def test_tensors_on_the_meta_device_are_refused_naming_the_first():
    """A meta tensor has a shape and no values: ``Tensor.item()`` raised torch's own error naming no argument."""
    logp, old, adv, mask = _batch(0)
    with pytest.raises(RuntimeError, match="meta tensors"):
        logp.to("meta").sum().item()
    with pytest.raises(ValueError, match=r"^logp is on the meta device"):
        at.policy_loss(logp.to("meta"), old.to("meta"), adv.to("meta"), mask.to("meta"))


def test_a_chunk_size_nothing_reads_and_a_validate_that_is_not_a_bool_are_refused():
    logp, old, adv, mask = _batch(0, B=_B, T=_T)
    with pytest.raises(ValueError, match=r"^kl_chunk_size is given, but nothing in this call reads it"):
        at.policy_loss(logp, old, adv, mask, method="atr", kl_chunk_size=16)
    for bad in ("false", 0, None):
        with pytest.raises(ValueError, match=r"^validate must be True or False"):
            at.policy_loss(logp, old, adv, mask, method="atr", validate=bad)
