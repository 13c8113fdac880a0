"""A whole training run: ``ScriptArguments`` (data, model source, stages), trl's ``ModelConfig`` and ``ATRGRPOConfig``
in one ``RunConfig``. Each config checks its own fields when it is built; ``RunConfig`` checks what spans them before
any work (no model loads, no SFT runs, no file or lock is written until it is built): the model options a backend
honours, the relations between the three (``fields.RUN_RELATIONS``), the data files (read, so a malformed row stops the
run here), the output folder, and a resume's compatibility with the checkpoint it continues.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..run_lock import LOCK_NAME
from .fields import MODEL_DOMAINS, RUN_RELATIONS, ConfigError, check_fields, check_relations_of, script_domains
from .library_fields import check_train_library_fields
from .trainer_config import ATRGRPOConfig

__all__ = ["RunConfig", "ScriptArguments", "UNSLOTH_MODEL_OPTIONS", "finished_run", "model_to_train"]


@dataclass
class ScriptArguments:
    """Data, model source and stages."""

    dataset_name: str = field(
        default="arithmetic", metadata={"help": "arithmetic, dapo-math-17k, dapo-math-17k-processed, ..."}
    )
    dataset_path: str | None = field(default=None, metadata={"help": "local jsonl/parquet with the source's columns"})
    dataset_limit: int | None = field(default=None, metadata={"help": "use the first N rows (arithmetic: generate N)"})
    tiny: bool = field(default=False, metadata={"help": "build the offline tiny Qwen3 + local tokenizer"})
    tiny_vocab: str = field(
        default="toy",
        metadata={
            "help": "--tiny's vocabulary: 'toy' (a few hundred BPE tokens) or 'qwen3' (Qwen3's real tokenizer, 151,936 rows)"
        },
    )
    backend: str = field(default="trl", metadata={"help": "'trl' or 'unsloth' (CUDA only)"})
    sft_steps: int = field(default=0, metadata={"help": "formatting SFT steps before RL (0 = none)"})
    sft_dataset_name: str | None = field(default=None, metadata={"help": "SFT data (default: dataset_name)"})
    sft_dataset_path: str | None = field(default=None)
    sft_learning_rate: float = field(default=3e-3)
    sft_batch_size: int = field(default=32)
    sft_implementation: str = field(
        default="trl",
        metadata={
            "help": "'trl' (TRL's SFTTrainer) or 'plain' (a torch loop that scores only the completion positions: "
            "several times cheaper at Qwen3's vocabulary on CPU; no PEFT)"
        },
    )
    reward_timeout_seconds: int = field(default=5)
    use_vllm_if_available: bool = field(
        default=False,
        metadata={
            "help": "generate with TRL's colocated vLLM when vllm is importable and CUDA is present (the presets "
            "set it); otherwise transformers' generate, with a warning about speed"
        },
    )
    truncated_reward: float | None = field(
        default=None,
        metadata={
            "help": "reward of a completion cut at max_completion_length (no eos), instead of its grade; "
            "None grades it like any other (DAPO's overlong punishment: 0 makes not stopping wrong)"
        },
    )
    reward_control: str = field(
        default="none",
        metadata={
            "help": "'none' (train on the graded rewards) or 'shuffled': the no-signal control, each group's rewards "
            "permuted among its completions (seeded by seed and step; atr_llm.rewards.GroupShuffledReward)"
        },
    )
    allow_fresh_optimizer: bool = field(
        default=False,
        metadata={
            "help": "with --resume_from_checkpoint: resume from a checkpoint without optimizer.pt, scheduler.pt or "
            "rng_state*.pth (saved with save_only_model), Adam's moments, the schedule or the random streams "
            "restarting (refused without it)"
        },
    )
    overwrite: bool = field(
        default=False,
        metadata={"help": "train into an --output_dir that holds a finished run (its final/ model is replaced)"},
    )

    def __post_init__(self):
        check_fields(self, script_domains())


UNSLOTH_MODEL_OPTIONS = ("model_name_or_path", "use_peft", "lora_r", "lora_alpha", "lora_target_modules")
"""The trl.ModelConfig options --backend unsloth builds its model and LoRA from (``load_unsloth_model``)."""


def _changed_model_options(model_args) -> list[str]:
    """The trl.ModelConfig fields of ``model_args`` whose values differ from ModelConfig's defaults."""
    changed = []
    for f in dataclasses.fields(type(model_args)):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if default is not dataclasses.MISSING and getattr(model_args, f.name) != default:
            changed.append(f.name)
    return changed


