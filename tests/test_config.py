"""One way in: every way a value reaches a training run (the Python constructors, the command line, a ``--config``
YAML file, the environment, ``--resume_from_checkpoint``) goes through the one check of ``atr_llm.config``, and is
refused before any work, naming the argument as the user gave it. The method is resolved once per config."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import typing
from pathlib import Path

import pytest

pytest.importorskip("trl")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from trl import ModelConfig  # noqa: E402

import atr_theory as at  # noqa: E402
from atr_llm import checkpoints, train  # noqa: E402
from atr_llm.command_line import UsageError  # noqa: E402
from atr_llm.config import ATRGRPOConfig, ConfigError, RunConfig, ScriptArguments  # noqa: E402
from atr_llm.config import fields as config_fields  # noqa: E402
from atr_llm.config.trainer_config import method_fields  # noqa: E402
from atr_llm.relations import Exclusive, Requires  # noqa: E402
from tests.fuzzing import as_text, bad_values, breaking_assignment, candidates  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "atr_llm" / "configs" / "cpu-tiny.yaml"
CPU = dict(use_cpu=True, bf16=False, report_to="none")


def _training(tmp_path, **kw) -> ATRGRPOConfig:
    return ATRGRPOConfig(**{"output_dir": str(tmp_path / "run"), **CPU, **kw})


# ---------------------------------------------------------------------------------------------------- resolved once
def test_the_method_is_resolved_once_per_config_and_reading_it_resolves_nothing(tmp_path, monkeypatch):
    calls = []
    real = at.resolve
    monkeypatch.setattr(at, "resolve", lambda *a, **k: calls.append(a) or real(*a, **k))
    config = _training(tmp_path, method="atr", divergence_delta=0.05)
    assert len(calls) == 1
    for _ in range(10):
        assert config.resolved_method.params["delta"] == 0.05
    assert len(calls) == 1  # reads do not resolve again
    config.divergence_delta = 0.06  # a write of a field the rule depends on resolves (and checks) again
    assert len(calls) == 2 and config.resolved_method.params["delta"] == 0.06
    with pytest.raises(ConfigError, match="divergence_delta"):
        config.divergence_delta = 0.0
    assert config.divergence_delta == 0.06 and config.resolved_method.params["delta"] == 0.06  # left as it was
    config.logging_steps = 3  # a field the rule does not read: nothing is resolved
    assert len(calls) == 2
    copy = pickle.loads(pickle.dumps(_training(tmp_path, method="clip")))  # training_args.bin holds no spec
    assert copy.resolved_method.name == "clip" and copy.resolved_method is copy.resolved_method


def test_the_command_line_resolves_the_method_once(tmp_path, monkeypatch):
    calls = []
    real = at.resolve
    monkeypatch.setattr(at, "resolve", lambda *a, **k: calls.append(a) or real(*a, **k))
    run = train.parse(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--divergence_delta", "0.05"])
    assert len(calls) == 1 and run.training.resolved_method.params["delta"] == 0.05
    assert len(calls) == 1


# ------------------------------------------------------------------------------------------ the Python constructor
def _field_cases() -> list[tuple[str, str, object]]:
    """``(config, field, bad value)`` for every declared field of the three configs and every method field."""
    cases = []
    defaults = {f.name: f.default for f in dataclasses.fields(ATRGRPOConfig)}
    listed = config_fields.list_fields(ATRGRPOConfig)  # checked item by item: a bad item inside a list
    for name, declared in config_fields.training_domains().items():
        if name in defaults:
            bad = bad_values(declared, defaults[name])
            if name in listed:
                bad = [[b] for b in bad if b is not None and not isinstance(b, (list, dict))] + [{"a": 1}]
            cases += [("training", name, b) for b in bad]
    script_defaults = {f.name: f.default for f in dataclasses.fields(ScriptArguments)}
    for name, declared in config_fields.script_domains().items():
        cases += [("script", name, bad) for bad in bad_values(declared, script_defaults[name])]
    for name, declared in config_fields.MODEL_DOMAINS.items():
        cases += [("model", name, bad) for bad in bad_values(declared, 0)]
    for name in method_fields():
        cases += [("method", name, bad) for bad in ("0.5", True, float("nan"), float("inf"), [0.1])]
    for name in config_fields.flag_fields(ATRGRPOConfig)[:20]:
        cases += [("training", name, bad) for bad in ("false", 0, None)]
    return cases


FIELD_CASES = _field_cases()


def _user_of(param_field: str) -> dict:
    """A method that takes the parameter behind config field ``param_field`` (then its value is checked, not
    refused as stray)."""
    param = "delta" if param_field == "divergence_delta" else param_field
    name = next(n for n in at.method_names(aliases=False) if param in at.METHODS[n].params)
    return {"method": name}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(FIELD_CASES))
def test_every_fields_bad_value_is_refused_by_its_constructor_naming_it(case, tmp_path_factory):
    where, name, bad = case
    tmp = tmp_path_factory.mktemp("c")
    with pytest.raises(ValueError) as refused:
        if where == "training":
            _training(tmp, **{name: bad})
        elif where == "method":
            _training(tmp, **_user_of(name), **{name: bad})
        elif where == "script":
            ScriptArguments(**{name: bad})
        else:
            RunConfig(ScriptArguments(), _training(tmp), ModelConfig(**{name: bad}))
    assert name in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_the_field_cases_cover_every_way_a_value_can_be_wrong():
    assert len(FIELD_CASES) > 400
    kinds = {type(bad).__name__ for _, _, bad in FIELD_CASES}
    assert {"list", "dict", "str", "float", "bool", "NoneType", "int"} <= kinds


# ------------------------------------------------------------------------------------------------ the YAML file
def _yaml_cases() -> list[tuple[str, str]]:
    """``(text appended to cpu-tiny.yaml, what the refusal must name)`` for each declared field: a list, a mapping, a
    text for a number, null for a field without 'unset'; and a key written twice, a non-string key, an unknown key."""
    cases = [
        ("method: kl2\n", "method"),  # cpu-tiny.yaml sets method already: a key written twice
        ("1: 2\n", "key 1"),
        ("true: 1\n", "key True"),
        ("[a, b]: 1\n", "key"),
        ("max_stepz: 3\n", "max_stepz"),
        ("env: [RANK]\n", "env"),
    ]
    tiny = (TINY.read_text()).split("\n")
    present = {line.split(":")[0] for line in tiny if line and not line.startswith((" ", "#"))}
    domains = {**config_fields.training_domains(), **config_fields.script_domains(), **config_fields.MODEL_DOMAINS}
    for name, declared in domains.items():
        if name in present:
            continue
        cases += [(f"{name}: [1, 2]\n", name), (f"{name}: {{a: 1}}\n", name)]
        if isinstance(declared, (config_fields.Integer, config_fields.Real)):
            cases += [(f"{name}: abc\n", name), (f"{name}: .nan\n", name), (f"{name}: true\n", name)]
        if name in ("max_steps", "seed", "learning_rate", "per_device_train_batch_size"):
            cases.append((f"{name}: null\n", name))
    return cases


YAML_CASES = _yaml_cases()


@pytest.mark.parametrize("extra,named", YAML_CASES, ids=[c[0].strip()[:40] for c in YAML_CASES])
def test_a_bad_value_or_key_in_the_yaml_file_is_refused_naming_file_and_key(tmp_path, extra, named):
    config = tmp_path / "bad.yaml"
    config.write_text(TINY.read_text() + extra)
    with pytest.raises(ValueError) as refused:
        train.parse(["--config", str(config), "--output_dir", str(tmp_path / "run")])
    text = str(refused.value)
    assert text.startswith(f"--config {config}") and named in text and "\n" not in text, text
    assert not (tmp_path / "run").exists()


def test_the_yaml_cases_cover_every_declared_field_not_in_the_preset():
    assert len(YAML_CASES) > 150


def test_a_yaml_value_and_the_same_command_line_value_meet_the_same_check(tmp_path):
    """learning_rate nan from the file and from the command line: the same rule, each named where it came from."""
    config = tmp_path / "nan.yaml"
    config.write_text(TINY.read_text().replace("learning_rate: 0.0001", "learning_rate: .nan"))
    with pytest.raises(UsageError) as from_file:
        train.parse(["--config", str(config), "--output_dir", str(tmp_path / "a")])
    with pytest.raises(UsageError) as from_line:
        train.parse(["--config", str(TINY), "--output_dir", str(tmp_path / "b"), "--learning_rate", "nan"])
    with pytest.raises(ConfigError) as from_python:
        _training(tmp_path, learning_rate=float("nan"))
    assert from_line.value.expected == from_python.value.expected == "expected a finite number >= 0"
    assert str(from_file.value).endswith("key learning_rate: nan: expected a finite number >= 0"), from_file.value


# ------------------------------------------------------------------------------------- options given twice, pairs
@pytest.mark.parametrize(
    "extra,named",
    [
        (["--method", "atr", "--method", "kl2"], "--method: given 2 times (--method atr, then --method kl2)"),
        (["--config", str(TINY)], "--config: given 2 times"),
        (["--tiny", "--tiny", "true"], "--tiny: given 2 times"),
        (
            ["--gradient_checkpointing", "true", "--no_gradient_checkpointing"],
            "--gradient_checkpointing: given 2 times",
        ),
        (["--divergence_delta=0.05", "--divergence-delta", "0.06"], "--divergence_delta: given 2 times"),
    ],
)
def test_an_option_given_twice_is_refused_naming_both(tmp_path, extra, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        train.parse(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), *extra])


def _run_values(run: RunConfig):
    owners = [run.script, run.training, run.model]

    def value(name):
        return next(getattr(o, name) for o in owners if any(f.name == name for f in dataclasses.fields(o)))

    def default(name):
        owner = next(o for o in owners if any(f.name == name for f in dataclasses.fields(o)))
        return config_fields.field_default(owner, name)

    return value, default


RELATIONS = [*config_fields.GENERATION_RELATIONS, *config_fields.training_relations(), *config_fields.RUN_RELATIONS]


@pytest.mark.parametrize("relation", RELATIONS, ids=[repr(r) for r in RELATIONS])
def test_every_declared_relation_of_the_trainer_is_refused_when_broken(tmp_path, relation):
    """For each relation the configs declare, a command line that breaks it (found from the candidates of its
    arguments) is refused before any work, naming an argument of the relation."""
    base = ["--config", str(TINY), "--output_dir", str(tmp_path / "run")]
    value, default = _run_values(train.parse(base))
    domains = {**config_fields.training_domains(), **config_fields.script_domains(), **config_fields.MODEL_DOMAINS}
    hints = {**typing.get_type_hints(ATRGRPOConfig), **typing.get_type_hints(ScriptArguments)}
    hints.update(typing.get_type_hints(ModelConfig))
    options = {n: candidates(domains.get(n), hints.get(n), tmp_path) for n in relation.names}
    # the command line overrides the file (a key it makes unused is left out, with a warning): type what the relation
    # names, all of them for an exclusion
    required = (
        relation.names
        if isinstance(relation, Exclusive)
        else relation.names[:1]
        if isinstance(relation, Requires)
        else ()
    )
    assigned = breaking_assignment(
        relation, options, value, lambda n, get, chosen: n in chosen or get(n) != default(n), required
    )
    assert assigned is not None, f"no candidate breaks {relation!r}"
    argv = base + [t for n, v in assigned.items() for t in (f"--{n}", as_text(v))]
    with pytest.raises(ValueError) as refused:
        train.parse(argv)
    assert any(f"--{n}" in str(refused.value) or f"key {n}" in str(refused.value) for n in relation.names)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------ the environment
@pytest.mark.parametrize(
    "variable,value",
    [
        ("RANK", "abc"),
        ("RANK", "-1"),
        ("LOCAL_RANK", "x"),
        ("WORLD_SIZE", "0"),
        ("LOCAL_WORLD_SIZE", "1.5"),
        ("THP_MEM_ALLOC_ENABLE", "yes"),
        ("MASTER_PORT", "notaport"),  # torch's int() of it said "invalid literal for int()", naming nothing
        ("MASTER_PORT", "70000"),
    ],
)
def test_a_bad_environment_variable_is_refused_by_name_before_any_work(tmp_path, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=rf"^\${variable} {value}: expected (an integer|one of 0, 1)"):
        train.parse(["--config", str(TINY), "--output_dir", str(tmp_path / "run")])
    with pytest.raises(ConfigError, match=rf"\${variable}"):
        _training(tmp_path)
    assert not (tmp_path / "run").exists()


def test_a_process_with_a_bad_rank_writes_nothing(tmp_path):
    """RANK=abc used to fail after the output folder (and its lock) were made."""
    out = tmp_path / "run"
    env = {**os.environ, "RANK": "abc"}
    done = subprocess.run(
        [sys.executable, "-m", "atr_llm.train", "--config", str(TINY), "--output_dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and lines == ["error: $RANK abc: expected an integer >= 0"], done.stderr[-2000:]
    assert not out.exists()


def test_the_yaml_files_env_is_checked_like_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    config = tmp_path / "env.yaml"
    config.write_text(TINY.read_text() + "env:\n  RANK: abc\n")
    with pytest.raises(ValueError, match=r"^--config .*env.yaml: key env: RANK: abc: expected an integer >= 0$"):
        train.parse(["--config", str(config), "--output_dir", str(tmp_path / "run")])
    assert "RANK" not in os.environ  # a refused run leaves the environment as it found it


@pytest.mark.parametrize(
    "params,match",
    [
        ('{"delta": 0.05', "must be a JSON object"),
        ('{"delta": 0.05, "delta": 0.06}', "gives the key 'delta' twice"),
        ('{"delta": NaN}', r"^\$ATR_GRPO_PARAMS key 'delta': delta must be a finite number > 0"),
        ('{"delta": Infinity}', r"^\$ATR_GRPO_PARAMS key 'delta': delta must be a finite number > 0"),
        ('{"delta": "0.05"}', r"^\$ATR_GRPO_PARAMS key 'delta': delta must be a real number"),
        ('{"rollout_correction": {"level": "tokens"}}', r"^\$ATR_GRPO_PARAMS key 'rollout_correction': .*'tokens'"),
        ('{"tau_pos": 2}', r"sets \['tau_pos'\], which method 'atr' does not take"),
        ("[0.05]", "must be a JSON object"),
        ('{"form": "bogus"}', r"^\$ATR_GRPO_PARAMS key 'form': 'bogus' is not a form of method 'atr'"),
    ],
)
def test_atr_grpo_params_meets_the_registrys_check(monkeypatch, params, match):
    from types import SimpleNamespace

    from atr_llm.verl import plugin as verl_plugin

    monkeypatch.setenv(verl_plugin.PARAMS_ENV, params)
    verl_plugin._CHOICES.clear()
    config = SimpleNamespace(clip_ratio_low=None, clip_ratio_high=None, policy_loss=SimpleNamespace())
    with pytest.raises(ValueError, match=match):
        verl_plugin.choice_for("atr", config)
    verl_plugin._CHOICES.clear()


# ------------------------------------------------------------------------------------------------------ resume
def _checkpoint(folder: Path, resolved, model=None) -> Path:
    from grpo_helpers import write_checkpoint_files

    folder.mkdir(parents=True)
    write_checkpoint_files(folder)
    (folder / checkpoints.STATE_FILE).write_text('{"global_step": 2, "epoch": 1.0}')
    checkpoints.write_method_record(folder, resolved, model)
    return folder


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--method", "kl2"], "trained atr, min form; this configuration trains kl2. Pass --method atr"),
        (["--form", "mask"], "trains atr in the mask form. Pass --form min"),
        (["--divergence_delta", "0.05"], "with divergence_delta 0.07; this configuration sets 0.05"),
        ([], None),
    ],
)
def test_a_resume_that_would_train_something_else_is_refused_before_any_model_loads(tmp_path, extra, match):
    run = tmp_path / "run"
    _checkpoint(run / "checkpoint-2", at.resolve("atr"))
    argv = ["--config", str(TINY), "--output_dir", str(run), "--resume_from_checkpoint", "latest", *extra]
    if match is None:
        assert train.parse(argv).checkpoint == run / "checkpoint-2"
        return
    with pytest.raises(UsageError, match=rf"^--resume_from_checkpoint latest: .*{match}"):
        train.parse(argv)


def test_a_resume_with_another_model_is_refused(tmp_path):
    run = tmp_path / "run"
    from types import SimpleNamespace

    other = SimpleNamespace(config=SimpleNamespace(model_type="qwen3", hidden_size=128, num_hidden_layers=2))
    _checkpoint(run / "checkpoint-2", at.resolve("atr"), other)
    argv = ["--config", str(TINY), "--output_dir", str(run), "--resume_from_checkpoint", "latest"]
    with pytest.raises(UsageError, match=r"trained another model \(hidden_size 128 there, 64 here\)"):
        train.parse(argv)


def test_the_tiny_architecture_declared_is_the_one_built():
    from atr_llm import tiny

    model = tiny.build_tiny_model(tiny.build_tiny_tokenizer())
    assert {k: getattr(model.config, k) for k in tiny.TINY_ARCHITECTURE} == tiny.TINY_ARCHITECTURE


def test_the_python_trainer_refuses_a_resume_of_another_rule_before_training(tmp_path):
    """The same check as the command line's, on the trainer's own way in (``trainer.train(resume_from_checkpoint=)``),
    with the model loaded: nothing is trained or written."""
    from atr_llm import data, rewards, tiny
    from atr_llm.trainer import ATRGRPOTrainer

    tok = tiny.build_tiny_tokenizer()
    model = tiny.build_tiny_model(tok)
    config = _training(tmp_path, method="clip", max_steps=1, per_device_train_batch_size=8, num_generations=8)
    trainer = ATRGRPOTrainer(
        model=model,
        reward_funcs=[rewards.CorrectnessReward()],
        args=config,
        train_dataset=data.to_grpo_dataset(data.arithmetic_dataset(8)),
        processing_class=tok,
    )
    checkpoint = _checkpoint(tmp_path / "run" / "checkpoint-1", at.resolve("atr"), model)
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    with pytest.raises(ValueError, match="trained atr, min form; this configuration trains clip"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before and trainer.state.global_step == 0


@pytest.mark.parametrize(
    "name,value,match",
    [
        ("learning_rate", float("nan"), "learning_rate=nan: expected a finite number >= 0"),
        ("use_cpu", "false", "use_cpu='false': expected true or false"),
        ("num_generations", 7, "not whole groups of num_generations 7"),
        ("eval_accumulation_steps", 1.5, "eval_accumulation_steps=1.5: expected an integer or None"),
        ("divergence_delta", -1.0, "divergence_delta must be a finite number > 0"),
    ],
)
def test_a_field_written_after_the_config_was_built_meets_the_same_check(tmp_path, name, value, match):
    """Writing a field is one more way in (``config.learning_rate = nan``): the constructor's check, and a refused
    value leaves the config as it was."""
    config = _training(tmp_path, method="atr")
    before = getattr(config, name)
    with pytest.raises(ConfigError, match=match):
        setattr(config, name, value)
    assert getattr(config, name) == before or (before != before)
    config.learning_rate = 3e-4  # a good value is taken
    assert config.learning_rate == 3e-4


# ------------------------------------------------------------------- what a fresh audit found (tools/audit_one_way_in)
AUDIT_CASES = [
    (["--kl_chunk_size", "32"], r"^--kl_chunk_size 32: rule 'atr' computes no full-vocabulary KL to chunk"),
    (["--method_seed", "7"], r"^--method_seed 7: rule 'atr' draws nothing to seed"),
    (["--lora_r", "8", "--lora_alpha", "16"], r"^--lora_r 8: needs --use_peft true"),
    (["--save_steps", "2.5"], r"^--save_steps 2.5: expected a fraction of the run in \(0, 1\) or a whole number"),
    (["--warmup_steps", "2.5"], r"^--warmup_steps 2.5: expected 0, a fraction"),
    (["--bf16", "true", "--fp16", "true"], r"^--fp16 true: at most one of half precisions"),
    (["--steps_per_generation", "2", "--generation_batch_size", "64"], r"--generation_batch_size 64: cannot be used"),
    (["--num_train_epochs", "3"], r"^--num_train_epochs 3: needs key max_steps \(in .*\) -1"),
    (["--vllm_mode", "server"], r"^--vllm_mode server: needs --use_vllm true"),
    (["--use_vllm", "true"], r"^--use_vllm true: needs the package vllm"),
    (["--use_liger_kernel", "true"], r"^--use_liger_kernel true: needs the package liger_kernel"),
    (["--report_to", "wandb"], r"^--report_to wandb: the wandb integration is not installed"),
    (["--optim", "adamw_bnb_8bit"], r"^--optim adamw_bnb_8bit: .*bitsandbytes"),
    (["--dataset_limit", "2000000000"], r"^--dataset_limit 2000000000: expected an integer in \[1, 10000000\]"),
    (["--tiny", "false"], r"^--model_name_or_path None: no model to train"),
    (["--tiny", "false", "--model_name_or_path", "/no/such/model"], r"^--model_name_or_path /no/such/model: no such"),
    (["--sft_steps", "0", "--sft_batch_size", "16"], r"^--sft_batch_size 16: needs --sft_steps > 0"),
]


@pytest.mark.parametrize("extra,match", AUDIT_CASES, ids=[" ".join(c[0]) for c in AUDIT_CASES])
def test_an_option_that_would_be_ignored_or_fail_after_work_is_refused_naming_it(tmp_path, extra, match):
    if extra == ["--use_vllm", "true"] and __import__("importlib.util").util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(UsageError, match=match):
        train.parse(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), *extra])
    assert not (tmp_path / "run").exists()


def test_the_command_line_overrides_the_file_and_says_which_keys_it_leaves_unused(tmp_path):
    """--sft_steps 0 over cpu-tiny.yaml (which sets the SFT stage's rate and batch): the file's keys are left out with
    a warning naming each, not refused; typed on the command line, the same option is refused."""
    with pytest.warns(UserWarning) as warned:
        run = train.parse(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--sft_steps", "0"])
    said = [str(w.message) for w in warned if "is not used" in str(w.message)]
    assert {m.split("key ")[1].split(" ")[0] for m in said} == {"sft_learning_rate", "sft_batch_size"}, said
    assert run.script.sft_steps == 0 and run.script.sft_batch_size == ScriptArguments().sft_batch_size


@pytest.mark.parametrize(
    "variables,match",
    [
        ({"RANK": "1"}, r"^\$RANK 1: a distributed launch's rank, set without \$WORLD_SIZE"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, r"^\$RANK 2: expected a rank below \$WORLD_SIZE 2"),
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"}, r"^\$LOCAL_RANK 1: expected a rank below \$LOCAL_WORLD_SIZE 1"),
        ({"WORLD_SIZE": "2"}, r"^\$WORLD_SIZE 2: a launch of 2 processes needs \$MASTER_ADDR"),
    ],
)
def test_launch_variables_that_do_not_fit_together_are_refused(tmp_path, monkeypatch, variables, match):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=match):
        train.parse(["--config", str(TINY), "--output_dir", str(tmp_path / "run")])


def test_a_bad_huge_pages_variable_is_refused_before_torch_reads_it(tmp_path):
    """torch warns on import about a THP_MEM_ALLOC_ENABLE it cannot read: the command refuses it before, in one line."""
    done = subprocess.run(
        [sys.executable, "-m", "atr_llm.train", "--config", str(TINY), "--output_dir", str(tmp_path / "run")],
        cwd=ROOT,
        env={**os.environ, "THP_MEM_ALLOC_ENABLE": "yes"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and lines == ["error: $THP_MEM_ALLOC_ENABLE yes: expected one of 0, 1"], done.stderr
    assert not (tmp_path / "run").exists()


def test_a_resume_under_trls_delta_names_delta_and_a_tiny_checkpoint_refuses_another_model(tmp_path):
    run = tmp_path / "run"
    from atr_llm import tiny

    model = tiny.build_tiny_model(tiny.build_tiny_tokenizer())
    _checkpoint(run / "checkpoint-2", at.resolve("atr"), model)
    base = ["--config", str(TINY), "--output_dir", str(run), "--resume_from_checkpoint", "latest"]
    with pytest.raises(UsageError, match=r"^--delta 1.5: .*trained atr without TRL's delta"):
        train.parse([*base, "--delta", "1.5"])
    with pytest.raises(UsageError, match=r"trained another model \(vocab_size 334 there, 151936 here\)"):
        train.parse([*base, "--tiny_vocab", "qwen3"])
    assert train.parse(base).checkpoint == run / "checkpoint-2"  # the same tiny model resumes


def test_the_toy_vocabulary_declared_is_the_one_built():
    from atr_llm import tiny

    assert len(tiny.build_tiny_tokenizer()) == tiny.TOY_VOCAB_ROWS


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(lr_scheduler_type="cosine_warmup"), r"^lr_scheduler_type='cosine_warmup': expected one of linear, "),
        (dict(optim="adamw_torchx"), r"^optim='adamw_torchx': expected one of "),
        (dict(learning_rate=10**400), r"^learning_rate=1000.*\.\.\.: expected a finite number >= 0"),
        (dict(eval_accumulation_steps=10**400), r"^eval_accumulation_steps=1000.*\.\.\.: expected an integer or None"),
    ],
)
def test_a_library_choice_or_a_number_beyond_any_float_is_refused_naming_the_field(tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match):
        _training(tmp_path, **kw)


def test_the_configs_are_built_once(tmp_path, monkeypatch):
    """The file keys the command line makes unused are found from the declared relations before the build
    (``train.unused_file_keys``), so the configs are built once: no build-refuse-retry loop."""
    builds = []
    original = ATRGRPOConfig.__post_init__
    monkeypatch.setattr(ATRGRPOConfig, "__post_init__", lambda self: builds.append(1) or original(self))
    with pytest.warns(UserWarning, match="is not used"):
        train.parse(["--config", str(TINY), "--output_dir", str(tmp_path / "run"), "--sft_steps", "0"])
    assert len(builds) == 1
    assert train.unused_file_keys({"sft_steps": 0, "sft_batch_size": 4}, {
        "sft_steps": ("--sft_steps", "0", None), "sft_batch_size": (None, "4", "sft_batch_size: 4")
    }).keys() == {"sft_batch_size"}
    typed_in_file = {"sft_steps": (None, "0", "sft_steps: 0"), "sft_batch_size": (None, "4", "sft_batch_size: 4")}
    assert not train.unused_file_keys({"sft_steps": 0, "sft_batch_size": 4}, typed_in_file)  # the file's own clash


def test_the_config_file_is_read_once(tmp_path, monkeypatch):
    """``python -m atr_llm.train --config FILE`` reads FILE once: the backend (needed before TRL's trainer is
    imported) and the values come from the same reading."""
    from atr_llm import config_file

    reads = []
    original = config_file.read_config_file
    counted = lambda path: reads.append(path) or original(path)  # noqa: E731
    monkeypatch.setattr(config_file, "read_config_file", counted)
    monkeypatch.setattr(train, "read_config_file", counted)
    monkeypatch.setattr(train, "run", lambda config: {"planned": config})
    out = train.main(["--config", str(TINY), "--output_dir", str(tmp_path / "run")])
    assert reads == [str(TINY)] and out["planned"].training.output_dir == str(tmp_path / "run")


def test_a_files_key_the_file_itself_makes_unused_is_refused_not_left_out(tmp_path):
    """Only an option typed on the command line overrides the file: a LoRA key in a file without use_peft is refused,
    naming the file and the key (nothing on the command line asked for it to go unused)."""
    config = tmp_path / "lora.yaml"
    config.write_text(TINY.read_text() + "lora_target_modules: [q_proj]\n")
    with pytest.raises(UsageError, match=r"^--config .*lora.yaml: key lora_target_modules: .*needs --use_peft true"):
        train.parse(["--config", str(config), "--output_dir", str(tmp_path / "run")])


def test_the_reliability_page_states_the_audits_counts_from_its_file():
    import json
    import re

    audit = json.loads((ROOT / "figures" / "tools" / "cli_audit" / "one_way_in_audit.json").read_text())
    counts = audit["counts"]
    page = (ROOT / "docs" / "reliability.md").read_text()
    page = " ".join(page.split())
    stated = re.search(r"\*\*(\d+) clean, (\d+) unclear, (\d+) bad\*\*", page)
    assert stated and tuple(map(int, stated.groups())) == (counts["clean"], counts["unclear"], counts["bad"])
    assert f"{counts['cases']} bad inputs" in page
    for name, per in counts["per_class"].items():
        assert f"({per['cases']})" in page, name


def test_numpy_scalars_are_read_as_their_python_kind_and_still_checked(tmp_path):
    """np.int64(5) is an integer and np.float32(1e-4) a number (a sweep script's values); each is stored as the Python
    value it holds, and a numpy NaN is refused like a float one."""
    import numpy as np

    from atr_llm.config import ATRGRPOConfig

    kw = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    c = ATRGRPOConfig(max_steps=np.int64(5), learning_rate=np.float32(0.5), bf16=np.bool_(False), **kw)
    assert (type(c.max_steps), type(c.learning_rate), type(c.bf16)) == (int, float, bool)
    assert (c.max_steps, c.learning_rate, c.bf16) == (5, 0.5, False)
    with pytest.raises(ValueError, match="learning_rate=nan"):
        ATRGRPOConfig(learning_rate=np.float64("nan"), **kw)
    with pytest.raises(ValueError, match="max_steps"):
        ATRGRPOConfig(max_steps=np.int64(-5), **kw)


def test_accelerates_flag_variables_are_checked_as_accelerate_reads_them(monkeypatch):
    """The names: every ``ACCELERATE_*`` variable accelerate's installed source reads with ``parse_flag_from_env``. The
    values: refused exactly where accelerate's own ``str_to_bool`` raises, naming the variable."""
    import os
    import re

    import accelerate
    from accelerate.utils.environment import str_to_bool

    from atr_llm.config.environment import ACCELERATE_FLAGS
    from atr_llm.config.fields import ConfigError, check_environment

    root = Path(os.path.dirname(accelerate.__file__))
    read = set()
    for path in root.rglob("*.py"):
        read |= set(re.findall(r'parse_flag_from_env\(\s*"(ACCELERATE_[A-Z_]+)"', path.read_text()))
    assert read == set(ACCELERATE_FLAGS)
    for value in ("maybe", "YES", "on", "0", "", "2", "False", "tru"):
        try:
            str_to_bool(value)
            takes = True
        except ValueError:
            takes = False
        environ = {"ACCELERATE_USE_CPU": value}
        if takes:
            check_environment(environ)
        else:
            with pytest.raises(ConfigError, match=r"^\$ACCELERATE_USE_CPU="):
                check_environment(environ)


@pytest.mark.parametrize("value", ["fp17", "FP16", "bf16", "no", "fp16"])
def test_accelerates_mixed_precision_and_dynamo_variables_are_checked_as_accelerate_reads_them(value):
    """``ACCELERATE_MIXED_PRECISION`` is taken as it is and must be a ``PrecisionType`` value (accelerate's check when
    the accelerator is built); ``ACCELERATE_DYNAMO_BACKEND`` is upper-cased into ``DynamoBackend``. Refused exactly
    where the peer's own parsing raises."""
    from accelerate.utils import DynamoBackend, PrecisionType

    from atr_llm.config.fields import ConfigError, check_environment

    takes = value in [p.value for p in PrecisionType]
    if takes:
        check_environment({"ACCELERATE_MIXED_PRECISION": value})
    else:
        with pytest.raises(ConfigError, match=rf"^\$ACCELERATE_MIXED_PRECISION='{value}'"):
            check_environment({"ACCELERATE_MIXED_PRECISION": value})
    for backend in ("bogus", "inductor", "EAGER"):
        try:
            DynamoBackend(backend.upper())
            check_environment({"ACCELERATE_DYNAMO_BACKEND": backend})
        except ValueError:
            with pytest.raises(ConfigError, match=r"^\$ACCELERATE_DYNAMO_BACKEND='bogus'"):
                check_environment({"ACCELERATE_DYNAMO_BACKEND": backend})


def test_a_local_world_larger_than_the_world_and_a_bad_thread_count_are_refused():
    from atr_llm.config.fields import ConfigError, check_environment

    with pytest.raises(ConfigError, match=r"^\$LOCAL_WORLD_SIZE=8: expected at most \$WORLD_SIZE 1"):
        check_environment({"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "1"})
    for threads in ("-4", "0", "four", "4,", "4,-2"):
        with pytest.raises(ConfigError, match=r"^\$OMP_NUM_THREADS="):
            check_environment({"OMP_NUM_THREADS": threads})
    for threads in ("4", "4,2", "1"):
        check_environment({"OMP_NUM_THREADS": threads})


def test_a_top_k_above_the_tiny_vocabulary_is_refused_before_the_sft_stage(tmp_path):
    """The tiny model's vocabulary (334 rows) is known before it is built: ``dppo_topk`` 100000 was refused by the
    trainer on the loaded model, after the SFT stage had trained and saved; 333 is the largest K it takes."""
    from atr_llm import train
    from atr_llm.command_line import UsageError

    preset = Path(__file__).resolve().parents[1] / "atr_llm" / "configs" / "cpu-tiny.yaml"
    text = "".join(line for line in preset.read_text().splitlines(True) if not line.startswith(("method:", "divergence_delta:")))
    config = tmp_path / "topk.yaml"
    config.write_text(text + "method: dppo_topk_tv\ndppo_topk: 100000\n")
    base = ["--config", str(config), "--output_dir", str(tmp_path / "run"), "--sft_steps", "2"]
    with pytest.raises(UsageError, match=r"key dppo_topk: 100000: expected at most the vocabulary size - 1 = 333"):
        train.parse(base)
    assert train.parse([*base, "--dppo_topk", "333"]).training.dppo_topk == 333
    assert not (tmp_path / "run").exists()


def test_accelerate_variables_it_would_fail_on_or_never_read_are_refused(monkeypatch, tmp_path):
    """``ACCELERATE_LOG_LEVEL=loud`` is a ValueError from ``logging`` when accelerate's logger is made (the peer,
    shown); ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` is read by accelerate only without a plugin, and transformers
    passes one; ``ACCELERATE_MIXED_PRECISION=fp16`` on a CPU is dropped by accelerate, as ``--fp16`` is."""
    import logging

    import torch

    from atr_llm import train
    from atr_llm.config.fields import ConfigError, check_environment

    with pytest.raises(ValueError, match="Unknown level"):
        logging.getLogger("atr-test-level").setLevel("LOUD")
    with pytest.raises(ConfigError, match=r"^\$ACCELERATE_LOG_LEVEL='loud': expected a logging level"):
        check_environment({"ACCELERATE_LOG_LEVEL": "loud"})
    check_environment({"ACCELERATE_LOG_LEVEL": "info"})
    with pytest.raises(ConfigError, match=r"^\$ACCELERATE_GRADIENT_ACCUMULATION_STEPS='4': never read"):
        check_environment({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"})
    if torch.cuda.is_available():
        return
    preset = Path(__file__).resolve().parents[1] / "atr_llm" / "configs" / "cpu-tiny.yaml"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    with pytest.raises(ValueError, match=r"\$ACCELERATE_MIXED_PRECISION fp16: needs a GPU"):
        train.parse(["--config", str(preset), "--output_dir", str(tmp_path / "run")])
