"""TRL's and transformers' own fields (``atr_llm.config.library_fields``): each value refused when the config is
built is one the library itself refuses later (shown by calling the library the way TRL does), and a value the
library takes is taken; a write after the build meets the same checks, the rule's included."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from transformers import GenerationConfig  # noqa: E402
from transformers.optimization import get_scheduler  # noqa: E402
from trl import ModelConfig  # noqa: E402

from atr_llm.config import ATRGRPOConfig, ConfigError, RunConfig, ScriptArguments  # noqa: E402

CPU = dict(use_cpu=True, bf16=False, report_to="none")


def _config(tmp_path, **kw) -> ATRGRPOConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ATRGRPOConfig(output_dir=str(tmp_path), **CPU, **kw)


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("reward_weights", [math.nan], r"^reward_weights=nan: expected a finite number$"),
        ("reward_weights", ["1.0"], r"^reward_weights='1\.0': expected a finite number, got a text$"),
        ("reward_weights", 0.5, r"^reward_weights=0\.5: expected a list of finite numbers, one per reward function$"),
        ("log_level", "bogus", r"^log_level='bogus': expected one of detail, debug, info"),
        ("scale_rewards", "bogus", r"^scale_rewards='bogus': expected one of group, batch, none$"),
        ("warmup_steps", 1e300, r"^warmup_steps=1e\+300: expected 0, a fraction .* in \[1, 2147483647\]$"),
        ("cache_implementation", "bogus", r"^cache_implementation='bogus': expected one of static"),
        ("pad_to_multiple_of", "abc", r"^pad_to_multiple_of='abc': expected an integer >= 1, 'auto' or None$"),
        ("pad_to_multiple_of", 0, r"^pad_to_multiple_of=0: expected an integer >= 1"),
        ("lr_scheduler_kwargs", {"bogus_kwarg": 1}, r"'bogus_kwarg' is not a parameter of the linear scheduler"),
        ("generation_kwargs", {"max_new_tokens": -5}, r"transformers refuses it: `max_new_tokens` must be"),
        ("generation_kwargs", {"temperature": -1.0}, r"transformers refuses it: `temperature` \(=-1\.0\) has to be"),
        ("generation_kwargs", {"top_k": -2}, r"transformers refuses it: `top_k` has to be a strictly positive"),
        ("generation_kwargs", {"bogus": 1}, r"'bogus' is not an attribute of GenerationConfig$"),
        ("generation_kwargs", ["top_k"], r"expected a mapping of GenerationConfig attributes$"),
        ("multi_objective_aggregation", "bogus", r"expected one of sum_then_normalize, normalize_then_sum$"),
        ("neftune_noise_alpha", -1.0, r"^neftune_noise_alpha=-1\.0: expected a finite number > 0$"),
        ("ref_model_mixup_alpha", 2.0, r"expected a finite number >= 0 and <= 1$"),
        ("ref_model_sync_steps", 0, r"expected an integer >= 1"),
        ("optim_args", "foo", r"'foo' is not key=value"),
        ("optim_args", "momentum=0.5", r"the adamw_torch_fused optimizer never reads it"),
        ("torch_compile_backend", "bogus", r"^torch_compile_backend='bogus': expected one of no, eager"),
        ("label_smoothing_factor", 0.1, r"expected 0: GRPO's loss never reads it"),
        ("sync_ref_model", True, r"needs a reference model: set beta > 0"),
        ("accelerator_config", {"bogus": 1}, r"'bogus' is not a field of AcceleratorConfig"),
        ("accelerator_config", '{"bogus": 1}', r"'bogus' is not a field of AcceleratorConfig"),
        ("accelerator_config", "{bogus: 1}", r"not valid JSON \(Expecting property name"),
        ("lr_scheduler_kwargs", "{x", r"^lr_scheduler_kwargs='\{x': not valid JSON"),
    ],
)
def test_a_library_fields_bad_value_is_refused_when_the_config_is_built(tmp_path, field, value, expected):
    with pytest.raises(ConfigError, match=expected):
        _config(tmp_path, **{field: value})


@pytest.mark.parametrize(
    "field, value, read",
    [
        ("reward_weights", [0.5], [0.5]),
        ("reward_weights", [np.float64(2.0)], [2.0]),
        ("scale_rewards", True, "group"),  # TRL's own reading of a flag
        ("scale_rewards", False, "none"),
        ("scale_rewards", "batch", "batch"),
        ("pad_to_multiple_of", "8", 8),
        ("pad_to_multiple_of", "none", None),
        ("pad_to_multiple_of", 16, 16),
        ("warmup_steps", 0.1, 0.1),
        ("cache_implementation", "static", "static"),
        ("generation_kwargs", {"top_k": 5, "use_cache": False}, {"top_k": 5, "use_cache": False}),
    ],
)
def test_a_value_the_library_takes_is_taken_as_trl_reads_it(tmp_path, field, value, read):
    assert getattr(_config(tmp_path, **{field: value}), field) == read


def test_the_scheduler_kwargs_refused_are_those_transformers_refuses_and_those_taken_run(tmp_path):
    """The peer is the spec: ``get_scheduler`` with a key the scheduler does not take raises (at the first step,
    in a run); a key it takes builds the scheduler."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(TypeError, match="bogus_kwarg"):
        get_scheduler("cosine", optimizer, 1, 10, scheduler_specific_kwargs={"bogus_kwarg": 1})
    with pytest.raises(ConfigError, match=r"'bogus_kwarg' is not a parameter of the cosine scheduler"):
        _config(tmp_path, lr_scheduler_type="cosine", lr_scheduler_kwargs={"bogus_kwarg": 1})
    get_scheduler("cosine", optimizer, 1, 10, scheduler_specific_kwargs={"num_cycles": 1.0})
    assert _config(tmp_path, lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 1.0}).lr_scheduler_kwargs