def check_model_options(model_args, training_args, *, backend: str = "trl") -> None:
    """trl.ModelConfig's loading options, each honoured or refused by name (a ``ConfigError``) before a model loads:
    ``attn_implementation`` is passed to transformers (a name its attention registry knows, or a hub kernel
    ``org/repo``; ``sdpa`` or unset with ``fast_generation_attention='packed_gqa'``, which replaces SDPA's decode
    step); ``load_in_4bit`` / ``load_in_8bit`` (bitsandbytes quantisation) are refused: quantised loading is not
    tested here; with ``backend='unsloth'`` every option beyond ``UNSLOTH_MODEL_OPTIONS`` is refused (Unsloth's
    loader takes only those)."""
    from ..compat import attention_implementations

    check_fields(model_args, MODEL_DOMAINS)
    for flag in ("load_in_4bit", "load_in_8bit"):
        if getattr(model_args, flag, False):
            raise ConfigError(
                flag,
                True,
                "not supported: atr_llm.train loads models unquantised (bitsandbytes loading is untested here); "
                "leave it false",
            )
    if backend == "unsloth":
        dropped = [name for name in _changed_model_options(model_args) if name not in UNSLOTH_MODEL_OPTIONS]
        if dropped:
            name = dropped[0]
            raise ConfigError(
                name,
                getattr(model_args, name),
                "not honoured by backend 'unsloth', whose loader takes only "
                + ", ".join(UNSLOTH_MODEL_OPTIONS)
                + "; leave it at its default or use backend 'trl'",
            )
    attention = getattr(model_args, "attn_implementation", None)
    if attention is None:
        return
    known = attention_implementations()
    if attention not in known and "/" not in attention:
        raise ConfigError(
            "attn_implementation", attention, f"one of {', '.join(sorted(known))} or a hub kernel org/repo"
        )
    if getattr(training_args, "fast_generation_attention", "sdpa") == "packed_gqa" and attention != "sdpa":
        raise ConfigError(
            "attn_implementation",
            attention,
            "'sdpa' or unset with fast_generation_attention packed_gqa, which replaces SDPA's decode step",
        )


def check_model_source(name: str | None) -> None:
    """``model_name_or_path`` names a model that can load: a folder (absolute, ``./``, ``~`` or present here) must hold
    a ``config.json`` (or an adapter's ``adapter_config.json``); a hub id must be in the local cache when the hub is
    off (``HF_HUB_OFFLINE=1``). A refusal is a ``ConfigError`` naming the field."""
    import os

    if not name:
        return
    folder = Path(os.path.expanduser(name))
    if folder.is_absolute() or name.startswith((".", "~")) or folder.exists():
        if not folder.is_dir():
            raise ConfigError("model_name_or_path", name, "no such model folder (a hub id is ORG/NAME)")
        if not any((folder / f).is_file() for f in ("config.json", "adapter_config.json")):
            raise ConfigError("model_name_or_path", name, "not a model folder: it has no config.json")
        return
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str):
            raise ConfigError(
                "model_name_or_path", name, "not in the local hub cache, and HF_HUB_OFFLINE forbids downloading it"
            )


def finished_run(output_dir: Path) -> bool:
    """Whether ``output_dir`` holds a finished run: its ``final/`` model (renamed into place whole, so complete)."""
    return (Path(output_dir) / "final" / "config.json").exists() or (
        Path(output_dir) / "final" / "adapter_config.json"
    ).exists()


def model_to_train(script, model_args) -> dict[str, Any]:
    """What can be known of the model a run will train before it loads (``atr_llm.checkpoints.model_identity``'s
    keys): the tiny model's architecture, a local folder's ``config.json``, or a hub id's name."""
    from ..checkpoints import config_model
    from ..tiny import tiny_model_identity

    if script.tiny:
        return tiny_model_identity(script.tiny_vocab)
    name = getattr(model_args, "model_name_or_path", None)
    if not name:
        return {}
    config = Path(name) / "config.json"
    if config.is_file():
        import json

        try:
            values = json.loads(config.read_text())
        except (OSError, ValueError):
            return {}
        return config_model(values)
    return {"name_or_path": str(name)}


