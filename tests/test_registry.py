"""One declaration per idea: a method's parameters live in the registry alone, and everything else
(policy_loss's validation, the trainer config and its CLI, the presets, the README's table) follows."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import atr_theory as at
from atr_theory import docs
from tests.loss_batches import loss_batch

ROOT = Path(__file__).resolve().parents[1]


def _throwaway(batch, sharpness):
    """Throwaway rule: objective ``w A / sharpness``."""
    return at.methods.unclipped_result(torch.exp(batch.log_ratio) * batch.advantages / sharpness, batch)


@pytest.fixture
def throwaway():
    at.register(
        "throwaway",
        params={"sharpness": at.Param(2.0, gt=0, le=10, help="throwaway sharpness")},
        default_form="none",
        forms=("none",),
        reference="a test",
    )(_throwaway)
    try:
        yield
    finally:
        at.unregister("throwaway")
    assert "throwaway" not in at.METHODS


def _batch(B=3, T=5, seed=0):
    logp, old, adv, _ = loss_batch(seed, B, T, old_spread=1.0, old_offset=0.6, scale=0.1, clamp=False)  # logp < 0
    return logp, old, adv


def test_a_new_method_with_a_new_parameter_needs_nothing_but_its_registration(throwaway):
    logp, old, adv = _batch()
    mask = torch.ones_like(logp, dtype=torch.bool)
    out = at.policy_loss(logp, old, adv, mask, method="throwaway", sharpness=4.0)
    w = torch.exp(logp - old)
    expected = -(w * adv[:, None] / 4.0).sum() / logp.numel()  # dr_grpo with max_length = T
    assert float(out.loss) == pytest.approx(float(expected), rel=1e-12)
    assert at.resolve("throwaway").params["sharpness"] == 2.0
    for bad in (0.0, 11.0, float("nan"), "3", True):
        with pytest.raises(ValueError, match="sharpness must be"):
            at.policy_loss(logp, old, adv, mask, method="throwaway", sharpness=bad)
    assert "`throwaway`" in docs.methods_markdown() and "throwaway sharpness" not in docs.methods_markdown()


def test_a_new_method_reaches_the_trainer_config_and_the_cli_unedited():
    """In a fresh process (config fields are built from the registry when atr_llm.trainer is imported)."""
    pytest.importorskip("trl")
    script = textwrap.dedent(
        """
        import torch, atr_theory as at
        from atr_theory.methods import unclipped_result

        @at.register("throwaway", params={"sharpness": at.Param(2.0, gt=0, help="throwaway sharpness")},
                     default_form="none", forms=("none",), reference="a test")
        def throwaway(batch, sharpness):
            "w A / sharpness"
            return unclipped_result(torch.exp(batch.log_ratio) * batch.advantages / sharpness, batch)

        from transformers import HfArgumentParser
        from atr_llm import train
        from atr_llm.trainer import ATRGRPOConfig
        base = ["--output_dir", "/tmp/unused", "--use_cpu", "true", "--bf16", "false", "--loss_type", "dr_grpo", "--tiny", "true"]
        args = train.parse(base + ["--method", "throwaway", "--sharpness", "3"]).training
        assert dict(args.resolved_method.params) == {"sharpness": 3.0}, args.resolved_method
        assert "throwaway sharpness" in HfArgumentParser(ATRGRPOConfig).format_help()
        for argv, match in ((["--method", "throwaway", "--sharpness", "-1"], "--sharpness -1: expected a finite number > 0"),
                            (["--method", "atr", "--sharpness", "3"], "--sharpness 3: set, but method 'atr' does not")):
            try:
                train.parse(base + argv)
            except ValueError as e:
                assert match in str(e), str(e)
            else:
                raise AssertionError(argv)
        print("OK")
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]