def test_the_generation_kwargs_refused_are_those_trls_generation_config_refuses(tmp_path):
    """TRL 1.16 builds ``GenerationConfig(**{its settings, **generation_kwargs}, disable_compile=True)`` in
    ``GRPOTrainer.__init__``: the same construction raises on what the config refuses, and not on ``top_k`` alone
    (TRL samples, so ``do_sample`` is set)."""
    trl_settings = dict(max_new_tokens=256, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, min_p=None)
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationConfig(**{**trl_settings, "max_new_tokens": -5}, disable_compile=True)
    GenerationConfig(**{**trl_settings, "top_k": 5}, disable_compile=True)
    with pytest.raises(ConfigError):
        _config(tmp_path, generation_kwargs={"max_new_tokens": -5})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_new_tokens": 3}, r"max_new_tokens=3 would override max_completion_length \(8\): .*set max_completion_length"),
        ({"temperature": 0.5}, r"temperature=0\.5 would override temperature \(1\.0\): .*divides the logits"),
        ({"do_sample": False}, r"do_sample: GRPO samples its groups"),
    ],
)
def test_a_generation_kwarg_that_overrides_trls_own_field_is_refused_as_trl_would_drop_the_field(tmp_path, kwargs, match):
    """TRL 1.16's own trainer lays ``generation_kwargs`` over the settings it takes from its fields: built with
    ``max_completion_length=8`` and ``{"max_new_tokens": 3}`` its generation config says 3, and the field is
    dropped. The config refuses a different value where the field was set too (here ``max_completion_length``; a
    temperature always, which the loss divides the logits by) and takes the field's own value, or a key whose field
    is at its default (``top_k``: the one way it was given)."""
    from grpo_helpers import grpo_config_kwargs, tiny_trainer
    from trl import GRPOConfig, GRPOTrainer

    from atr_llm.tiny import build_tokenizer_and_model

    tok, model = build_tokenizer_and_model(seed=0)
    peer_config = GRPOConfig(**grpo_config_kwargs(tmp_path, generation_kwargs=kwargs))
    peer = tiny_trainer(tok, peer_config, GRPOTrainer, model=model)
    for key, value in kwargs.items():
        assert getattr(peer.generation_config, key) == value  # TRL's field lost to the mapping
    with pytest.raises(ConfigError, match=match):
        ATRGRPOConfig(**grpo_config_kwargs(tmp_path, generation_kwargs=kwargs))
    same = ATRGRPOConfig(**grpo_config_kwargs(tmp_path, generation_kwargs={"max_new_tokens": 8, "temperature": 1.0}))
    assert same.generation_kwargs == {"max_new_tokens": 8, "temperature": 1.0}
    alone = ATRGRPOConfig(**grpo_config_kwargs(tmp_path, generation_kwargs={"top_k": 5}))
    assert alone.generation_kwargs == {"top_k": 5}
    with pytest.raises(ConfigError, match=r"top_k=5 would override top_k \(3\)"):
        ATRGRPOConfig(**grpo_config_kwargs(tmp_path, top_k=3, generation_kwargs={"top_k": 5}))