def _module_names(script, model_args) -> list[str] | None:
    """The module names of the model a run will train, from its config alone (built on the meta device: nothing
    allocated, no weights read): the tiny model's architecture, a local folder's ``config.json`` or a cached hub
    id's; None when the config is not at hand."""
    from transformers import AutoConfig

    from ..checkpoint_files import model_on_meta

    name = getattr(model_args, "model_name_or_path", None)
    try:
        if script.tiny:
            from ..tiny import TINY_ARCHITECTURE

            config = AutoConfig.for_model(TINY_ARCHITECTURE["model_type"], num_hidden_layers=1)
        elif name:
            config = AutoConfig.from_pretrained(str(name), local_files_only=True, trust_remote_code=False)
        else:
            return None
        return [n for n, _ in model_on_meta(config).named_modules() if n]
    except Exception:  # noqa: BLE001 - no config at hand: PEFT checks the names when the model loads
        return None


def check_lora_targets(script, model_args) -> None:
    """``lora_target_modules`` name modules the model has, by PEFT's own rule (``check_target_module_exists``): a
    list item matches a module's full name or its name after a dot, a single text is a regular expression matched
    against whole names (``all-linear`` is PEFT's choice of every linear layer). PEFT refused one that matches
    nothing after the model was built."""
    import re

    targets = getattr(model_args, "lora_target_modules", None)
    if not getattr(model_args, "use_peft", False) or targets in (None, "all-linear", "all_linear"):
        return
    if isinstance(targets, str):
        try:
            pattern = re.compile(targets)
        except re.error as e:
            raise ConfigError("lora_target_modules", targets, f"not a regular expression ({e})") from None
        matches = lambda name: pattern.fullmatch(name) is not None  # noqa: E731
        unmatched = [targets]
    else:
        unmatched = [t for t in targets if t != "all-linear"]
        matches = None
    names = _module_names(script, model_args) if unmatched else None
    if names is None:
        return
    for target in unmatched:
        found = matches or (lambda name, t=target: name == t or name.endswith("." + t))
        if not any(found(n) for n in names):
            leaves = sorted({n.rsplit(".", 1)[-1] for n in names if not n.rsplit(".", 1)[-1].isdigit()})
            how = "a module name"
            if matches:  # TRL's ModelConfig passes one value as a text, which PEFT reads as a pattern
                named = any(n.endswith("." + target) for n in names)
                how = "one value is a pattern PEFT matches against whole names" + (
                    f": write '.*{target}', or name two modules" if named else ""
                )
            raise ConfigError(
                "lora_target_modules", target, f"the model has no such module ({how}; its modules: {', '.join(leaves)})"
            )


def check_topk_within_vocabulary(training, model: dict[str, Any]) -> None:
    """``dppo_topk`` of a top-K rule at most the vocabulary size - 1, where the model's vocabulary is known before it
    loads (``model_to_train``: the tiny model, a local folder's ``config.json``); the trainer checks it again on the
    loaded model (a hub model), which was after the SFT stage."""
    import atr_theory as at

    vocabulary = model.get("vocab_size")
    method = getattr(training, "resolved_method", None)
    if not isinstance(vocabulary, int) or method is None or not at.get_method(method.name).needs_topk:
        return
    if training.dppo_topk > vocabulary - 1:
        raise ConfigError(
            "dppo_topk",
            training.dppo_topk,
            f"expected at most the vocabulary size - 1 = {vocabulary - 1} (the other tokens of this model's vocabulary)",
        )


