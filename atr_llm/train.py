"""``python -m atr_llm.train``: formatting SFT, then GRPO with any clipping method of atr_theory.

TRL conventions: dataclass arguments (``ScriptArguments``, ``ATRGRPOConfig``,
``trl.ModelConfig``), ``--config FILE.yaml`` for presets (``atr_llm/configs/``), any field overridable
on the command line. Several GPUs: ``accelerate launch -m atr_llm.train --config ...``.

    python -m atr_llm.train --config atr_llm/configs/cpu-tiny.yaml             # offline CPU demo
    python -m atr_llm.train --config atr_llm/configs/cpu-tiny.yaml --max_steps 4 --output_dir runs/x
    python -m atr_llm.train --config atr_llm/configs/qwen3-1.7b-atr.yaml       # the paper's run (GPU)
    python -m atr_llm.train --config ... --resume_from_checkpoint runs/x/checkpoint-20

Bad configurations (unknown method, delta <= 0, a missing dataset file, Unsloth without CUDA) fail
before any model is loaded.
"""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .cli import atomic_write_text, directory_written_whole, output_directory, refuse, refuse_unknown_options


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
    overwrite: bool = field(
        default=False,
        metadata={"help": "train into an --output_dir that holds a finished run (its final/ model is replaced)"},
    )


USAGE = """\
python -m atr_llm.train needs a config or arguments. To start:

  python -m atr_llm.train --config atr_llm/configs/cpu-tiny.yaml      # offline CPU demo (a few minutes)
  python -m atr_llm.train --config atr_llm/configs/qwen3-1.7b-atr.yaml  # the paper's ATR run (CUDA GPU)
  python -m atr_llm.train --help                                      # every option (TRL's and ours)

Presets for every method of the paper's Tables 2-3: atr_llm/configs/qwen3-{1.7b,8b}-<run>.yaml."""


