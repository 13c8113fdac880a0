"""Every TRL GRPOConfig option that acts on the loss, pinned by TRL's own GRPOTrainer: the same model, the same batch
(old log-probs away from the new ones), the same loss, gradient and TRL-named metrics; a few optimizer steps with
the same seed give the same weights; MoE router loss, TRL's default config and its positional order."""

import dataclasses
import math
import warnings

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
pytest.importorskip("math_verify")

from grpo_helpers import grpo_config_kwargs, random_batch, tiny_moe, tiny_trainer  # noqa: E402

import atr_theory as at  # noqa: E402
from atr_llm import data, rewards, tiny  # noqa: E402
from atr_llm.config import trl_loss_types  # noqa: E402
from atr_llm.trainer import ATRGRPOConfig, ATRGRPOTrainer, trl_logps_kernel_available  # noqa: E402

TRL_FIELDS = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
FAMILY = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
RULES = ("cispo", "sapo", "vespo")


def _trainers(tmp_path, tok, model, options, method="trl"):
    ds = data.to_grpo_dataset(data.arithmetic_dataset(16))
    reward = rewards.CorrectnessReward()
    ours_kw = {} if method is None else {"method": method}
    ours = ATRGRPOConfig(**grpo_config_kwargs(tmp_path / "a", **options), **ours_kw)
    theirs = trl.GRPOConfig(**grpo_config_kwargs(tmp_path / "b", **options))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = ATRGRPOTrainer(model=model, reward_funcs=[reward], args=ours, train_dataset=ds, processing_class=tok)
        b = trl.GRPOTrainer(model=model, reward_funcs=[reward], args=theirs, train_dataset=ds, processing_class=tok)
    if not trl_logps_kernel_available():  # TRL 1.15's log-prob path needs Triton: both score with ours, so what is
        b._get_per_token_logps_and_entropies = a._get_per_token_logps_and_entropies  # compared is the loss
    return a, b


def _loss_grads_metrics(trainer, model, inputs, micro_batches=1):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = micro_batches
    trainer._metrics["train"].clear()
    params = [p for p in model.parameters() if p.requires_grad]
    results = []
    for _ in range(micro_batches):  # the adaptive entropy bonus: its coefficient moves between micro-batches
        loss = trainer._compute_loss(model, dict(inputs))
        results.append((loss.detach(), torch.autograd.grad(loss, params, allow_unused=True)))
    return results, {k: v[-1] for k, v in trainer._metrics["train"].items()}


def _assert_same(a, b, model, inputs, beta=0.0, micro_batches=1, grad_tol=3e-5):
    a.beta = b.beta = beta
    ra, ma = _loss_grads_metrics(a, model, inputs, micro_batches)
    rb, mb = _loss_grads_metrics(b, model, inputs, micro_batches)
    for (la, ga), (lb, gb) in zip(ra, rb):
        assert la.item() == pytest.approx(lb.item(), rel=1e-6, abs=1e-12)
        worst = max(
            float(torch.linalg.vector_norm(x - y)) / max(float(torch.linalg.vector_norm(y)), 1e-30)
            for x, y in zip(ga, gb)
            if x is not None
        )
        assert worst <= grad_tol  # float32 log-prob arithmetic; a wrong formula moves it by > 1e-2
    for key, value in mb.items():  # every metric TRL logs, under TRL's name, with TRL's value
        assert key in ma, key
        assert ma[key] == pytest.approx(value, rel=1e-5, abs=1e-6) or (math.isnan(value) and math.isnan(ma[key])), key
    return ra, ma


def _moved_inputs(a, model, tok, seed=0, tool_mask=False, sampling=False):
    inputs = random_batch(tok, seed=seed, zero_advantage=True, tool_mask=tool_mask)
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        msk = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        lp = a._get_per_token_logps_and_entropies(model, ids, msk, 8)[0]
    g = torch.Generator().manual_seed(seed + 1)
    inputs["old_per_token_logps"] = lp + 0.4 * torch.randn(lp.shape, generator=g)
    inputs["ref_per_token_logps"] = lp + 0.3 * torch.randn(lp.shape, generator=g)
    if sampling:  # vLLM's own log-probs of the sampled tokens (OPSM reads them where present)
        inputs["sampling_per_token_logps"] = lp + 0.5 * torch.randn(lp.shape, generator=g)
    return inputs