def model_positions(script, model_args) -> int | None:
    """The positions the model a run trains was built for (``max_position_embeddings``), where known before it loads
    and not stretched by a RoPE scaling: the tiny model's, or a local folder's ``config.json``; else None."""
    import json

    if script.tiny:
        from ..tiny import TINY_POSITIONS

        return TINY_POSITIONS
    config = Path(str(getattr(model_args, "model_name_or_path", None) or "")) / "config.json"
    try:
        values = json.loads(config.read_text()) if config.is_file() else {}
    except (OSError, ValueError):
        return None
    rope = values.get("rope_parameters") if isinstance(values, dict) else None
    if not isinstance(values, dict) or not isinstance(rope or {}, dict):  # a config.json transformers will refuse
        return None
    scaled = values.get("rope_scaling") or (rope or {}).get("rope_type", "default") != "default"
    positions = values.get("max_position_embeddings")
    return positions if isinstance(positions, int) and not isinstance(positions, bool) and not scaled else None


def check_completion_within_positions(training, script, model_args) -> None:
    """``max_completion_length`` within the model's positions (``model_positions``): a completion longer than them
    alone runs past the last position the model was built for, which transformers only warns about."""
    positions = model_positions(script, model_args)
    if positions is not None and training.max_completion_length > positions:
        raise ConfigError(
            "max_completion_length",
            training.max_completion_length,
            f"expected at most {positions}: the model has {positions} positions (max_position_embeddings), "
            "and the completion alone would run past them",
        )


def _named(name: str, call, *args, **kwargs):
    """``call(*args, **kwargs)``, a ``UsageError`` it raises turned into a ``ConfigError`` naming field ``name``."""
    from ..command_line import UsageError

    try:
        return call(*args, **kwargs)
    except UsageError as e:
        if e.expected is None:
            raise
        raise ConfigError(name, e.value, e.expected) from None