@pytest.mark.parametrize("settings", [{"temperature": -1.0}, {"top_p": -0.5}, {"top_k": -2}, {"repetition_penalty": 0.0}])
def test_sampling_values_refused_are_those_transformers_generate_refuses(tmp_path, settings):
    """The peer is the spec: a tiny model's ``generate`` with TRL's settings and ``settings`` laid over them raises
    ValueError (at the first generation, in a run); the config refuses the same mapping when it is built. (A
    ``top_p`` of 1.5 is not among them: ``generate`` builds no top-p warper for ``top_p >= 1`` and samples as at 1.)"""
    from atr_llm import tiny

    tok = tiny.build_tiny_tokenizer()
    model = tiny.build_tiny_model(tok)
    trl_settings = dict(max_new_tokens=2, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, min_p=None)
    config = GenerationConfig(**{**trl_settings, **settings}, disable_compile=True)
    with pytest.raises(ValueError):
        model.generate(torch.ones(1, 3, dtype=torch.long), generation_config=config, pad_token_id=0)
    with pytest.raises(ConfigError, match=r"^generation_kwargs=.*: transformers refuses it"):
        _config(tmp_path, generation_kwargs=settings)
    model.generate(  # and TRL's own settings alone generate
        torch.ones(1, 3, dtype=torch.long), generation_config=GenerationConfig(**trl_settings), pad_token_id=0
    )


def test_a_write_after_the_build_meets_the_same_checks_and_leaves_the_config_as_it_was(tmp_path):
    config = _config(tmp_path)
    for field, value in [
        ("lr_scheduler_type", "bogus"),
        ("scale_rewards", "bogus"),
        ("pad_to_multiple_of", "x"),
        ("generation_kwargs", {"bogus": 1}),
        ("log_level", "bogus"),
    ]:
        before = getattr(config, field)
        with pytest.raises(ConfigError, match=rf"^{field}="):
            setattr(config, field, value)
        assert getattr(config, field) == before
    config.lr_scheduler_type = "cosine"  # and then its kwargs are read against the cosine scheduler
    with pytest.raises(ConfigError, match="of the cosine scheduler"):
        config.lr_scheduler_kwargs = {"bogus_kwarg": 1}


def test_use_vllm_written_after_the_build_meets_vespos_refusal(tmp_path):
    """VESPO refuses TRL's vLLM importance-sampling correction (the trainer does not fold it into the sequence
    weight): setting ``use_vllm`` after the build is refused by that rule, not taken."""
    config = _config(tmp_path, method="vespo", vllm_importance_sampling_correction=True)
    with pytest.raises(ConfigError, match=r"^vllm_importance_sampling_correction=True: TRL folds vLLM"):
        config.use_vllm = True
    assert config.use_vllm is False and config.resolved_method.name == "vespo"


def test_a_train_run_takes_one_reward_weight(tmp_path):
    """``atr_llm.train`` scores with one reward function; TRL refuses another count only when the trainer is built
    (after the SFT stage)."""
    script, model = ScriptArguments(), ModelConfig(model_name_or_path="tiny")
    with pytest.raises(ConfigError, match=r"^reward_weights=\[1\.0, 2\.0\]: expected 1 finite number"):
        RunConfig(script, _config(tmp_path, reward_weights=[1.0, 2.0]), model)
    assert RunConfig(script, _config(tmp_path, reward_weights=[2.0]), model).training.reward_weights == [2.0]


def test_model_config_dtype_meets_its_declared_choices(tmp_path):
    with pytest.raises(ConfigError, match=r"^dtype='float13': expected one of auto, bfloat16, float16, float32$"):
        RunConfig(ScriptArguments(), _config(tmp_path), ModelConfig(model_name_or_path="tiny", dtype="float13"))