OPTIONS = {
    "none": {},
    "sequence": {"importance_sampling_level": "sequence"},
    "opsm": {"off_policy_mask_threshold": 0.05},
    "entropy_mask": {"top_entropy_quantile": 0.4},
    "entropy_bonus": {"entropy_coef": 0.01},
    "adaptive_entropy": {"use_adaptive_entropy": True, "entropy_coef": 0.02, "entropy_target": 10.0},
    "sequence+opsm+entropy_mask": {
        "importance_sampling_level": "sequence",
        "off_policy_mask_threshold": 0.02,
        "top_entropy_quantile": 0.6,
    },
}
FAMILY_ONLY = {
    "delta_above": {"delta": 1.5, "epsilon_high": 0.28},
    "delta_below": {"delta": 1.1, "epsilon_high": 0.28},
    "epsilon_high": {"epsilon": 0.1, "epsilon_high": 0.3},
}
RULE_ONLY = {
    "cispo": {"cispo_cap": {"epsilon_high": 1.3}},
    "sapo": {"temperatures": {"sapo_temperature_pos": 2.0, "sapo_temperature_neg": 0.5}},
    "vespo": {"gamma": {"vespo_k_pos": 1.5, "vespo_lambda_pos": 2.0, "vespo_k_neg": 2.5, "vespo_lambda_neg": 1.5}},
}
CASES = [(lt, name, opts) for lt in FAMILY + RULES for name, opts in OPTIONS.items()]
CASES += [(lt, name, opts) for lt in FAMILY for name, opts in FAMILY_ONLY.items()]
CASES += [(lt, name, opts) for lt, extra in RULE_ONLY.items() for name, opts in extra.items()]