def test_a_rule_written_as_one_new_module_needs_no_other_edit(written_rule_module):
    """One new module in atr_theory/methods/, nothing else edited: in a fresh process the rule is registered (after
    every built-in rule), computes in policy_loss with its parameter, and the trainer's config accepts it."""
    pytest.importorskip("trl")
    script = textwrap.dedent(
        """
        import torch, atr_theory as at
        assert list(at.METHODS)[-1] == "zz_written_rule", list(at.METHODS)
        g = torch.Generator().manual_seed(0)
        logp = -torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.1
        old = logp + 0.1 * torch.randn(3, 5, generator=g, dtype=torch.float64)
        adv, mask = torch.randn(3, generator=g, dtype=torch.float64), torch.ones(3, 5, dtype=torch.bool)
        out = at.policy_loss(logp, old, adv, mask, method="zz_written_rule", zz_sharpness=4.0, aggregation="token_mean")
        assert torch.allclose(out.loss, -(torch.exp(logp - old) * adv[:, None] / 4.0).mean(), rtol=1e-12, atol=0)
        from atr_llm import train
        base = ["--output_dir", "/tmp/unused", "--use_cpu", "true", "--bf16", "false", "--loss_type", "dr_grpo", "--tiny", "true"]
        args = train.parse(base + ["--method", "zz_written_rule", "--zz_sharpness", "3"]).training
        assert dict(args.resolved_method.params) == {"zz_sharpness": 3.0}, args.resolved_method
        try:
            train.parse(base + ["--method", "zz_written_rule", "--zz_sharpness", "0"])
        except ValueError as e:
            assert "--zz_sharpness 0: expected a finite number > 0" in str(e), str(e)
        else:
            raise AssertionError("zz_sharpness 0 accepted")
        print("OK")
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]


def test_the_family_modules_register_the_rules_in_their_committed_order():
    """Registration order is the order of METHODS and of the figures' method colours (sims._common.method_color):
    the family modules, imported in name order, must give the order the committed figures were drawn with."""
    assert at.methods.family_modules() == [
        "divergence_masks",
        "divergence_ranges",
        "entropy_covariance",
        "full_distribution",
        "sequence",
        "soft_weights",
        "unclipped",
        "vocab_topk_masks",
        "weighted_off_policy",
        "weighted_trust_regions",
        "weighting_by_future_kl",
    ]
    assert [name for name, spec in at.METHODS.items() if name == spec.name] == [
        "dppo_tv", "dppo_kl", "clip", "clip_higher", "dual_clip", "dual_clip_higher", "dcpo", "trgppo", "atr", "kl1",
        "kl2", "is_kl3", "clip_cov", "kl_cov", "tr_ppo", "truly_ppo", "gspo", "gmpo", "atr_seq", "sapo", "cispo",
        "vespo", "reinforce", "dro", "dppo_topk_tv", "dppo_topk_kl", "m2po", "topr", "kimi15", "pspo", "cfpo",
        "up_grpo", "ce_gppo", "aspo", "bapo", "fipo",
    ]  # fmt: skip


def test_the_docs_methods_table_is_the_registry():
    text = (ROOT / "docs" / "methods.md").read_text()
    assert docs.readme_with_table(text) == text, "stale methods table: run `python -m tools.methods_table`"


@pytest.mark.parametrize("value", [True, "0.07", torch.tensor(0.07), None, [0.07]])
def test_a_parameter_that_is_not_a_real_number_is_refused_naming_it(value):
    with pytest.raises(ValueError, match="delta must be a real number"):
        at.resolve("atr", delta=value)


def test_an_out_of_domain_message_is_exact_with_and_without_a_help_text():
    # a user's own Param may have no help text: the message then ends at the domain, nothing in its place
    with pytest.raises(ValueError) as bare:
        at.methods.Param(1.0, gt=0).check("x", -1.0, "mine")
    assert str(bare.value) == "x must be a finite number > 0, got -1.0 (method 'mine')"
    with pytest.raises(ValueError) as helped:
        at.methods.Param(1.0, ge=0, lt=1, help="a fraction").check("x", 1.0, "mine")
    assert str(helped.value) == "x must be in [0, 1) (a fraction), got 1.0 (method 'mine')"


def test_numpy_and_integer_parameters_are_accepted_as_numbers():
    assert at.resolve("atr", delta=np.float32(0.5)).params["delta"] == 0.5
    assert at.resolve("dual_clip", dual_clip_c=3).params["dual_clip_c"] == 3.0


def test_a_registration_whose_function_does_not_take_its_declared_parameters_is_refused():
    with pytest.raises(ValueError, match="the function takes"):
        at.register("bad", params={"x": at.Param(1.0)}, default_form="none", forms=("none",), reference="-")(
            lambda batch, y: None
        )
    with pytest.raises(TypeError, match="Param"):
        at.register("bad", params={"x": 1.0}, default_form="none", forms=("none",), reference="-")
    assert "bad" not in at.METHODS


def test_a_registration_with_forms_outside_the_known_ones_or_without_its_default_is_refused():
    def declare(default_form, forms):
        return at.register("bad", params={}, default_form=default_form, forms=forms, reference="-")

    # the default form must be one of the method's forms, and every form one of FORMS: each alone is refused
    for default_form, forms in (("mask", ("min",)), ("min", ("min", "clamp")), ("clamp", ("clamp",))):
        with pytest.raises(ValueError, match=rf"method 'bad': forms .* must be among .* and include '{default_form}'"):
            declare(default_form, forms)
    assert "bad" not in at.METHODS
    # a name (or alias) already in the table is refused, and the table keeps the method it had
    clip = at.METHODS["clip"]
    with pytest.raises(ValueError, match="method 'clip' is already registered"):
        at.register("clip", params={}, default_form="min", forms=("min",), reference="-")(lambda batch: None)
    assert at.METHODS["clip"] is clip
    # a method may offer every form there is (a subset, not a strict subset, of FORMS)
    declare("min", at.methods.FORMS)(lambda batch: None)
    try:
        assert at.METHODS["bad"].forms == at.methods.FORMS
    finally:
        at.unregister("bad")


def test_unregister_by_any_name_removes_the_method_and_every_alias_and_nothing_else():
    before = dict(at.METHODS)
    at.register("bad", params={}, default_form="none", forms=("none",), reference="-", aliases=("bad2", "bad3"))(
        lambda batch: None
    )
    assert {"bad", "bad2", "bad3"} <= set(at.METHODS)
    at.unregister("bad3")  # an alias names the method as well as its own name does
    assert at.METHODS == before
    with pytest.raises(ValueError, match="unknown method 'bad'"):
        at.unregister("bad")


def test_every_parameter_domain_is_described_and_enforced_at_its_bounds():
    for name in at.method_names(aliases=False):
        spec = at.METHODS[name]
        at.resolve(name)  # the declared defaults lie in their domains
        for key, p in spec.params.items():
            assert p.help, (name, key)
            for bound, inside in ((p.gt, False), (p.ge, True), (p.lt, False), (p.le, True)):
                if bound is None:
                    continue
                if inside:
                    p.check(key, bound, name)
                else:
                    with pytest.raises(ValueError, match=f"{key} must be"):
                        p.check(key, bound, name)


def test_method_names_lists_aliases_unless_asked_not_to():
    # oracle: the registry itself (each spec's own name and its declared aliases)
    specs = {id(s): s for s in at.METHODS.values()}.values()
    own = sorted(s.name for s in specs)
    aliases = sorted(a for s in specs for a in s.aliases)
    assert aliases, "the registry declares no alias: this test would not test anything"
    assert at.method_names(aliases=False) == own
    assert at.method_names() == sorted(own + aliases)  # the default lists the aliases too


@pytest.mark.parametrize("name", at.method_names(aliases=False))
def test_the_full_distribution_flag_matches_what_the_method_reads(name):
    # the flag decides whether the trainer and the bandit build (B, T, V) log-probs; oracle: the method itself,
    # called without them (it refuses iff it reads them)
    logp, old, adv = _batch()
    mask = torch.ones_like(logp, dtype=torch.bool)
    if at.METHODS[name].needs_full_distributions:
        with pytest.raises(ValueError, match="needs the full distributions"):
            at.policy_loss(logp, old, adv, mask, method=name)
    elif at.METHODS[name].needs_topk:
        with pytest.raises(ValueError, match="reads the top-K"):
            at.policy_loss(logp, old, adv, mask, method=name)
    else:
        assert torch.isfinite(at.policy_loss(logp, old, adv, mask, method=name).loss)


def test_a_declared_ratio_range_is_what_the_min_form_trains():
    """Every rule that declares ``ratio_range`` trains, in its min form, PPO's own min objective
    ``min(w A, clip(w, l, u) A)`` (Schulman et al. 2017, written out here) with the declared ``(l, u)``: the same
    per-token value and gradient on float64 batches whose ratios reach past both ends (0.3 to 3, both signs of the
    advantage), at the rule's defaults and at twice them. The rules that are not one constant range in PPO's min
    (a dual clip's floor, per-token bounds, a covariance selection, GSPO's sequence ratios) declare none."""
    declared = [n for n in at.method_names(aliases=False) if at.METHODS[n].ratio_range is not None]
    assert {"clip", "clip_higher", "atr", "kl1", "kl2", "is_kl3"} <= set(declared)
    assert not {"dual_clip", "dual_clip_higher", "dcpo", "trgppo", "clip_cov", "gspo"} & set(declared)
    g = torch.Generator().manual_seed(3)
    w0 = torch.exp(torch.empty(16, 64, dtype=torch.float64).uniform_(-1.2, 1.1, generator=g))
    adv = torch.randn(16, 64, generator=g, dtype=torch.float64)
    mask = torch.ones(16, 64, dtype=torch.bool)
    for name in declared:
        spec = at.METHODS[name]
        for scale in (1.0, 2.0):
            params = {k: v * scale for k, v in spec.defaults.items()}
            lower, upper = (float(b) for b in spec.ratio_range(**params))
            y = torch.log(w0).requires_grad_(True)
            batch = at.TokenBatch(y, adv, mask, y.detach(), torch.zeros_like(y), form="min")
            objective = spec.fn(batch, **params).objective
            (grad,) = torch.autograd.grad(objective.sum(), y)
            y_ref = torch.log(w0).requires_grad_(True)
            w = torch.exp(y_ref)
            ppo = torch.minimum(w * adv, torch.clamp(w, lower, upper) * adv)
            (grad_ref,) = torch.autograd.grad(ppo.sum(), y_ref)
            torch.testing.assert_close(objective.detach(), ppo.detach(), rtol=0, atol=1e-15, msg=name)
            torch.testing.assert_close(grad, grad_ref, rtol=0, atol=1e-15, msg=name)
            assert bool((grad == 0).any()) and bool((grad != 0).any()), name  # the range bites on these batches