def test_optim_args_is_refused_exactly_where_transformers_drops_it(tmp_path):
    """The peer's behaviour is the spec: ``Trainer.get_optimizer_cls_and_kwargs`` gives the same optimizer kwargs with
    and without ``optim_args`` for the default optimizer (it drops them: refused here), different ones for sgd (it
    reads them: taken here)."""
    from transformers import Trainer, TrainingArguments

    def kwargs(**kw):
        args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)
        return Trainer.get_optimizer_cls_and_kwargs(args)[1]

    default = _config(tmp_path).optim
    assert kwargs(optim=default, optim_args="momentum=0.5") == kwargs(optim=default)
    with pytest.raises(ConfigError, match="never reads it"):
        _config(tmp_path, optim_args="momentum=0.5")
    assert kwargs(optim="sgd", optim_args="momentum=0.5") != kwargs(optim="sgd")
    assert _config(tmp_path, optim="sgd", optim_args="momentum=0.5").optim_args == "momentum=0.5"
    config = _config(tmp_path, optim="sgd", optim_args="momentum=0.5")
    with pytest.raises(ConfigError, match="never reads it"):  # a write of the optimizer meets the same check
        config.optim = default
    assert config.optim == "sgd"


def test_the_reference_sync_and_compile_backend_take_the_values_their_libraries_take(tmp_path):
    from accelerate.utils import DynamoBackend

    assert _config(tmp_path, sync_ref_model=True, beta=0.1, ref_model_sync_steps=4).sync_ref_model
    for backend in ("inductor", "INDUCTOR", "eager"):
        assert DynamoBackend(backend.upper())  # accelerate's own enum takes it
        assert _config(tmp_path, torch_compile_backend=backend).torch_compile_backend.upper() == backend.upper()
    assert _config(tmp_path, accelerator_config={"split_batches": False}).accelerator_config.split_batches is False


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("eval_strategy", "steps", r"^eval_strategy='steps': expected no: atr_llm.train passes no evaluation dataset"),
        ("model_init_kwargs", {"dtype": "float13"}, r"^model_init_kwargs=.*: is not read: atr_llm.train builds"),
    ],
)
def test_a_run_refuses_a_library_field_it_cannot_honour(tmp_path, field, value, expected):
    extra = {"eval_steps": 1} if field == "eval_strategy" else {}
    with pytest.raises(ConfigError, match=expected):
        RunConfig(ScriptArguments(tiny=True, sft_steps=0), _config(tmp_path, **{field: value}, **extra), ModelConfig())


def test_push_to_hub_needs_a_token_and_a_script_field_written_after_the_build_is_checked_again(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(ConfigError, match="^push_to_hub=True: needs a Hugging Face token"):
        RunConfig(ScriptArguments(tiny=True, sft_steps=0), _config(tmp_path, push_to_hub=True), ModelConfig())
    script = ScriptArguments(tiny=True)
    script.sft_steps = -5
    with pytest.raises(ConfigError, match="^sft_steps=-5"):
        RunConfig(script, _config(tmp_path), ModelConfig())


TINY = Path(__file__).resolve().parents[1] / "atr_llm" / "configs" / "cpu-tiny.yaml"


@pytest.mark.parametrize(
    "argv",
    [
        ["--lr_scheduler_type", "cosine", "--lr_scheduler_kwargs", '{"num_cycles": 0.5}'],
        ["--generation_kwargs", '{"top_k": 5}'],
    ],
)
def test_a_mapping_typed_as_json_on_the_command_line_is_read_as_the_mapping(tmp_path, argv):
    """transformers parses the JSON text of its mapping fields (``_VALID_DICT_FIELDS``); the checks read the mapping
    that text gives, so a valid one typed on the command line is accepted (it was refused as 'expected a mapping')."""
    from atr_llm import train

    run = train.parse(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), *argv])
    field = argv[-2].removeprefix("--")
    assert getattr(run.training, field) == json.loads(argv[-1])


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--lr_scheduler_type", "polynomial", "--lr_scheduler_kwargs", '{"lr_end": 1.0}'], "lr_end 1.0 must be below"),
        (["--generation_kwargs", '{"num_beams": 0}'], "num_beams=0: expected an integer >= 1"),
        (["--generation_kwargs", "[1, 2]"], "expected a mapping of GenerationConfig attributes"),
    ],
)
def test_a_mapping_transformers_would_refuse_at_the_first_step_is_refused_when_typed(tmp_path, argv, match):
    from atr_llm import train

    with pytest.raises(ValueError, match=f"^{argv[-2]} .*{match}"):
        train.parse(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), *argv])
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------------------------
# fields the peers read late (after the output folder, the model or SFT) or drop silently, refused when planned;
# each peer's own behaviour on the same value is shown beside the refusal
# ---------------------------------------------------------------------------------------------------------------
def _peer_refuses(call, error=Exception, match=None):
    with pytest.raises(error, match=match):
        call()