@pytest.mark.parametrize("loss_type,name,options", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_every_loss_type_and_option_equals_trls_own_loss(tmp_path, tok, loss_type, name, options):
    if any(k not in TRL_FIELDS for k in options):
        pytest.skip(f"this TRL has no {sorted(set(options) - TRL_FIELDS)}")
    model = tiny.build_tiny_model(tok).double()
    method = None if loss_type in RULES else "trl"  # a rule-naming loss type selects TRL's rule by itself
    a, b = _trainers(tmp_path, tok, model, {"loss_type": loss_type, **options}, method=method)
    inputs = _moved_inputs(a, model, tok, tool_mask=name == "none", sampling="opsm" in name)
    micro_batches = 2 if "entropy" in name else 1
    _, metrics = _assert_same(a, b, model, inputs, micro_batches=micro_batches)
    assert metrics["clip/frac_ratio_moved"] > 0.5  # the ratios really moved
    if "opsm" in name:
        assert 0 < metrics["clip/frac_dropped_sequence_mask"] < 1  # the mask acted, and not on everything
    if "entropy_mask" in name:
        assert 0 < metrics["clip/frac_dropped_entropy_mask"] < 1


def _trl_delta_rules():
    from atr_llm.config.trainer_config import trl_delta_rules

    return trl_delta_rules()


def _against_trls_clip(tmp_path, tok, model, delta, lower, upper, **ours_kw):
    """Our trainer (``ours_kw``, TRL's ``delta``) and TRL's with its clip set to ``[lower, upper]`` and that delta, on
    one batch: our loss and gradients, after asserting they equal TRL's (the tolerance of ``_assert_same``)."""
    ds = data.to_grpo_dataset(data.arithmetic_dataset(16))
    reward = rewards.CorrectnessReward()
    ours = ATRGRPOConfig(**grpo_config_kwargs(tmp_path / "a", delta=delta), **ours_kw)
    theirs = trl.GRPOConfig(
        **grpo_config_kwargs(tmp_path / "b", delta=delta, epsilon=1 - lower, epsilon_high=upper - 1)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = ATRGRPOTrainer(model=model, reward_funcs=[reward], args=ours, train_dataset=ds, processing_class=tok)
        b = trl.GRPOTrainer(model=model, reward_funcs=[reward], args=theirs, train_dataset=ds, processing_class=tok)
    if not trl_logps_kernel_available():
        b._get_per_token_logps_and_entropies = a._get_per_token_logps_and_entropies
    inputs = _moved_inputs(a, model, tok)
    a.beta = b.beta = 0.0
    ((la, ga),) = _loss_grads_metrics(a, model, inputs)[0]
    ((lb, gb),) = _loss_grads_metrics(b, model, inputs)[0]
    assert la.item() == pytest.approx(lb.item(), rel=1e-6, abs=1e-12)  # as _assert_same: TRL's float32 log-probs
    worst = max(
        float(torch.linalg.vector_norm(x - y)) / max(float(torch.linalg.vector_norm(y)), 1e-30)
        for x, y in zip(ga, gb)
        if x is not None
    )
    assert worst <= 3e-5
    return la, inputs


@pytest.mark.parametrize("rule", _trl_delta_rules())
def test_trls_delta_on_every_declared_range_equals_trls_own_clip_on_that_range(tmp_path, tok, rule):
    """Every rule that TRL's ``delta`` composes with (a declared finite ``ratio_range``), at its default parameters:
    the same loss and gradient as TRL's GRPOTrainer with epsilon = 1 - l, epsilon_high = u - 1 and that delta."""
    import atr_theory as at

    spec = at.get_method(rule)
    lower, upper = (float(b) for b in spec.ratio_range(**spec.defaults))
    model = tiny.build_tiny_model(tok).double()
    _against_trls_clip(tmp_path, tok, model, 1.3, lower, upper, method=rule)


@pytest.mark.parametrize("delta", [1.3, 3.0])  # below ATR's upper bound 1.422 (it caps A > 0) and above it
def test_trls_delta_on_atrs_min_form_equals_trls_two_sided_clip_on_atrs_range(tmp_path, tok, delta):
    """TRL's ``delta`` composes with ATR's min form as TRL applies it to its own clip: the same loss and gradient as
    TRL's GRPOTrainer with epsilon = 1 - l, epsilon_high = u - 1 and that delta."""
    import atr_theory as at

    lower, upper = at.kl3_clip_range(0.07)
    model = tiny.build_tiny_model(tok).double()
    la, inputs = _against_trls_clip(tmp_path, tok, model, delta, lower, upper, method="atr", divergence_delta=0.07)
    ours = ATRGRPOConfig(**grpo_config_kwargs(tmp_path / "d", delta=delta), method="atr", divergence_delta=0.07)
    assert ours.resolved_method.name == "dual_clip_higher" and ours.resolved_method.form == "min"
    if delta > upper:
        return  # the cap on A < 0 tokens (w > 3) may not act on this batch; below u the cap on A > 0 tokens does
    plain = ATRGRPOConfig(**grpo_config_kwargs(tmp_path / "c"), method="atr", divergence_delta=0.07)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = data.to_grpo_dataset(data.arithmetic_dataset(16))
        c = ATRGRPOTrainer(
            model=model, reward_funcs=[rewards.CorrectnessReward()], args=plain, train_dataset=ds, processing_class=tok
        )
    c.beta = 0.0
    ((lc, _),) = _loss_grads_metrics(c, model, inputs)[0]
    assert abs(lc.item() - la.item()) > 1e-3 * abs(la.item())  # far beyond the tolerance above


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "cispo", "vespo"])
def test_the_kl_penalty_with_each_ratio_level_equals_trls(tmp_path, tok, loss_type):
    """beta != 0 (TRL's k3 towards the reference, bias-corrected by the loss's own ratio: the token or the sequence
    ratio), the kl metric included."""
    model = tiny.build_tiny_model(tok).double()
    for level in ("token", "sequence"):
        method = None if loss_type in RULES else "trl"
        a, b = _trainers(
            tmp_path / level, tok, model, {"loss_type": loss_type, "importance_sampling_level": level}, method
        )
        _, metrics = _assert_same(a, b, model, _moved_inputs(a, model, tok), beta=0.05)
        assert metrics["kl"] > 0