def config_path(argv: list[str]) -> str | None:
    """The FILE of ``--config FILE`` / ``--config=FILE`` in ``argv``, None without one."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def config_file_contents(argv: list[str] | None) -> dict | None:
    """The mapping in ``--config FILE`` (or ``--config=FILE``), None without one; a file that is missing, a folder,
    unreadable, not YAML or not a mapping is refused in one line (TRL's parser would raise FileNotFoundError /
    IsADirectoryError / a YAML traceback)."""
    import yaml

    argv = sys.argv[1:] if argv is None else argv
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            continue
        if not os.path.exists(path):
            raise refuse("--config", path, "no such file")
        if not os.path.isfile(path):
            raise refuse("--config", path, "expected a YAML file, got a folder")
        try:
            with open(path, encoding="utf-8") as handle:
                content = yaml.safe_load(handle)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise refuse("--config", path, f"not a readable YAML file ({type(e).__name__})") from None
        if content is not None and not isinstance(content, dict):
            raise refuse("--config", path, f"expected a YAML mapping of option: value, got a {type(content).__name__}")
        return content
    return None


NEGATIVE_NUMBER = re.compile(r"-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|-inf(?:inity)?|-nan", re.IGNORECASE)


def negative_values_attached(argv: list[str]) -> list[str]:
    """``--flag -1e-4`` as ``--flag=-1e-4``: argparse reads a token that starts with ``-`` and is not a plain
    negative integer or decimal (``-1e-4``, ``-inf``) as an option, so ``--x -1e-4`` and ``--x=-1e-4`` would differ."""
    out: list[str] = []
    for token in argv:
        if out and NEGATIVE_NUMBER.fullmatch(token) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def parse(argv=None):
    """Parse TRL-style arguments (``--config FILE.yaml`` and ``--field value``); configuration errors,
    including a bf16 (GPU) preset on a machine without CUDA, come back as one ValueError naming the fix."""
    from trl import ModelConfig, TrlParser

    from .trainer import ATRGRPOConfig

    class OneLineTrlParser(TrlParser):
        def error(self, message: str):  # argparse's hook: one ValueError (one line, exit 2), not the usage block
            raise ValueError(message)

    argv = negative_values_attached(sys.argv[1:] if argv is None else list(argv))
    # TRL's parser finds the config file only as "--config FILE": "--config=FILE" would be dropped silently
    argv = [part for a in argv for part in (["--config", a.split("=", 1)[1]] if a.startswith("--config=") else [a])]
    content = config_file_contents(argv) or {}
    parser = OneLineTrlParser((ScriptArguments, ATRGRPOConfig, ModelConfig), allow_abbrev=False)
    declare(parser)
    try:
        without_config = [a for i, a in enumerate(argv) if a != "--config" and (i == 0 or argv[i - 1] != "--config")]
        refuse_unknown_options(parser, without_config)  # before TRL builds its configs (which may fail first)
        _, unknown = parser.parse_known_args(without_config)
        if unknown:
            raise ValueError(f"unrecognized arguments: {' '.join(unknown)}")
        return parser.parse_args_and_config(args=argv)
    except ValueError as e:
        config = config_path(argv)
        unknown = re.match(r"Unknown arguments from config file: \[(.*)\]", str(e))
        if unknown and config:  # TRL's message, reworded: the file and its keys
            keys = [k.strip(" '\"").removeprefix("--") for k in unknown.group(1).split(",")]
            keys = [k for k in keys if k in content]
            raise refuse(
                "--config", config, f"unknown key(s) {', '.join(keys)}: not an option of atr_llm.train"
            ) from None
        bad = re.match(r"argument (--[\w-]+)(?:/--[\w-]+)?: (.*)", str(e))
        typed = bad and any(a == bad.group(1) or a.startswith(bad.group(1) + "=") for a in argv)
        if bad and config and bad.group(1).removeprefix("--").replace("-", "_") in content and not typed:
            key = bad.group(1).removeprefix("--").replace("-", "_")
            raise refuse("--config", config, f"key {key}: {bad.group(2)}") from None
        if str(e).startswith("argument "):  # a declared type's or argparse's refusal, as this package words them
            from .cli import reworded

            raise ValueError(reworded(str(e), argv)) from None
        if "bf16" in str(e) and "use_cpu" in str(e):  # transformers' check, reworded for this package
            raise ValueError(
                "this configuration asks for bf16 on a GPU, and no CUDA device is available here: run it on a "
                "CUDA machine, or on CPU with --bf16 false --use_cpu true (slow at Qwen3 scale; the CPU demo is "
                "--config atr_llm/configs/cpu-tiny.yaml)"
            ) from None
        raise


def declared_fields() -> dict:
    """``python -m atr_llm.train``'s declaration of the values that the configs do not check themselves: each field's
    domain (atr_llm.cli's types), checked on the command line while parsing (the refusal names the flag) and again on
    the parsed values (a YAML config's values reach the dataclasses already typed). TRL's and transformers' fields get
    the domain their code needs, which they check only once training has started (after the SFT stage has run and
    saved a model), or never: a NaN learning rate trains. The method's own fields are checked by the registry when
    ``ATRGRPOConfig`` is built."""
    from .cli_types import SEED, Integer, OneOf, ReadFile, Real
    from .data import OFFLINE_TASKS, SOURCES
    from .method_choice import trl_domains

    datasets = OneOf([*OFFLINE_TASKS, *SOURCES])

    return {
        # TRL / transformers fields
        "learning_rate": Real(0),
        "weight_decay": Real(0),
        "beta": Real(0),
        "max_completion_length": Integer(1),
        "max_prompt_length": Integer(1),
        "per_device_train_batch_size": Integer(1),
        "per_device_eval_batch_size": Integer(1),
        "gradient_accumulation_steps": Integer(1),
        "num_generations": Integer(2),
        "num_iterations": Integer(1),
        "steps_per_generation": Integer(1),
        "seed": SEED,
        "temperature": Real(0, open_low=True),
        "top_p": Real(0, 1, open_low=True),
        "repetition_penalty": Real(0, open_low=True),
        "top_k": Integer(0),
        "max_steps": Integer(-1),
        "num_train_epochs": Real(0),
        "save_steps": Real(0, open_low=True),
        "logging_steps": Real(0, open_low=True),
        "warmup_ratio": Real(0, 1),
        "max_grad_norm": Real(0),
        **trl_domains(),
        # ScriptArguments
        "dataset_name": datasets,
        "sft_dataset_name": datasets,
        "dataset_path": ReadFile(),
        "sft_dataset_path": ReadFile(),
        "dataset_limit": Integer(1),
        "tiny_vocab": OneOf(("toy", "qwen3")),
        "backend": OneOf(("trl", "unsloth")),
        "sft_steps": Integer(0),
        "sft_learning_rate": Real(0, open_low=True),
        "sft_batch_size": Integer(1),
        "sft_implementation": OneOf(("trl", "plain")),
        "reward_timeout_seconds": Integer(1),
        "truncated_reward": Real(),
    }


def declare(parser) -> None:
    """Give each action of ``parser`` whose field is in ``declared_fields()`` that declaration as its type (TRL's
    parser types a field by its annotation: ``int``, ``float``, ``str``)."""
    declared = declared_fields()
    for action in parser._actions:
        if action.dest in declared:
            action.type = declared[action.dest]


def check_training_values(*namespaces) -> None:
    """The parsed values (command line or YAML) against ``declared_fields()``, each refused by its flag; then the
    combination a run of no steps (``max_steps`` 0, or -1 without epochs)."""
    import argparse

    from .cli import refuse
    from .method_choice import trl_domains

    # TRL's own domains were checked when ATRGRPOConfig was built (method_choice.check_trl_domains)
    declared = {k: v for k, v in declared_fields().items() if k not in trl_domains()}
    for namespace in namespaces:
        for name, declaration in declared.items():
            value = getattr(namespace, name, None)
            if value is None or hasattr(value, "value"):  # an enum: the library's own type checked it
                continue
            for item in value if isinstance(value, (list, tuple)) else [value]:
                try:
                    declaration.check(str(item) if isinstance(item, os.PathLike) else item)
                except argparse.ArgumentTypeError as e:
                    raise refuse(f"--{name}", item, str(e).split(": ", 1)[-1]) from None
    args = namespaces[0]
    if args.max_steps == 0 or (args.max_steps < 0 and not args.num_train_epochs > 0):
        raise refuse("--max_steps", args.max_steps, "expected an integer >= 1 (or -1 with --num_train_epochs > 0)")


def check_before_loading(script_args, training_args, model_args=None) -> dict:
    """Everything that can be checked without a model and that the configs do not check themselves: numbers, data
    files (read and their rows checked), the checkpoint to resume from, the output folder, the backend. (The method,
    its form and parameters were validated when ATRGRPOConfig was built.) A refusal names the argument. Returns the
    local datasets it read, by flag (``--dataset_path``, ``--sft_dataset_path``), for the run to use as they are."""
    from .checkpoints import LATEST, check_resume_keeps_the_form, is_complete_checkpoint, latest_complete_checkpoint
    from .cli import refuse
    from .data import load_source
    from .sft import check_sft_implementation

    loaded = {}
    check_training_values(training_args, script_args)
    for flag, name, path in (
        ("--dataset_path", script_args.dataset_name, script_args.dataset_path),
        ("--sft_dataset_path", script_args.sft_dataset_name or script_args.dataset_name, script_args.sft_dataset_path),
    ):
        if path is not None:  # read now: a malformed row stops the run before a model loads, naming its line
            loaded[flag] = load_source(name, path, script_args.dataset_limit, argument=flag)
    check_sft_implementation(script_args.sft_implementation, use_peft=bool(getattr(model_args, "use_peft", False)))
    if model_args is not None:
        check_model_options(model_args, training_args, backend=script_args.backend)

    out = output_directory("--output_dir", training_args.output_dir)
    resume = training_args.resume_from_checkpoint
    if resume is not None:
        if str(resume) in LATEST:
            if latest_complete_checkpoint(out) is None:
                raise refuse("--resume_from_checkpoint", resume, f"no complete checkpoint-* folder in {out}")
        elif not Path(resume).is_dir():
            raise refuse("--resume_from_checkpoint", resume, "no such checkpoint folder")
        elif not is_complete_checkpoint(resume):
            raise refuse(
                "--resume_from_checkpoint", resume, "not a complete checkpoint (no readable trainer_state.json)"
            )
        checkpoint = latest_complete_checkpoint(out) if str(resume) in LATEST else Path(resume)
        if hasattr(training_args, "resolved_method"):  # a resume never switches the rule's form silently
            try:
                check_resume_keeps_the_form(checkpoint, training_args.resolved_method)
            except ValueError as e:
                raise refuse("--resume_from_checkpoint", resume, str(e)) from None
    elif finished_run(out) and not script_args.overwrite:
        raise refuse("--output_dir", str(out), "holds a finished run (final/); pass --overwrite true to replace it")
    if script_args.backend == "unsloth":
        from .unsloth_backend import require_unsloth

        require_unsloth()
    return loaded


UNSLOTH_MODEL_OPTIONS = ("model_name_or_path", "use_peft", "lora_r", "lora_alpha", "lora_target_modules")
"""The trl.ModelConfig options --backend unsloth builds its model and LoRA from (``load_unsloth_model``)."""


def _changed_model_options(model_args) -> list[str]:
    """The trl.ModelConfig fields of ``model_args`` whose values differ from ModelConfig's defaults."""
    import dataclasses

    changed = []
    for f in dataclasses.fields(type(model_args)):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if default is not dataclasses.MISSING and getattr(model_args, f.name) != default:
            changed.append(f.name)
    return changed


def check_model_options(model_args, training_args, *, backend: str = "trl") -> None:
    """trl.ModelConfig's loading options, each honoured or refused by name before a model loads:
    ``--attn_implementation`` is passed to transformers (a name its attention registry knows, or a hub kernel
    ``org/repo``; ``sdpa`` or unset with ``--fast_generation_attention packed_gqa``, which replaces SDPA's decode
    step); ``--load_in_4bit`` / ``--load_in_8bit`` (bitsandbytes quantisation) are refused: quantised loading is not
    tested here; with ``--backend unsloth`` every option beyond ``UNSLOTH_MODEL_OPTIONS`` is refused (Unsloth's
    loader takes only those)."""
    from .cli import refuse
    from .compat import attention_implementations

    for flag in ("load_in_4bit", "load_in_8bit"):
        if getattr(model_args, flag, False):
            raise refuse(
                f"--{flag}",
                "true",
                "not supported: atr_llm.train loads models unquantised (bitsandbytes loading is "
                "untested here); leave it false",
            )
    if backend == "unsloth":
        dropped = [name for name in _changed_model_options(model_args) if name not in UNSLOTH_MODEL_OPTIONS]
        if dropped:
            name = dropped[0]
            raise refuse(
                f"--{name}",
                getattr(model_args, name),
                "not honoured by --backend unsloth, whose loader takes only "
                + ", ".join(f"--{o}" for o in UNSLOTH_MODEL_OPTIONS)
                + "; leave it at its default or use --backend trl",
            )
    attention = getattr(model_args, "attn_implementation", None)
    if attention is None:
        return
    known = attention_implementations()
    if attention not in known and "/" not in attention:
        raise refuse("--attn_implementation", attention, f"one of {', '.join(sorted(known))} or a hub kernel org/repo")
    if getattr(training_args, "fast_generation_attention", "sdpa") == "packed_gqa" and attention != "sdpa":
        raise refuse(
            "--attn_implementation",
            attention,
            "'sdpa' or unset with --fast_generation_attention packed_gqa, which replaces SDPA's decode step",
        )


def finished_run(output_dir: Path) -> bool:
    """Whether ``output_dir`` holds a finished run: its ``final/`` model (renamed into place whole, so complete)."""
    return (Path(output_dir) / "final" / "config.json").exists() or (
        Path(output_dir) / "final" / "adapter_config.json"
    ).exists()


def load_model_and_tokenizer(script_args, model_args, training_args):
    from .tiny import build_tokenizer_and_model

    attention = getattr(model_args, "attn_implementation", None)  # checked by check_model_options
    if script_args.tiny:
        tok, model = build_tokenizer_and_model(script_args.tiny_vocab, seed=training_args.seed)
        if attention is not None:
            model.set_attn_implementation(attention)
        return model, tok
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = model_args.model_name_or_path
    if not name:
        raise ValueError("set --model_name_or_path (a hub id such as Qwen/Qwen3-1.7B or a local folder) or --tiny")
    # TRL >= 1.16's ModelConfig has no trust_remote_code field (older ones do)
    hub = {
        "revision": getattr(model_args, "model_revision", None) or "main",
        "trust_remote_code": getattr(model_args, "trust_remote_code", False),
    }
    tok = AutoTokenizer.from_pretrained(name, **hub)
    if tok.pad_token is None or tok.pad_token_id == tok.eos_token_id:
        tok.pad_token = "<|endoftext|>" if "<|endoftext|>" in tok.get_vocab() else tok.eos_token
    dtype = model_args.dtype if getattr(model_args, "dtype", None) not in (None, "auto") else "auto"
    extra = {"attn_implementation": attention} if attention is not None else {}
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **hub, **extra)
    return model, tok


def requested_backend(argv=None) -> str:
    """``--backend`` from the command line, else from the ``--config`` file, else 'trl' (read before anything imports
    trl's trainer: Unsloth must be imported first to patch it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, a in enumerate(argv):
        if a == "--backend" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--backend="):
            return a.split("=", 1)[1]
    return str((config_file_contents(argv) or {}).get("backend", "trl"))


def main(argv=None) -> dict:
    from .runtime import enable_huge_pages_for_large_cpu_tensors

    enable_huge_pages_for_large_cpu_tensors()  # before any model is built: torch reads it once
    if requested_backend(argv) == "unsloth":  # before trl's GRPOTrainer / GRPOConfig are imported anywhere
        from .unsloth_backend import require_unsloth

        require_unsloth()
    from .run_lock import output_dir_lock
    from .trainer import ATRGRPOTrainer  # noqa: F401  (TRL's trainer imported after Unsloth's check, as Unsloth needs)

    with warnings.catch_warnings(record=True) as deferred:  # a refusal is one line: the libraries' warnings wait
        warnings.simplefilter("always")
        script_args, training_args, model_args = parse(argv)
        loaded = check_before_loading(script_args, training_args, model_args)
    for w in deferred:  # the checks passed: show what the libraries said while the configs were built
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    from .generators import _vllm_available

    note = choose_generation(script_args, training_args, vllm_usable=_vllm_available())
    if note:
        warnings.warn(note, stacklevel=1)
    out = Path(training_args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with output_dir_lock(out):  # one run per folder: a second one is refused here, before any model loads
        return _train(script_args, training_args, model_args, loaded, out)


def _train(script_args, training_args, model_args, loaded, out: Path) -> dict:
    """The run itself, from the data to the final model and the summary, inside the folder's lock."""
    from trl import get_peft_config

    from .data import load_source, to_grpo_dataset
    from .rewards import CorrectnessReward
    from .trainer import ATRGRPOTrainer

    train_ds = loaded.get("--dataset_path") or load_source(  # a local file was read by the checks already
        script_args.dataset_name, script_args.dataset_path, script_args.dataset_limit, seed=training_args.seed
    )

    if script_args.backend == "unsloth":
        from .unsloth_backend import load_unsloth_model, unsloth_trainer_class

        model, tok = load_unsloth_model(model_args, training_args)
        trainer_cls = unsloth_trainer_class()
    else:
        model, tok = load_model_and_tokenizer(script_args, model_args, training_args)
        trainer_cls = ATRGRPOTrainer
    peft_config = get_peft_config(model_args)

    resuming = training_args.resume_from_checkpoint is not None
    if script_args.sft_steps > 0 and not resuming:
        from .sft import run_sft

        sft_ds = loaded.get("--sft_dataset_path") or load_source(
            script_args.sft_dataset_name or script_args.dataset_name,
            script_args.sft_dataset_path,
            script_args.dataset_limit,
            seed=training_args.seed + 1,
        )
        model = run_sft(
            model,
            tok,
            sft_ds,
            out / "sft",
            max_steps=script_args.sft_steps,
            learning_rate=script_args.sft_learning_rate,
            batch_size=script_args.sft_batch_size,
            seed=training_args.seed,
            peft_config=peft_config,
            implementation=script_args.sft_implementation,
        )
        if peft_config is not None:  # RL trains a fresh adapter on top of the merged SFT weights
            model = model.merge_and_unload()

    reward = CorrectnessReward(
        timeout_seconds=script_args.reward_timeout_seconds,
        truncated_reward=script_args.truncated_reward,
        eos_token_ids=eos_token_ids(tok, model),
    )
    trainer = trainer_cls(
        model=model,
        reward_funcs=[reward],
        args=training_args,
        train_dataset=to_grpo_dataset(train_ds),
        processing_class=tok,
        peft_config=peft_config,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    save_final_model(trainer, out)
    summary = summarise(trainer.state.log_history)
    atomic_write_text(out / "train_summary.json", json.dumps(summary, indent=1))
    atomic_write_text(out / "log_history.json", json.dumps(trainer.state.log_history))
    print(json.dumps(summary, indent=1))
    return summary


def save_final_model(trainer, out: Path) -> Path:
    """``out/final``, written whole or not at all: saved into ``final.partial`` and renamed into place (a run killed
    while saving leaves no ``final/`` that looks finished; an earlier ``final/``, with ``--overwrite``, is replaced)."""
    from .checkpoints import write_method_record

    with directory_written_whole(out / "final") as partial:
        trainer.save_model(str(partial))
        if hasattr(trainer.args, "resolved_method"):
            write_method_record(partial, trainer.args.resolved_method)
    return out / "final"


def choose_generation(script_args, training_args, *, vllm_usable: bool) -> str | None:
    """Apply ``use_vllm_if_available``: switch on TRL's colocated vLLM (``use_vllm``, ``vllm_mode="colocate"``)
    when ``vllm_usable`` (vllm importable and CUDA present); else return the warning to print (None: nothing
    to say: the user chose ``use_vllm`` themselves, did not ask, or runs the Unsloth backend, whose vLLM is its
    own ``fast_inference`` and which refuses TRL's vLLM importance-sampling correction)."""
    if not script_args.use_vllm_if_available or training_args.use_vllm or script_args.backend == "unsloth":
        return None
    if vllm_usable:
        training_args.use_vllm = True
        training_args.vllm_mode = "colocate"
        return None
    return (
        "vllm is not usable here (not installed, or no CUDA device): generating with transformers' generate, "
        "which is several times slower for long completions; pip install vllm on a CUDA machine for TRL's "
        "colocated vLLM generation"
    )


def eos_token_ids(tokenizer, model) -> set[int]:
    """The ids that end a completion: the tokenizer's eos and the model's generation-config eos (an int or a
    list), as TRL's generation stops on them."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen if isinstance(gen, (list, tuple)) else [gen])
    return {int(i) for i in ids if i is not None}


def summarise(log_history: list[dict]) -> dict:
    """Mean reward over the first and last quarter of logged steps, and the constraint's masked fraction."""
    steps = [h for h in log_history if "reward" in h]
    if not steps:
        return {"logged_steps": 0}
    q = max(1, len(steps) // 4)
    mean = lambda rows, k: sum(r.get(k, 0.0) for r in rows) / len(rows)  # noqa: E731
    return {
        "logged_steps": len(steps),
        "reward_first_quarter": mean(steps[:q], "reward"),
        "reward_last_quarter": mean(steps[-q:], "reward"),
        "frac_masked_mean": mean(steps, "clip/frac_masked"),
        "ratio_max_mean": mean(steps, "clip/ratio_max"),
        "entropy_last": steps[-1].get("entropy"),
        "completion_length_last": steps[-1].get("completions/mean_length"),
        "truncated_frac_last_quarter": mean(steps[-q:], "completions/clipped_ratio"),
    }


if __name__ == "__main__":
    if len(sys.argv) == 1:
        print(USAGE)
        sys.exit(0)
    from .cli import run_command

    run_command(main)  # a configuration error: one line naming what to fix, exit status 2, no traceback