def test_a_scheduler_missing_a_parameter_it_needs_is_refused_as_transformers_refuses_it(tmp_path):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    for scheduler, kwargs, peer_error in (
        ("cosine_with_min_lr", {}, ValueError),
        ("warmup_stable_decay", {}, TypeError),
    ):
        _peer_refuses(lambda: get_scheduler(scheduler, optimizer, 1, 10, scheduler_specific_kwargs=kwargs), peer_error)
        with pytest.raises(ConfigError, match=rf"^lr_scheduler_type='{scheduler}': needs .* in lr_scheduler_kwargs"):
            _config(tmp_path, lr_scheduler_type=scheduler)
    taken = {"min_lr": 1e-6}
    get_scheduler("cosine_with_min_lr", optimizer, 1, 10, scheduler_specific_kwargs=taken)
    assert _config(tmp_path, lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs=taken).lr_scheduler_kwargs
    taken = {"num_decay_steps": 2}
    get_scheduler("warmup_stable_decay", optimizer, 1, 10, scheduler_specific_kwargs=taken)
    assert _config(tmp_path, lr_scheduler_type="warmup_stable_decay", lr_scheduler_kwargs=taken).lr_scheduler_kwargs


def test_torch_compile_mode_and_checkpointing_kwargs_meet_torchs_own_domains(tmp_path):
    from torch.utils.checkpoint import checkpoint

    _peer_refuses(lambda: torch.compile(torch.nn.Linear(1, 1), mode="bogus"), RuntimeError, "Unrecognized mode")
    with pytest.raises(ConfigError, match=r"^torch_compile_mode='bogus': expected one of default"):
        _config(tmp_path, torch_compile_mode="bogus")
    assert _config(tmp_path, torch_compile_mode="max-autotune").torch_compile_mode == "max-autotune"
    x = torch.ones(2, requires_grad=True)
    _peer_refuses(lambda: checkpoint(torch.sin, x, bogus=True), ValueError, "bogus")
    with pytest.raises(ConfigError, match=r"'bogus' is not one of torch's"):
        _config(tmp_path, gradient_checkpointing_kwargs={"bogus": True})
    with pytest.raises(ConfigError, match=r"use_reentrant 'maybe': expected true or false"):
        _config(tmp_path, gradient_checkpointing_kwargs={"use_reentrant": "maybe"})
    checkpoint(torch.sin, x, use_reentrant=False)
    assert _config(tmp_path, gradient_checkpointing_kwargs={"use_reentrant": False}).gradient_checkpointing_kwargs


def test_fields_a_grpo_run_never_reads_are_refused_not_dropped(tmp_path):
    """transformers reads ``optim_target_modules`` only in its GaLore / APOLLO handlers (grep of its trainer's
    optimizer module: every other optimizer ignores it), and ``label_names`` only for evaluation losses."""
    import inspect

    import transformers.trainer_optimizer as optimizers

    own = [f for f in vars(optimizers).values() if inspect.isfunction(f) and f.__module__ == optimizers.__name__]
    readers = [f.__name__ for f in own if "optim_target_modules" in inspect.getsource(f)]
    assert readers == ["_setup_low_rank_optimizer"]
    with pytest.raises(ConfigError, match=r"^optim_target_modules=.*never reads it \(only GaLore and APOLLO do\)"):
        _config(tmp_path, optim="adamw_torch", optim_target_modules=["q_proj"])
    with pytest.raises(ConfigError, match=r"^label_names=\['foo'\]: expected it unset"):
        _config(tmp_path, label_names=["foo"])
    with pytest.raises(ConfigError, match=r"^chat_template_kwargs='\[1, 2\]': expected a mapping"):
        _config(tmp_path, chat_template_kwargs="[1, 2]")


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--save_strategy", "best"], r"^--save_strategy best: atr_llm.train evaluates nothing"),
        (["--fp16", "true"], r"^--fp16 true: needs a GPU"),
        (["--fsdp", "full_shard"], r"^--fsdp full_shard: needs a distributed launch"),
        (["--attn_implementation", "flash_attention_2"], r"^--attn_implementation flash_attention_2: needs the flash"),
        (["--dataset_limit", "2"], r"^--dataset_limit 2: 2 prompts, fewer than one generation's 4"),
        (["--use_peft", "true", "--lora_target_modules", "q_projx"], r"^--lora_target_modules q_projx: the model has no"),
        (["--use_peft", "true", "--lora_target_modules", "q_proj", "v_projx"], r"^--lora_target_modules .*no such module"),
        (["--deepspeed", "ds.json"], r"^--deepspeed ds.json: needs DeepSpeed, which is not installed"),
    ],
)
def test_a_run_refuses_what_this_machine_or_its_peers_would_refuse_after_work(tmp_path, argv, match):
    """Each of these was refused by transformers, accelerate or PEFT after the output folder, the model or the SFT
    stage (or, for fp16 on a CPU and a 2-prompt set, ran to a "finished" run that trained nothing in that form)."""
    from atr_llm import train

    if "fp16" in argv and torch.cuda.is_available():
        pytest.skip("fp16 is honoured on a GPU")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=match):
            train.parse(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), *argv])
    assert not (tmp_path / "run").exists()