@dataclass
class RunConfig:
    """One training run's configuration, checked whole when it is built: ``python -m atr_llm.train`` builds one from
    its command line and ``--config`` file, a Python caller from the three configs. ``datasets`` holds the local data
    files it read (``{"dataset_path": Dataset, "sft_dataset_path": Dataset}``), for the run to use as they are, and
    ``checkpoint`` the folder a resume continues (``resume_from_checkpoint`` resolved: ``latest`` is the newest
    complete one). A refusal is a ``ConfigError`` naming the field."""

    script: ScriptArguments
    training: ATRGRPOConfig
    model: Any
    datasets: dict = field(default_factory=dict, init=False, repr=False)
    checkpoint: Path | None = field(default=None, init=False)

    def __post_init__(self):
        from ..data import load_source

        script, training, model = self.script, self.training, self.model
        from trl import ModelConfig

        for name, config, cls in (
            ("script", script, ScriptArguments),
            ("training", training, ATRGRPOConfig),
            ("model", model, ModelConfig),
        ):
            if not isinstance(config, cls):
                raise ConfigError(name, type(config).__name__, f"expected a {cls.__name__}")
        check_fields(script, script_domains())  # again: a field may have been written after the build
        check_model_options(model, training, backend=script.backend)
        check_model_source(getattr(model, "model_name_or_path", None))
        check_lora_targets(script, model)
        check_topk_within_vocabulary(training, model_to_train(script, model))
        check_completion_within_positions(training, script, model)
        check_train_library_fields(training, model)  # one reward function, no evaluation set, the model built here
        check_relations_of(RUN_RELATIONS, (script, training, model))
        for name, source, path in (
            ("dataset_path", script.dataset_name, script.dataset_path),
            ("sft_dataset_path", script.sft_dataset_name or script.dataset_name, script.sft_dataset_path),
        ):
            if path is not None:  # read now: a malformed row stops the run before a model loads, naming its line
                self.datasets[name] = _named(name, load_source, source, path, script.dataset_limit, argument=name)
        self._check_enough_prompts()
        self.checkpoint = self._checkpoint_to_resume()
        if self.checkpoint is None and finished_run(Path(training.output_dir)) and not script.overwrite:
            raise ConfigError(
                "output_dir",
                training.output_dir,
                "holds a finished run (final/); set overwrite true (--overwrite true) to replace it",
            )
        lock = Path(training.output_dir) / LOCK_NAME
        if lock.exists() and not lock.is_file():  # the run would fail taking its lock, after the checks
            raise ConfigError("output_dir", training.output_dir, f"its run lock {lock} is not a file; remove it")
        if script.backend == "unsloth":
            from ..unsloth_backend import require_unsloth

            require_unsloth()

    def _check_enough_prompts(self) -> None:
        """At least one generation's prompts in the training set: TRL's ``RepeatSampler`` keeps only whole groups of
        ``generation_batch_size / num_generations`` prompts, so a smaller set trains 0 steps and the run ends
        "finished" with its start model."""
        training, script = self.training, self.script
        need = training.generation_batch_size // training.num_generations
        loaded = self.datasets.get("dataset_path")
        rows = len(loaded) if loaded is not None else script.dataset_limit
        if rows is not None and rows < need:
            name = "dataset_path" if loaded is not None and script.dataset_limit is None else "dataset_limit"
            value = script.dataset_path if name == "dataset_path" else script.dataset_limit
            raise ConfigError(
                name,
                value,
                f"{rows} prompts, fewer than one generation's {need} (generation_batch_size "
                f"{training.generation_batch_size} / num_generations {training.num_generations}): no step would train",
            )

    def _checkpoint_to_resume(self) -> Path | None:
        """The folder ``resume_from_checkpoint`` names (``latest``: the newest complete one of ``output_dir``),
        complete and compatible with this run (``atr_llm.checkpoints.check_resume_compatible``); None without one."""
        from ..checkpoints import LATEST, check_resume_compatible, is_complete_checkpoint, latest_complete_checkpoint
        from .trainer_config import config_field

        resume, out = self.training.resume_from_checkpoint, Path(self.training.output_dir)
        if resume is None:
            if self.script.allow_fresh_optimizer:  # an option nothing reads is refused, not dropped
                raise ConfigError(
                    "allow_fresh_optimizer", True, "set, but nothing is resumed: it applies to resume_from_checkpoint"
                )
            return None
        if str(resume) in LATEST:
            checkpoint = latest_complete_checkpoint(out)
            if checkpoint is None:
                raise ConfigError("resume_from_checkpoint", resume, f"no complete checkpoint-* folder in {out}")
        elif not Path(resume).is_dir():
            raise ConfigError("resume_from_checkpoint", resume, "no such checkpoint folder")
        elif not is_complete_checkpoint(resume):
            raise ConfigError(
                "resume_from_checkpoint", resume, "not a complete checkpoint (no readable trainer_state.json)"
            )
        else:
            checkpoint = Path(resume)
        from ..checkpoint_files import checkpoint_file_problem, method_record_problem, restored_optimizer_settings
        from ..checkpoints import recorded_method, trained_steps

        problem = method_record_problem(checkpoint)  # before what it trained is read from it
        if problem:
            raise ConfigError("resume_from_checkpoint", resume, f"{checkpoint} cannot be resumed: {problem}")
        record, resolved, delta = recorded_method(checkpoint), self.training.resolved_method, self.training.delta
        if record is not None and delta is not None and record["method"] == self.training.method != resolved.name:
            raise ConfigError(
                "delta",
                delta,
                f"{checkpoint} trained {record['method']} without TRL's delta, which makes this run {resolved.name} "
                f"(TRL's two-sided clip on {record['method']}'s range); leave delta unset to continue it",
            )
        try:
            check_resume_compatible(checkpoint, resolved, model_to_train(self.script, self.model), name=config_field)
        except ValueError as e:
            raise ConfigError("resume_from_checkpoint", resume, str(e)) from None
        allow = self.script.allow_fresh_optimizer
        problem = checkpoint_file_problem(checkpoint, allow_fresh_optimizer=allow)  # after what it trained
        if problem:
            raise ConfigError("resume_from_checkpoint", resume, f"{checkpoint} cannot be resumed: {problem}")
        restored = restored_optimizer_settings(checkpoint, self.training)
        if restored:
            name, saved, value = restored
            raise ConfigError(
                name,
                value,
                f"{checkpoint} trained with {name} {saved:g}, which a resume restores from its optimizer.pt (this "
                f"value would be dropped); pass --{name} {saved:g} to continue it, or start a new run",
            )
        step, steps = trained_steps(checkpoint), self.training.max_steps
        if steps is not None and 0 < steps < step:
            raise ConfigError(
                "max_steps", steps, f"{checkpoint} has trained {step} steps already; set max_steps to {step} or more"
            )
        return checkpoint