@pytest.mark.parametrize("estimator", ["k1", "low_var_kl", "k3+"])
def test_the_kl_estimator_reaches_the_trainers_penalty(tmp_path, tok, estimator):
    """kl_estimator (verl's kl_penalty names, each pinned to verl's own function in tests/test_verl_oracle.py) is the
    trainer's per-token reference KL: the loss is the rule's plus beta times its aggregate, its gradient k2's for a
    '+' name, and the logged kl its mean; trl_k3 (the default) is TRL's (test above)."""
    model = tiny.build_tiny_model(tok).double()
    unbiased = {"use_bias_correction_kl": False} if "use_bias_correction_kl" in trl.GRPOConfig.__dataclass_fields__ else {}
    config = ATRGRPOConfig(**grpo_config_kwargs(tmp_path), method="clip", **unbiased)  # the estimator alone
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = ATRGRPOTrainer(
            model=model,
            reward_funcs=[rewards.CorrectnessReward()],
            args=config,
            train_dataset=data.to_grpo_dataset(data.arithmetic_dataset(16)),
            processing_class=tok,
        )
    # beta set after the trainer is built (as the tests above set it), so TRL loads no reference model from a hub
    trainer.args.beta = trainer.beta = 0.05
    trainer.args.kl_estimator = estimator  # a field written after the build meets the config's check (beta > 0)
    inputs = _moved_inputs(trainer, model, tok)
    batch = trainer._loss_inputs(model, inputs)
    out, loss, per_token_kl = trainer._policy_loss(inputs, batch)
    want = at.reference_kl(batch["logp"], inputs["ref_per_token_logps"], estimator)
    assert torch.equal(per_token_kl, want)  # (low_var_kl is trl_k3 here, its clamps idle: tests/test_verl_oracle.py)
    mask = batch["mask"].bool()
    aggregation = trl_loss_types()[trainer.loss_type].aggregation
    max_length = trainer.max_completion_length if aggregation == "dr_grpo" else None
    expected = out.loss + 0.05 * at.aggregate(want, mask, aggregation, max_length)
    assert torch.allclose(loss, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    "options,match",
    [
        ({"loss_type": "vespo", "use_vllm": True}, "vllm_importance_sampling_correction=True: .*VESPO"),
        (
            {"loss_type": "cispo", "method": "clip"},
            "method='clip': loss_type='cispo' is TRL's cispo.*leave method unset",
        ),
        (
            {"method": "atr", "form": "mask", "delta": 3.0},
            "delta=3.0: TRL's two-sided clip.*form 'mask'.*--divergence_delta",
        ),
        ({"method": "kl1", "delta": 3.0}, "delta=3.0: TRL's two-sided clip.*method='kl1'.*--divergence_delta"),
        ({"method": "trl", "delta": 1.0}, "delta=1.0.*expected delta > 1"),
        ({"method": "trl", "tau_pos": 2.0}, "tau_pos=2.0: set, but method 'trl' does not use it"),
        ({"loss_type": "nope"}, "loss_type='nope': expected one of grpo, "),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name_before_any_model_loads(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        ATRGRPOConfig(**grpo_config_kwargs(tmp_path, **options))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_a_mixture_of_experts_model_adds_trls_router_loss(tmp_path, tok, loss_type):
    """TRL's default router_aux_loss_coef (the architecture's own, 0.001 for Qwen3-MoE): the same loss, gradient
    and aux_loss metric as TRL's; the router loss really entered (setting its coefficient to 0 changes the loss)."""
    model = tiny_moe(tok)
    a, b = _trainers(tmp_path, tok, model, {"loss_type": loss_type})
    assert a.aux_loss_enabled and a.router_aux_loss_coef > 0
    inputs = _moved_inputs(a, model, tok)
    (results, metrics) = _assert_same(a, b, model, inputs, grad_tol=3e-4)
    assert metrics["aux_loss"] > 0
    a.router_aux_loss_coef = 0.0
    (without, _) = _loss_grads_metrics(a, model, inputs)
    assert without[0][0].item() != pytest.approx(results[0][0].item(), rel=1e-9)


def test_default_config_and_trls_positional_order(tmp_path, tok, monkeypatch):
    """As TRL: no args builds the default config ('<model name>-GRPO', the package's default method), and the
    arguments may come in TRL's positional order (model, reward_funcs, args, train_dataset, eval_dataset,
    processing_class)."""
    from atr_llm.trainer import default_output_dir

    monkeypatch.chdir(tmp_path)
    ds = data.to_grpo_dataset(data.arithmetic_dataset(16))
    model = tiny.build_tiny_model(tok)
    model.config._name_or_path = "org/tiny-qwen3"
    built = []
    real_post_init = ATRGRPOConfig.__post_init__

    def on_this_cpu(self):  # TRL's default config asks for bf16, which this CPU refuses: record, then run on CPU
        built.append(self.output_dir)
        self.use_cpu, self.bf16 = True, False
        real_post_init(self)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError) as stock_error:  # TRL's own default config on this CPU-only machine
            trl.GRPOTrainer(model, [rewards.CorrectnessReward()], train_dataset=ds, processing_class=tok)
        with pytest.raises(ValueError) as our_error:
            ATRGRPOTrainer(model, [rewards.CorrectnessReward()], train_dataset=ds, processing_class=tok)
        assert str(our_error.value) == str(stock_error.value)  # the same config, refused the same way
        monkeypatch.setattr(ATRGRPOConfig, "__post_init__", on_this_cpu)
        default = ATRGRPOTrainer(model, [rewards.CorrectnessReward()], train_dataset=ds, processing_class=tok)
        monkeypatch.undo()
        cfg = ATRGRPOConfig(**grpo_config_kwargs(tmp_path, method="clip"))
        positional = ATRGRPOTrainer(model, [rewards.CorrectnessReward()], cfg, ds, None, tok)
    assert built == [default.args.output_dir] == [default_output_dir(model)] == ["tiny-qwen3-GRPO"]
    assert default.args.method == "atr" and default.atr_method.name == "atr"
    assert default.args.loss_type == trl.GRPOConfig("x", use_cpu=True, bf16=False).loss_type
    assert positional.args is cfg and positional.processing_class is tok and positional.train_dataset is ds
    with pytest.raises(ValueError, match="needs args=ATRGRPOConfig.*got GRPOConfig"):
        ATRGRPOTrainer(model, [rewards.CorrectnessReward()], trl.GRPOConfig(**grpo_config_kwargs(tmp_path)), ds)


TRAINED = {
    "cispo": {"loss_type": "cispo", "epsilon_high": 1.2},
    "sapo+sequence": {"loss_type": "sapo", "importance_sampling_level": "sequence"},
    "vespo": {"loss_type": "vespo"},
    "luspo+sequence+delta": {"loss_type": "luspo", "importance_sampling_level": "sequence", "delta": 1.3},
    "dapo+opsm+entropy": {
        "loss_type": "dapo",
        "epsilon_high": 0.28,
        "off_policy_mask_threshold": 0.01,
        "top_entropy_quantile": 0.5,
        "use_adaptive_entropy": True,
        "entropy_coef": 0.01,
        "entropy_target": 10.0,
    },
}


@pytest.mark.parametrize("name", list(TRAINED))
def test_a_few_optimizer_steps_give_trls_weights(tmp_path, tok, name):
    """The same seed, the same generations, three optimizer steps (num_iterations = 2: the second pass over a batch
    sees ratios != 1): the same weights as TRL's GRPOTrainer, and the same logged TRL metrics. TRL's log-probs are
    float32 (its fused kernel), so equal formulas written differently (SAPO's expm1(y) against TRL's exp(y) - 1, a
    sequence mean's gradient summed in another order) differ in the last bit, and Adam, dividing a near-zero gradient
    by its own size, carries that into a few weights: the weights must agree to 1% of how far training moved them
    (seen: <= 0.2%, most cases bit for bit; a wrong formula or option moves them by tens of percent)."""
    options = TRAINED[name]
    if any(k not in TRL_FIELDS for k in options):
        pytest.skip("option not in this TRL")
    weights, logs = {}, {}
    for side in ("ours", "trl"):
        cfg_kw = grpo_config_kwargs(tmp_path / side, max_steps=3, learning_rate=5e-3, **options)
        method = {} if options["loss_type"] in RULES else {"method": "trl"}
        cfg = ATRGRPOConfig(**cfg_kw, **method) if side == "ours" else trl.GRPOConfig(**cfg_kw)
        cls = ATRGRPOTrainer if side == "ours" else trl.GRPOTrainer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = cls(
                model=tiny.build_tiny_model(tok).double(),
                reward_funcs=[lambda completions, **kw: [float(len(str(c)) % 3) for c in completions]],
                args=cfg,
                train_dataset=data.to_grpo_dataset(data.arithmetic_dataset(32)),
                processing_class=tok,
            )
            if side == "trl" and not trl_logps_kernel_available():  # TRL 1.15 without Triton: score with ours
                from atr_llm.trainer import ATRLossMixin

                ours_scorer = ATRLossMixin._get_per_token_logps_and_entropies
                trainer._get_per_token_logps_and_entropies = ours_scorer.__get__(trainer)
            trainer.train()
        weights[side] = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        logs[side] = [h for h in trainer.state.log_history if "loss" in h]
    start = tiny.build_tiny_model(tok).double().state_dict()
    moved = max(float((weights["trl"][k] - start[k]).abs().max()) for k in start)
    apart = max(float((weights["ours"][k] - weights["trl"][k]).abs().max()) for k in start)
    assert moved > 1e-3  # it trained
    assert apart <= 1e-2 * moved, (apart, moved)
    for ours, theirs in zip(logs["ours"], logs["trl"]):
        for key in theirs:
            if key.startswith(("clip_ratio", "cispo", "vespo", "entropy", "kl", "policy_loss")) or key == "loss":
                assert ours[key] == pytest.approx(theirs[key], rel=1e-3, abs=1e-6), key


def test_a_full_distribution_method_refuses_a_router_loss_it_cannot_add(tmp_path, tok):
    ds = data.to_grpo_dataset(data.arithmetic_dataset(16))
    cfg = ATRGRPOConfig(**grpo_config_kwargs(tmp_path, method="tr_ppo"))
    with warnings.catch_warnings(), pytest.raises(ValueError, match="tr_ppo.*no router loss.*router_aux_loss_coef=0"):
        warnings.simplefilter("ignore")
        ATRGRPOTrainer(tiny_moe(tok), [rewards.CorrectnessReward()], cfg, ds, processing_class=tok)


def _adaptive_entropy_run(tmp_path, tok, trainer_cls, config_cls, **extra):
    """TRL's ``test_train_with_adaptive_entropy*`` settings on the tiny model: entropy_target above any entropy, so the
    coefficient rises by ``entropy_coef_delta`` once per optimizer step; a checkpoint at the last step."""
    cfg = config_cls(
        **grpo_config_kwargs(
            tmp_path, max_steps=3, gradient_accumulation_steps=2, save_strategy="steps", save_steps=3, **extra
        ),
        entropy_coef=0.01,
        use_adaptive_entropy=True,
        entropy_target=15.0,
        entropy_coef_delta=0.005,
    )
    if not trl_logps_kernel_available() and trainer_cls is trl.GRPOTrainer:
        pytest.skip("TRL's own log-prob path needs Triton here")
    trainer = tiny_trainer(tok, cfg, trainer_cls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return trainer


def test_trls_adaptive_entropy_tests_pass_with_trls_entropy_coef_attribute(tmp_path, tok):
    """TRL's own assertions (tests/test_grpo_trainer.py, test_train_with_adaptive_entropy and its gradient-accumulation
    variant) read ``trainer.entropy_coef``: it moves once per optimizer step, as stock TRL's does on the same run, and
    TRL's checkpoint file holds the moved value (a resume restores it)."""
    import json

    if "use_adaptive_entropy" not in TRL_FIELDS:
        pytest.skip("this TRL has no use_adaptive_entropy")
    ours = _adaptive_entropy_run(tmp_path / "ours", tok, ATRGRPOTrainer, ATRGRPOConfig, method="trl")
    assert ours.state.log_history[-1]["train_loss"] is not None
    assert ours.entropy_coef > 0.01
    assert ours.entropy_coef == pytest.approx(min(0.01 + 0.005 * ours.state.global_step, 1.0), abs=1e-6)
    saved = json.loads((tmp_path / "ours" / "out" / "checkpoint-3" / "entropy_ctrl_state.json").read_text())
    assert saved["entropy_coef"] == pytest.approx(ours.entropy_coef)
    assert saved["last_world_entropy"] == pytest.approx(ours._last_world_entropy)
    theirs = _adaptive_entropy_run(tmp_path / "theirs", tok, trl.GRPOTrainer, trl.GRPOConfig)
    assert ours.entropy_coef == pytest.approx(theirs.entropy_coef, abs=1e-12)


def test_the_loss_types_honoured_are_exactly_the_ones_trl_documents():
    """``trl_loss_types()`` (TRL's PPO-clip family plus each rule's ``TRLPeer``) lists every ``loss_type`` TRL's own
    ``GRPOConfig`` documents as supported, and nothing else; the rules among them are exactly ``RULES``."""
    import dataclasses
    import re

    from atr_llm.config.trainer_config import trl_loss_type_rule, trl_loss_types

    help_text = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}["loss_type"].metadata["help"]
    supported = help_text[help_text.index("Supported values are") :].split(".")[0]
    assert set(trl_loss_types()) == set(re.findall(r"'(\w+)'", supported))
    assert {lt for lt in trl_loss_types() if trl_loss_type_rule(lt) is not None} == set(RULES)