def test_the_lora_targets_refused_are_those_peft_refuses(tmp_path):
    """PEFT's rule (a list item matches a module name or a name's last parts; a single text is a pattern matched
    against whole names): the refused targets make ``get_peft_model`` raise, the taken ones wrap the model."""
    from peft import LoraConfig, get_peft_model

    from atr_llm import train
    from atr_llm.tiny import build_tokenizer_and_model

    base = ["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--use_peft", "true", "--lora_target_modules"]
    for targets, refused in ((["q_projx"], True), (["q_proj"], True), ([".*q_proj"], False), (["q_proj", "v_proj"], False)):
        peft_targets = targets[0] if len(targets) == 1 else targets  # one typed value is a text, as TRL passes it
        _, model = build_tokenizer_and_model("toy")
        if refused:
            _peer_refuses(lambda: get_peft_model(model, LoraConfig(target_modules=peft_targets)), ValueError)
            with pytest.raises(ValueError, match="^--lora_target_modules"):
                train.parse([*base, *targets])
        else:
            get_peft_model(model, LoraConfig(target_modules=peft_targets))
            assert train.parse([*base, *targets]).model.lora_target_modules == peft_targets


def test_scheduler_values_transformers_fails_on_are_refused_and_nonsense_counts_too(tmp_path):
    """A text cycle count and an unknown decay shape fail in transformers at the first step (the peer's own error,
    shown); a negative cycle count runs there as its absolute value and is refused as meaningless here."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)

    def first_step(kind, kwargs):
        get_scheduler(kind, optimizer, 1, 10, scheduler_specific_kwargs=kwargs).step()

    _peer_refuses(lambda: first_step("cosine", {"num_cycles": "abc"}), (TypeError, ValueError))
    _peer_refuses(lambda: first_step("warmup_stable_decay", {"num_decay_steps": 2, "decay_type": "bogus"}), ValueError)
    for kind, kwargs, match in (
        ("cosine", {"num_cycles": "abc"}, r"num_cycles 'abc': expected a finite number"),
        ("warmup_stable_decay", {"num_decay_steps": 2, "decay_type": "bogus"}, r"decay_type 'bogus': expected one of"),
        ("cosine_with_restarts", {"num_cycles": -3}, r"num_cycles -3: expected a number > 0"),
        ("cosine_with_min_lr", {"min_lr_rate": 2.0}, r"min_lr_rate 2.0: expected a rate in \[0, 1\]"),
    ):
        with pytest.raises(ConfigError, match=rf"^lr_scheduler_kwargs=.*{match}"):
            _config(tmp_path, lr_scheduler_type=kind, lr_scheduler_kwargs=kwargs)
    first_step("warmup_stable_decay", {"num_decay_steps": 2, "decay_type": "1-sqrt"})
    assert _config(tmp_path, lr_scheduler_type="warmup_stable_decay",
                   lr_scheduler_kwargs={"num_decay_steps": 2, "decay_type": "1-sqrt"}).lr_scheduler_kwargs


def test_a_lora_task_type_other_than_a_causal_lm_is_refused(tmp_path):
    """PEFT wraps the model as the task type says (``SEQ_CLS``: a sequence classifier) without a word; GRPO trains a
    causal LM."""
    from peft import LoraConfig, get_peft_model
    from peft.peft_model import PeftModelForCausalLM, PeftModelForSequenceClassification

    from atr_llm import train
    from atr_llm.tiny import build_tokenizer_and_model

    _, model = build_tokenizer_and_model("toy")
    wrapped = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", target_modules=["q_proj"]))
    assert isinstance(wrapped, PeftModelForSequenceClassification)
    _, model = build_tokenizer_and_model("toy")
    assert isinstance(get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", target_modules=["q_proj"])),
                      PeftModelForCausalLM)
    base = ["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--use_peft", "true"]
    with pytest.raises(ValueError, match=r"^--lora_task_type SEQ_CLS: expected one of CAUSAL_LM"):
        train.parse([*base, "--lora_task_type", "SEQ_CLS"])
    assert train.parse([*base, "--lora_task_type", "CAUSAL_LM"]).model.lora_task_type == "CAUSAL_LM"


def test_optim_args_values_the_optimizer_cannot_read_are_refused_as_transformers_refuses_them(tmp_path):
    """transformers' SGD handler reads ``momentum`` with ``float()``: ``momentum=abc`` failed there when the
    optimizer was built, after the SFT stage (the peer's own call is the check)."""
    from transformers import Trainer

    with pytest.raises(ConfigError, match=r"^optim_args='momentum=abc': the sgd optimizer cannot read it"):
        _config(tmp_path, optim="sgd", optim_args="momentum=abc")
    config = _config(tmp_path, optim="sgd", optim_args="momentum=0.9")
    assert Trainer.get_optimizer_cls_and_kwargs(config)[1]["momentum"] == 0.9


@pytest.mark.parametrize(
    "text, said",
    [
        ('!!python/object/apply:os.system ["touch ran"]\n', "could not determine a constructor for the tag .* line 1"),
        ("a: 1\n---\nb: 2\n", "found another document at line 2"),
        ("g:\n\tk: 5\n", "found character '\\\\t' that cannot start any token at line 2"),
        ("a: *x\nb: &x 1\n", "found undefined alias 'x' at line 1"),
    ],
)
def test_an_unreadable_yaml_file_is_refused_with_pyyamls_reason_and_place(tmp_path, text, said):
    from atr_llm import train

    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ValueError, match=rf"^--config .*c.yaml: not a readable YAML file: .*{said}"):
        train.parse(["--config", str(tmp_path / "c.yaml"), "--output_dir", str(tmp_path / "run")])
    assert not (tmp_path / "ran").exists() and not (Path.cwd() / "ran").exists()


