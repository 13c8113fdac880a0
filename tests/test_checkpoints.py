"""atr_llm.checkpoints: nothing read from a checkpoint runs as code. A crafted ``training_args.bin`` and a crafted
generation-cycle file each carry a pickle whose load would create a file (``__reduce__`` -> ``pathlib.Path.touch``);
reading them leaves no such file, and the honest files still give what they hold."""

from __future__ import annotations

import pathlib

import pytest
import torch

pytest.importorskip("trl")

from atr_llm import checkpoint_files, checkpoints  # noqa: E402

CPU_TINY = pathlib.Path(checkpoints.__file__).parent / "configs" / "cpu-tiny.yaml"


class _Payload:
    """Unpickling this calls ``Path(target).touch()``: the proof that code in a file ran."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.target),))


class _Config:
    """A config-like object whose pickled state holds the payload beside a method name."""

    def __init__(self, target):
        self.method, self.form, self.hook = "atr", None, _Payload(target)


def test_the_payload_really_runs_under_plain_unpickling(tmp_path):
    """The control: torch.load with weights_only=False runs it (so the tests below would see it run)."""
    target = tmp_path / "ran"
    torch.save(_Payload(target), tmp_path / "f.bin")
    torch.load(tmp_path / "f.bin", weights_only=False)
    assert target.exists()


def test_a_crafted_training_args_bin_is_read_without_running_it(tmp_path):
    target = tmp_path / "ran"
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    torch.save(_Config(target), folder / "training_args.bin")
    record = checkpoints.recorded_method(folder)
    assert not target.exists()
    assert record == {"method": "atr", "form": "mask", "recorded": "legacy default"}  # the data is still read
    torch.save(_Payload(target), folder / "training_args.bin")  # the payload as the whole file
    assert checkpoints.recorded_method(folder) is None and not target.exists()


@pytest.mark.parametrize("content", [b"", b"not a zip", b"PK\x03\x04 torn"])
def test_a_damaged_training_args_bin_says_nothing_and_raises_nothing(tmp_path, content):
    (tmp_path / "training_args.bin").write_bytes(content)
    assert checkpoints.recorded_method(tmp_path) is None


def test_a_crafted_cycle_file_is_refused_without_running_it(tmp_path):
    target = tmp_path / "ran"
    path = tmp_path / checkpoints.CYCLE_FILE.format(rank=0)
    torch.save({"step": 4, "buffered_inputs": [_Payload(target)]}, path)
    with pytest.raises(ValueError, match="generation-cycle record"):
        checkpoints.load_cycle_state(tmp_path, 0, "cpu")
    assert not target.exists()
    path.write_bytes(b"torn")
    with pytest.raises(ValueError, match=str(path.name)):
        checkpoints.load_cycle_state(tmp_path, 0, "cpu")


def test_an_honest_cycle_file_round_trips(tmp_path):
    inputs = {"completion_ids": torch.arange(6).view(2, 3), "advantages": torch.tensor([0.5, -0.5]), "n": 3}
    checkpoints.save_cycle_state(tmp_path, 0, 7, [inputs, {"prompt": ["a", "b"], "x": None}])
    state = checkpoints.load_cycle_state(tmp_path, 0, "cpu")
    assert state["step"] == 7 and torch.equal(state["buffered_inputs"][0]["completion_ids"], inputs["completion_ids"])
    assert state["buffered_inputs"][1] == {"prompt": ["a", "b"], "x": None}


# ---------------------------------------------------------------------------------------------------------------
# a damaged checkpoint is refused before any model loads, naming the file
# ---------------------------------------------------------------------------------------------------------------
def _checkpoint(folder):
    """A checkpoint folder with every file transformers and this package write, each small but real."""
    import json

    from grpo_helpers import write_checkpoint_files

    folder.mkdir(parents=True)
    write_checkpoint_files(folder)
    checkpoints.save_cycle_state(folder, 0, 2, [{"advantages": torch.zeros(4)}])
    (folder / checkpoints.STATE_FILE).write_text(json.dumps({"global_step": 2, "epoch": 0.5}))
    (folder / checkpoints.METHOD_FILE).write_text(json.dumps({"method": "atr", "form": "min", "params": {}}))
    return folder


def _edit_json(path, **entries):
    import json

    path.write_text(json.dumps({**json.loads(path.read_text()), **entries}))


def _edit_torch(path, **entries):
    state = torch.load(path, weights_only=True)
    torch.save({**state, **entries}, path)


def _dangle(path):
    path.unlink()
    path.symlink_to(path.parent / "gone.pt")


def _edit_weights(folder, drop=None, reshape=None, add=None, cast=None):
    """Rewrite ``model.safetensors`` whole (a valid file) without ``drop``, with ``reshape`` cut by half, or with an
    ``add``ed tensor."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    weights.pop(drop, None)
    if reshape:
        weights[reshape] = weights[reshape][: weights[reshape].shape[0] // 2].clone()
    if add:
        weights[add] = torch.zeros(2)
    if cast:
        weights[cast] = (weights[cast] * 1000).long()
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _halve_a_moment(path):
    """One parameter's Adam moments cut to half their rows (the count of tensors unchanged): the fused step crashed."""
    state = torch.load(path, weights_only=True)
    entry = next(e for e in state["state"].values() if e["exp_avg"].dim() == 2)
    entry["exp_avg"] = entry["exp_avg"][: entry["exp_avg"].shape[0] // 2].clone()
    entry["exp_avg_sq"] = entry["exp_avg_sq"][: entry["exp_avg_sq"].shape[0] // 2].clone()
    torch.save(state, path)


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "damage,named",
    [
        (lambda f: _truncate(f / "model.safetensors"), "model.safetensors is damaged"),
        (lambda f: (f / "model.safetensors").unlink(), "no model weights"),
        (lambda f: (f / "optimizer.pt").unlink(), "no optimizer.pt"),
        (lambda f: _truncate(f / "optimizer.pt"), "optimizer.pt is damaged"),
        (lambda f: _truncate(f / "scheduler.pt"), "scheduler.pt is damaged"),
        (lambda f: _truncate(f / "rng_state.pth"), "rng_state.pth is damaged"),
        (lambda f: _truncate(f / checkpoints.CYCLE_FILE.format(rank=0)), "atr_grpo_cycle_rank0.pt is damaged"),
        (lambda f: (f / checkpoints.METHOD_FILE).write_text('{"method": "at'), "atr_method.json is damaged"),
        (lambda f: (f / checkpoints.METHOD_FILE).write_text("[1]"), "atr_method.json is not a JSON object"),
        (lambda f: (f / "scheduler.pt").unlink(), "no scheduler.pt"),
        (lambda f: (f / "rng_state.pth").unlink(), "no rng_state*.pth"),
        (lambda f: torch.save({"state": _Payload(f / "ran")}, f / "optimizer.pt"), "optimizer.pt holds more than"),
        (lambda f: (f / "optimizer.pt").write_bytes(b"not a zip"), "optimizer.pt is damaged (not a torch.save"),
        (
            lambda f: torch.save({"step": 1, "buffered_inputs": [_Payload(f / "ran")]}, f / "atr_grpo_cycle_rank0.pt"),
            "atr_grpo_cycle_rank0.pt holds more than tensors",
        ),
        (lambda f: (f / checkpoints.STATE_FILE).write_text("{}"), "trainer_state.json has no step count"),
        (
            lambda f: (f / checkpoints.STATE_FILE).write_text('{"global_step": "one", "epoch": 0}'),
            "trainer_state.json has no step count (global_step 'one'",
        ),
        (
            lambda f: (f / checkpoints.STATE_FILE).write_text('{"global_step": 2, "epoch": "x"}'),
            "trainer_state.json has no epoch",
        ),
        (
            lambda f: (f / checkpoints.METHOD_FILE).write_text('{"method": "atr", "params": "delta=0.07"}'),
            "atr_method.json's params 'delta=0.07' are not an object of numbers",
        ),
        (
            lambda f: (f / checkpoints.METHOD_FILE).write_text('{"method": "atr", "params": {"delta": "abc"}}'),
            "are not an object of numbers",
        ),
        (
            lambda f: (f / checkpoints.METHOD_FILE).write_text('{"method": "atr", "model": "tiny"}'),
            "atr_method.json's model 'tiny' is not an object",
        ),
        (lambda f: (f / checkpoints.METHOD_FILE).write_text('{"method": "atr", "form": 3}'), "form 3 is not"),
        # parseable but not what the resume reads (each once a traceback, a hang or a silent loss after the build)
        (lambda f: _edit_json(f / checkpoints.STATE_FILE, bogus_field=1), "TrainerState does not know (bogus_field)"),
        (lambda f: _edit_json(f / checkpoints.STATE_FILE, global_step=1000), "global_step 1000 is not the step"),
        (lambda f: _edit_json(f / checkpoints.STATE_FILE, epoch=1e12), "epoch 1e+12 is more than its global_step 2"),
        (lambda f: _edit_json(f / checkpoints.STATE_FILE, log_history=[1, "x"]), "log_history is not a list of"),
        (lambda f: torch.save({}, f / "rng_state.pth"), "rng_state.pth lacks the random state of python, numpy, cpu"),
        (lambda f: torch.save({}, f / "optimizer.pt"), "optimizer.pt is not an optimizer's state"),
        (
            lambda f: torch.save({"state": {}, "param_groups": [{"lr": 1.0, "params": [0]}]}, f / "optimizer.pt"),
            "optimizer.pt holds the state of 1 tensors; the checkpoint's model trains 24",
        ),
        (lambda f: torch.save({}, f / "scheduler.pt"), "scheduler.pt is not a scheduler's state"),
        (lambda f: _halve_a_moment(f / "optimizer.pt"), "optimizer.pt holds moments of"),
        (lambda f: torch.save({"python": 1, "numpy": 2, "cpu": 3}, f / "rng_state.pth"), "python state is not random"),
        (lambda f: _edit_torch(f / "scheduler.pt", base_lrs=[float("nan")] * 2), "base learning rates [nan, nan] are"),
        (lambda f: _edit_torch(f / checkpoints.CYCLE_FILE.format(rank=0), buffered_inputs=[]), "not a non-empty list"),
        (lambda f: _edit_torch(f / checkpoints.CYCLE_FILE.format(rank=0), buffered_inputs="x"), "not a non-empty list"),
        (
            lambda f: _edit_torch(
                f / checkpoints.CYCLE_FILE.format(rank=0),
                buffered_inputs=[{"completion_ids": torch.zeros(2, 5), "completion_mask": torch.zeros(2, 6)}],
            ),
            "its buffered completion tensors differ in shape",
        ),
        (lambda f: _edit_weights(f, cast="model.norm.weight"), "holds model.norm.weight as I64, not a floating"),
        (lambda f: _edit_json(f / checkpoints.METHOD_FILE, params={"epsilon": 0.2}), "'epsilon', which atr does not"),
        (lambda f: _dangle(f / "optimizer.pt"), "optimizer.pt is a link to a file that does not exist"),
        (lambda f: _edit_weights(f, drop="model.layers.1.mlp.up_proj.weight"), "lack model.layers.1.mlp.up_proj"),
        (lambda f: _edit_weights(f, reshape="model.norm.weight"), "another shape: model.norm.weight (32,)"),
        (lambda f: _edit_weights(f, add="extra.weight"), "no place for: extra.weight"),
        (lambda f: (f / "config.json").write_text("garbage"), "config.json is damaged"),
        (lambda f: _edit_json(f / "config.json", model_type="bogus"), "config.json does not describe a model"),
        (lambda f: _edit_json(f / "config.json", vocab_size=100), "another shape: model.embed_tokens.weight (334, 64)"),
        (
            lambda f: torch.save({"step": "x", "buffered_inputs": []}, f / checkpoints.CYCLE_FILE.format(rank=0)),
            "atr_grpo_cycle_rank0.pt is not a generation-cycle record (step 'x'",
        ),
        (lambda f: _edit_json(f / checkpoints.METHOD_FILE, method="bogus_rule"), "method this package does not have"),
        (lambda f: _edit_json(f / checkpoints.METHOD_FILE, form="sideways"), "form 'sideways' is not a form"),
    ],
)
def test_every_damaged_checkpoint_file_is_named(tmp_path, damage, named):
    folder = _checkpoint(tmp_path / "checkpoint-2")
    assert checkpoint_files.checkpoint_file_problem(folder) is None  # whole, it passes
    damage(folder)
    assert named in checkpoint_files.checkpoint_file_problem(folder)
    assert not (folder / "ran").exists()  # a crafted file's payload never ran


def test_train_refuses_a_damaged_checkpoint_before_any_model_loads(tmp_path):
    from atr_llm import train
    from atr_llm.command_line import UsageError

    folder = _checkpoint(tmp_path / "run" / "checkpoint-2")
    (folder / "optimizer.pt").unlink()
    argv = ["--config", str(CPU_TINY), "--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", str(folder)]
    with pytest.raises(UsageError, match="resume_from_checkpoint.*cannot be resumed: no optimizer.pt"):
        train.parse(argv)
    assert not (tmp_path / "run" / ".lock").exists() and sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "checkpoint-2"
    ]


@pytest.mark.parametrize("key, value", [("hidden_act", "relu"), ("max_position_embeddings", 8), ("rms_norm_eps", 0.1)])
def test_a_checkpoint_config_edit_a_resume_would_ignore_is_refused_naming_the_entry(tmp_path, key, value):
    """transformers' resume (``Trainer._load_from_checkpoint``) loads the checkpoint's weights into the model the run
    built and never reads its ``config.json``: an entry edited there (shapes unchanged) changed nothing, silently.
    Refused, naming the entry and both values."""
    from safetensors.torch import load_file

    from atr_llm import train
    from atr_llm.command_line import UsageError
    from atr_llm.tiny import build_tokenizer_and_model

    folder = _checkpoint(tmp_path / "run" / "checkpoint-2")
    _edit_json(folder / "config.json", **{key: value})
    _, model = build_tokenizer_and_model("toy")
    model.load_state_dict(load_file(folder / "model.safetensors"), strict=False)  # what the resume does with it
    assert getattr(model.config, key) != value  # the file's value is not the model's
    argv = ["--config", str(CPU_TINY), "--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", str(folder)]
    with pytest.raises(UsageError, match=rf"trained another model \({key} {value!r} there, "):
        train.parse(argv)


def test_a_checkpoint_without_its_optimizer_resumes_only_when_asked(tmp_path):
    """A checkpoint saved with ``save_only_model`` has no optimizer.pt: refused (Adam's moments would restart from
    zero silently) unless ``--allow_fresh_optimizer true``, which is itself refused where nothing is resumed."""
    from atr_llm import train
    from atr_llm.command_line import UsageError

    folder = _checkpoint(tmp_path / "run" / "checkpoint-2")
    (folder / "optimizer.pt").unlink()
    assert "allow_fresh_optimizer" in checkpoint_files.checkpoint_file_problem(folder)
    assert checkpoint_files.checkpoint_file_problem(folder, allow_fresh_optimizer=True) is None
    _truncate(folder / "scheduler.pt")  # what is there is still checked
    assert "scheduler.pt is damaged" in checkpoint_files.checkpoint_file_problem(folder, allow_fresh_optimizer=True)
    (folder / "scheduler.pt").unlink()
    base = ["--config", str(CPU_TINY), "--output_dir", str(tmp_path / "run")]
    run = train.parse([*base, "--resume_from_checkpoint", str(folder), "--allow_fresh_optimizer", "true"])
    assert run.checkpoint == folder
    with pytest.raises(UsageError, match=r"^--allow_fresh_optimizer true: set, but nothing is resumed"):
        train.parse([*base, "--allow_fresh_optimizer", "true"])


def test_a_checkpoint_past_max_steps_and_a_lock_that_is_a_folder_are_refused_before_work(tmp_path):
    """A checkpoint saved at step 2 resumed with ``--max_steps 1`` trained nothing and replaced the final model with
    the checkpoint's weights; a folder in the run lock's place failed with a traceback after the checks."""
    from atr_llm import train
    from atr_llm.command_line import UsageError
    from atr_llm.run_lock import LOCK_NAME

    folder = _checkpoint(tmp_path / "run" / "checkpoint-2")
    base = ["--config", str(CPU_TINY), "--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", str(folder)]
    with pytest.raises(UsageError, match=r"^--max_steps 1: .*checkpoint-2 has trained 2 steps already"):
        train.parse([*base, "--max_steps", "1"])
    assert train.parse([*base, "--max_steps", "2"]).checkpoint == folder
    (tmp_path / "run" / LOCK_NAME).mkdir()
    with pytest.raises(UsageError, match=r"^--output_dir .*: its run lock .* is not a file"):
        train.parse(base)


def test_evaluate_refuses_a_checkpoint_with_a_damaged_method_record_before_generating(tmp_path):
    """``atr_llm.evaluate --checkpoints`` reads each checkpoint's rule to name it: a damaged record was a bare JSON
    error after every checkpoint had generated."""
    from types import SimpleNamespace

    from atr_llm.command_line import UsageError
    from atr_llm.evaluation_checks import check_model_folders

    run = tmp_path / "run"
    _checkpoint(run / "checkpoint-2")
    (run / "checkpoint-2" / checkpoints.METHOD_FILE).write_text("{broken")
    base = _checkpoint(tmp_path / "base")
    (base / "tokenizer.json").write_text("{}")
    (base / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    args = SimpleNamespace(adapter=None, checkpoints=str(run), every=1)
    with pytest.raises(UsageError, match=r"^--checkpoints .*: checkpoint-2 cannot be loaded: atr_method.json is damaged"):
        check_model_folders(args, "--tiny-model", str(base))


@pytest.mark.parametrize(
    "option, value", [("learning_rate", "2e-4"), ("adam_beta1", "0.8"), ("adam_epsilon", "1e-6"), ("weight_decay", "0.1")]
)
def test_an_optimizer_setting_a_resume_would_restore_over_the_option_is_refused(tmp_path, option, value):
    """The peer: torch's ``Optimizer.load_state_dict`` puts the saved group settings back over the ones the optimizer
    was built with (transformers builds it from the options, then loads optimizer.pt), so a changed option was
    dropped; refused, naming it, and the checkpoint's own value resumes."""
    from atr_llm import train
    from atr_llm.command_line import UsageError

    folder = _checkpoint(tmp_path / "run" / "checkpoint-2")
    saved = torch.load(folder / "optimizer.pt", weights_only=True)
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))]} for _ in saved["param_groups"]]
    built = torch.optim.AdamW(groups, lr=2e-4, betas=(0.8, 0.9))  # as the options would build it
    saved_groups = [{**g, "params": [i]} for i, g in enumerate(saved["param_groups"])]
    built.load_state_dict({"state": {}, "param_groups": saved_groups})
    assert built.param_groups[0]["lr"] == 1e-4 and built.param_groups[0]["betas"] == (0.9, 0.999)
    base = ["--config", str(CPU_TINY), "--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", str(folder)]
    with pytest.raises(UsageError, match=rf"^--{option} {value}: .*trained with {option} .*pass --{option}"):
        train.parse([*base, f"--{option}", value])
    assert train.parse(base).checkpoint == folder