def test_a_completion_longer_than_the_models_positions_is_refused_where_transformers_only_warns(tmp_path):
    """transformers runs the tiny model (512 positions, RoPE) past its last position without an error, on positions
    it never trained; a run whose completion alone runs past them is refused, naming the positions. A local folder's
    ``config.json`` is read the same way, unless a RoPE scaling stretches its positions."""
    from atr_llm.tiny import TINY_POSITIONS, build_tokenizer_and_model

    _, model = build_tokenizer_and_model(seed=0)
    assert model.config.max_position_embeddings == TINY_POSITIONS == 512
    with torch.no_grad():
        logits = model(torch.ones(1, TINY_POSITIONS + 8, dtype=torch.long)).logits
    assert logits.shape[1] == TINY_POSITIONS + 8  # no refusal from the peer
    with pytest.raises(ConfigError, match=r"^max_completion_length=513: expected at most 512: the model has 512"):
        RunConfig(ScriptArguments(tiny=True), _config(tmp_path, max_completion_length=513), ModelConfig())
    RunConfig(ScriptArguments(tiny=True), _config(tmp_path, max_completion_length=512), ModelConfig())
    folder = tmp_path / "model"
    folder.mkdir()
    model.config.save_pretrained(folder)
    local = ModelConfig(model_name_or_path=str(folder))
    with pytest.raises(ConfigError, match="the model has 512 positions"):
        RunConfig(ScriptArguments(), _config(tmp_path, max_completion_length=600), local)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    (folder / "config.json").write_text(json.dumps(config))
    RunConfig(ScriptArguments(), _config(tmp_path, max_completion_length=600), local)
    from atr_llm.config.run import model_positions

    for damaged in ("[1, 2]", '{"rope_parameters": [1]}', '{"max_position_embeddings": true}'):
        (folder / "config.json").write_text(damaged)  # not read as positions (the model check names the file)
        assert model_positions(ScriptArguments(), local) is None


CPU_ARGV = ["--tiny", "true", "--bf16", "false", "--use_cpu", "true"]


@pytest.mark.parametrize("written, read_by_yaml", [("0x10", 16), ("010", 8), ("1_000", 1000), ("1:30", 90), ("0b11", 3)])
def test_a_yaml_number_the_command_line_would_refuse_is_refused_in_the_file_too(tmp_path, written, read_by_yaml):
    """PyYAML (YAML 1.1) reads ``seed: 0x10`` as 16 and ``010`` as 8, where ``--seed 0x10`` is refused and ``--seed
    010`` is 10: the file's number is read as its text by the option's own parser, as the command line's is."""
    import yaml

    from atr_llm import train

    assert yaml.safe_load(f"seed: {written}") == {"seed": read_by_yaml}  # the peer's reading
    (tmp_path / "c.yaml").write_text(f"tiny: true\nbf16: false\nuse_cpu: true\nseed: {written}\n")
    argv = ["--config", str(tmp_path / "c.yaml"), "--output_dir", str(tmp_path / "run")]
    if written == "010":  # a decimal the command line reads: the same value both ways
        assert train.parse(argv).training.seed == train.parse([*CPU_ARGV, "--seed", "010", *argv[2:]]).training.seed == 10
        return
    with pytest.raises(ValueError) as typed:
        train.parse([*CPU_ARGV, "--seed", written, *argv[2:]])
    with pytest.raises(ValueError, match=rf"^--config .*c\.yaml: key seed: {written}: ") as filed:
        train.parse(argv)
    assert str(filed.value).split(": ")[-1] == str(typed.value).split(": ")[-1]  # one check, one wording


def test_a_key_beside_a_yaml_merge_key_overrides_it_and_a_key_written_twice_is_still_refused(tmp_path):
    """YAML's merge (``<<``) gives the mapping's own keys the last word: PyYAML's reading; a key written twice is
    still refused, naming both lines."""
    import yaml

    from atr_llm import train

    text = "tiny: true\nbf16: false\nuse_cpu: true\n<<: {max_steps: 3, seed: 2}\nmax_steps: 1\n"
    assert yaml.safe_load(text)["max_steps"] == 1  # the peer's reading
    (tmp_path / "c.yaml").write_text(text)
    config = train.parse(["--config", str(tmp_path / "c.yaml"), "--output_dir", str(tmp_path / "run")])
    assert (config.training.max_steps, config.training.seed) == (1, 2)
    (tmp_path / "c.yaml").write_text("tiny: true\nbf16: false\nuse_cpu: true\nmax_steps: 3\nmax_steps: 1\n")
    with pytest.raises(ValueError, match=r"key max_steps is given twice \(lines 4 and 5\)"):
        train.parse(["--config", str(tmp_path / "c.yaml"), "--output_dir", str(tmp_path / "run")])


@pytest.mark.parametrize("strategy", ["epoch", "no"])
def test_save_steps_under_another_strategy_is_refused_where_transformers_never_saves_by_it(tmp_path, strategy):
    """transformers' own ``DefaultFlowCallback`` saves at step 7 with ``save_steps=7`` under ``steps`` and not under
    ``epoch`` / ``no``: there the option is dropped silently, so the config refuses it, naming the strategy."""
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import DefaultFlowCallback

    def saves_at_step_7(save_strategy: str) -> bool:
        args = TrainingArguments(output_dir=str(tmp_path), save_strategy=save_strategy, save_steps=7, **CPU)
        state = TrainerState(global_step=7, max_steps=100, save_steps=args.save_steps)  # as Trainer.train sets it
        return DefaultFlowCallback().on_step_end(args, state, TrainerControl()).should_save

    assert saves_at_step_7("steps") and not saves_at_step_7(strategy)
    with pytest.raises(ConfigError, match=r"^save_steps=7: needs save_strategy steps"):
        _config(tmp_path, save_strategy=strategy, save_steps=7)
    assert _config(tmp_path, save_strategy="steps", save_steps=7).save_steps == 7