def test_a_resume_reports_missing_keys_but_not_the_tied_head(tmp_path, monkeypatch):
    """``save_pretrained`` leaves the tied ``lm_head.weight`` out; loading the file back (as a resume does) lists it
    as missing, and TRL's own trainer (transformers 5.24's ``_issue_warnings_after_load``) reports it on every
    resume. Ours reports what is truly missing only, and the head stays the embeddings' tensor."""
    import transformers.trainer as transformers_trainer
    from grpo_helpers import grpo_config_kwargs, tiny_trainer
    from safetensors.torch import load_file
    from trl import GRPOConfig, GRPOTrainer

    from atr_llm.config import ATRGRPOConfig
    from atr_llm.tiny import build_tokenizer_and_model

    tok, model = build_tokenizer_and_model("toy")
    model.save_pretrained(tmp_path / "saved")
    weights = load_file(tmp_path / "saved" / "model.safetensors")
    loaded = model.load_state_dict(weights, strict=False)
    assert loaded.missing_keys == ["lm_head.weight"]
    peer = tiny_trainer(tok, GRPOConfig(**grpo_config_kwargs(tmp_path)), GRPOTrainer, model=model)
    ours = tiny_trainer(tok, ATRGRPOConfig(**grpo_config_kwargs(tmp_path)), model=model)
    said: list[str] = []
    monkeypatch.setattr(transformers_trainer.logger, "warning", said.append)  # where transformers reports it
    for trainer, reported in ((peer, True), (ours, False)):
        said.clear()
        trainer._issue_warnings_after_load(loaded)
        assert any("missing keys" in line for line in said) is reported
    said.clear()
    dropped = {k: v for k, v in weights.items() if k != "model.norm.weight"}
    ours._issue_warnings_after_load(model.load_state_dict(dropped, strict=False))
    assert said == ["There were missing keys in the checkpoint model loaded: ['model.norm.weight']."]
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_checkpoint_whose_weights_hold_a_nan_is_refused_before_any_step(tmp_path):
    """transformers' resume loads a NaN weight without a word and the first loss is NaN; the trainer refuses it
    once loaded, naming the tensor, with nothing trained or written."""
    from grpo_helpers import grpo_config_kwargs, tiny_trainer
    from safetensors.torch import load_file, save_file

    from atr_llm.config import ATRGRPOConfig
    from atr_llm.tiny import build_tokenizer_and_model

    folder = _checkpoint(tmp_path / "out" / "checkpoint-2")
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.norm.weight"][3] = float("nan")
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tok, model = build_tokenizer_and_model("toy")
    trainer = tiny_trainer(tok, ATRGRPOConfig(**grpo_config_kwargs(tmp_path, max_steps=4)), model=model)
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    with pytest.raises(ValueError, match=r"checkpoint-2 cannot be resumed: its weight model\.norm\.weight holds a NaN"):
        trainer.train(resume_from_checkpoint=str(folder))
    assert trainer.state.global_step == 0 and sorted(p.name for p in (tmp_path / "out").iterdir()) == before
