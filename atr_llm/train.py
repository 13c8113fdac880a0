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

import argparse
import dataclasses
import json
import os
import re
import sys
import warnings
from pathlib import Path

from .command_line import refuse, refuse_unknown_options
from .files import atomic_write_text, directory_written_whole

USAGE = """\
python -m atr_llm.train needs a config or arguments. To start:

  python -m atr_llm.train --config atr_llm/configs/cpu-tiny.yaml      # offline CPU demo (a few minutes)
  python -m atr_llm.train --config atr_llm/configs/qwen3-1.7b-atr.yaml  # the paper's ATR run (CUDA GPU)
  python -m atr_llm.train --help                                      # every option (TRL's and ours)

Presets for every method of the paper's Tables 2-3: atr_llm/configs/qwen3-{1.7b,8b}-<run>.yaml."""


# ---------------------------------------------------------------------------------------------------------------
# the command line and its --config file: text -> values (the configs check them, atr_llm.config)
# ---------------------------------------------------------------------------------------------------------------
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


class YamlKeyError(ValueError):
    """A ``--config`` file's key that is not an option name, or a name given twice."""


def _strict_mapping(loader, node, deep=False):
    """A YAML mapping whose keys are names (strings), each given once; else ``YamlKeyError`` naming the line(s)."""
    import yaml

    loader.flatten_mapping(node)
    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line + 1
        if not isinstance(key, str):
            raise YamlKeyError(f"key {key!r} (line {line}) is not an option name")
        if key in seen:
            raise YamlKeyError(f"key {key} is given twice (lines {seen[key]} and {line}); give it once")
        seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


def read_config_file(path: str) -> dict:
    """The mapping of option: value in the YAML file ``path``; a file that is missing, a folder, unreadable, not YAML,
    not a mapping, or with a key that is not a name or is given twice, is refused in one line naming it."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)
    if not os.path.exists(path):
        raise refuse("--config", path, "no such file")
    if not os.path.isfile(path):  # a folder, or a device, pipe or socket (/dev/null)
        what = "a folder" if os.path.isdir(path) else "no regular file (a device, pipe or socket)"
        raise refuse("--config", path, f"expected a YAML file, got {what}")
    try:
        with open(path, encoding="utf-8") as handle:
            content = yaml.load(handle, Loader=StrictLoader)  # noqa: S506 - a SafeLoader
    except YamlKeyError as e:
        raise refuse("--config", path, str(e)) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise refuse("--config", path, f"not a readable YAML file ({type(e).__name__})") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise refuse("--config", path, f"expected a YAML mapping of option: value, got a {type(content).__name__}")
    for key, value in content.items():
        odd = _not_plain(value)
        if odd is not None:  # !!binary, a timestamp, !!set: read as their text they named a folder b'run'
            raise refuse(
                "--config", path, f"key {key}: a YAML {type(odd).__name__} ({odd!r}); options take text, numbers, "
                "true / false, null, and lists or mappings of them",
            )
    return content


def _not_plain(value: object) -> object | None:
    """The first value in ``value`` (a YAML value, lists and mappings walked) that is not text, a number, a bool or
    null, else None."""
    if isinstance(value, (list, tuple)):
        return next((odd for v in value if (odd := _not_plain(v)) is not None), None)
    if isinstance(value, dict):
        return next((odd for v in [*value, *value.values()] if (odd := _not_plain(v)) is not None), None)
    return None if value is None or isinstance(value, (str, int, float, bool)) else value


def config_path(argv: list[str]) -> str | None:
    """The FILE of ``--config FILE`` / ``--config=FILE`` in ``argv``, None without one."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def build_parser():
    """The declaration of ``python -m atr_llm.train``: an option per field of ``ScriptArguments``, ``ATRGRPOConfig``
    and ``trl.ModelConfig`` (transformers' ``HfArgumentParser``, TRL's convention), plus ``--config FILE``. A field
    with a declared domain (``atr_llm.config.fields``) parses its text with that declaration (``Declared.parse``:
    text to value; the config checks the domain)."""
    from transformers import HfArgumentParser
    from trl import ModelConfig

    from .cli_types import ReadFile
    from .config import ATRGRPOConfig, ScriptArguments
    from .config.fields import MODEL_DOMAINS, script_domains, training_domains

    class OneLineParser(HfArgumentParser):
        def error(self, message: str):  # argparse's hook: one ValueError (one line, exit 2), not the usage block
            raise ValueError(message)

    parser = OneLineParser((ScriptArguments, ATRGRPOConfig, ModelConfig), allow_abbrev=False)
    parser.builds_run_config = True  # its values are checked when train.parse builds the configs (the fuzzer's cue)
    parser.add_argument(
        "--config", type=ReadFile(), help="a YAML file of option: value (the command line overrides it)"
    )
    declared = {**training_domains(), **script_domains(), **MODEL_DOMAINS}
    for action in parser._actions:
        if action.dest in declared:
            action.type = declared[action.dest].parse
    return parser


def _yaml_value(action, value, annotations: dict):
    """A ``--config`` file's ``value`` for ``action``'s field, turned into its type as the command line turns text
    (``action.type``, its choices), or ``ValueError`` saying what was expected: null only where the field's default is
    None, a list only for a field of several values, a mapping only for a field that takes one."""
    annotation = str(annotations.get(action.dest, ""))
    if value is None:
        if action.default is None:
            return None
        raise ValueError("null: expected a value (the field has no 'unset')")
    if isinstance(value, dict):
        if "dict" in annotation:
            return value
        raise ValueError(f"a mapping: expected one value{_expected(action)}")
    if isinstance(value, list):
        if action.nargs not in ("+", "*") and "list" not in annotation:
            raise ValueError(f"a list {value}: expected one value{_expected(action)}")
        return [_yaml_scalar(action, item) for item in value]
    return _yaml_scalar(action, value)


def _expected(action) -> str:
    describe = getattr(getattr(action.type, "__self__", None), "describe", None)
    return f" ({describe()})" if describe else ""


def _yaml_scalar(action, value):
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if isinstance(value, (list, dict)):
        raise ValueError(f"{text}: expected one value{_expected(action)}")
    try:
        converted = action.type(text) if action.type is not None else text
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None
    except (TypeError, ValueError):
        raise ValueError(f"{text}: expected a {getattr(action.type, '__name__', 'value')}") from None
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"{text}: expected one of {', '.join(str(c) for c in action.choices)}")
    return converted


def parse(argv=None):
    """Build the run's configuration (``atr_llm.config.RunConfig``) from a command line: TRL-style ``--field value``
    options and ``--config FILE.yaml``, whose keys are the same fields (the command line overrides a key). Parsing
    only turns text into values; the configs' constructors check every value, domain and relation, and a refusal is
    one ValueError naming the option as it was given (``--flag``, or ``--config FILE: key ...``). An option given
    twice, a key written twice, a non-string key or an unknown one are refused here."""
    parser = build_parser()
    values, where = command_line_values(parser, negative_values_attached(sys.argv[1:] if argv is None else list(argv)))
    path = values.pop("config", None)
    where.pop("config", None)
    from_file, file_where, environment = file_values(parser, path) if path is not None else ({}, {}, None)
    return build_run({**from_file, **values}, {**file_where, **where}, path, environment)


def command_line_values(parser, argv: list[str]) -> tuple[dict, dict]:
    """The values ``argv`` gives, by field (what was given, nothing else), and where each came from: ``(option as
    typed, text as typed, None)``."""
    from .command_line import given_twice, options_given, reworded

    refuse_unknown_options(parser, argv)
    given = options_given(parser, argv)
    repeated = next((uses for uses in given.values() if len(uses) > 1), None)
    if repeated is not None:
        raise ValueError(given_twice(repeated))
    try:
        parsed = vars(parser.parse_args(argv))
    except ValueError as e:
        raise ValueError(reworded(str(e), argv)) from None
    values = {dest: value for dest, value in parsed.items() if dest in given}
    return values, {dest: (given[dest][0][1], given[dest][0][2], None) for dest in values}


def file_values(parser, path: str) -> tuple[dict, dict, dict | None]:
    """The values of the ``--config`` file ``path``, each typed as the command line types its text
    (``_yaml_value``), where each came from (``("--config", path, "key NAME: VALUE")``), and its ``env:`` mapping
    (TRL's convention: variables to set for the run; None without one)."""
    import typing

    from trl import ModelConfig

    from .config import ATRGRPOConfig, ScriptArguments
    from .relations import shown_value

    content = read_config_file(path)
    environment = content.pop("env", None)
    if environment is not None and (
        not isinstance(environment, dict) or not all(isinstance(k, str) for k in environment)
    ):
        raise refuse("--config", path, "key env: expected a mapping of variable: value")
    dests = {}
    for action in parser._actions:  # a flag's --no_<field> complement shares its dest: keep the field's own option
        dests.setdefault(action.dest, action)
    unknown = [k for k in content if k not in dests or k == "config"]
    if unknown:
        raise refuse("--config", path, f"unknown key(s) {', '.join(unknown)}: not an option of atr_llm.train")
    annotations = {}
    for cls in (ScriptArguments, ATRGRPOConfig, ModelConfig):
        annotations.update(typing.get_type_hints(cls))
    values, where = {}, {}
    for variable, raw in (environment or {}).items():  # a refused variable is named as the file's key
        where[f"${variable}"] = ("--config", path, f"key env: {variable}: {shown_value(raw)}")
    for key, raw in content.items():
        try:
            values[key] = _yaml_value(dests[key], raw, annotations)
        except ValueError as e:
            raise refuse("--config", path, f"key {key}: {e}") from None
        where[key] = ("--config", path, f"key {key}: {shown_value(raw)}")
    return values, where, environment


def build_run(values: dict, where: dict, path: str | None, environment: dict | None):
    """``RunConfig`` of the three configs built from ``values`` (every one counted as given, ``fields_given``; the
    file's ``environment`` set first, as TRL does, and restored when the build is refused); a ``ConfigError`` worded
    with where each value came from. The command line overrides the file: a file's key that an option typed on the
    command line makes unused (a relation ``Requires`` or ``Exclusive`` between them, e.g. the file's
    ``sft_batch_size`` with ``--sft_steps 0``) is left out with a warning naming it, instead of refused."""
    import warnings

    from trl import ModelConfig

    from .config import ATRGRPOConfig, ConfigError, RunConfig, ScriptArguments
    from .config.fields import fields_given
    from .relations import Exclusive, Requires, shown_value

    def option(name: str) -> str:  # how the user knows a field: the flag as typed, or the file's key
        flag, _, key = where.get(name, (name if name.startswith("$") else f"--{name}", None, None))
        return f"{key.split(':')[0]} (in {path})" if key is not None else flag

    def from_file(name: str) -> bool:
        return name in where and where[name][2] is not None and not name.startswith("$")

    saved_environment, notes = dict(os.environ), []
    os.environ.update({k: str(v) for k, v in (environment or {}).items()})
    while True:
        part = {
            cls: {k: v for k, v in values.items() if k in {f.name for f in dataclasses.fields(cls)}}
            for cls in (ScriptArguments, ATRGRPOConfig, ModelConfig)
        }
        try:
            with fields_given(values):
                script, training = ScriptArguments(**part[ScriptArguments]), ATRGRPOConfig(**part[ATRGRPOConfig])
                run = RunConfig(script, training, ModelConfig(**part[ModelConfig]))
            break
        except ConfigError as e:
            involved = [e.name, *(n for n in e.others if n != e.name)]
            unused = []
            typed = lambda name: name in where and not from_file(name)  # noqa: E731 - on the command line
            if isinstance(e.relation, Requires) and from_file(e.name) and typed(e.relation.needed):
                unused = [e.name]
            elif isinstance(e.relation, Exclusive) and any(typed(n) for n in involved):
                unused = [n for n in involved if from_file(n)]
            if not unused:
                os.environ.clear()
                os.environ.update(saved_environment)
                flag, shown, key = where.get(e.name, (option(e.name), None, None))
                if key is not None:  # a key of the --config file
                    raise refuse(flag, shown, f"{key}: {e.worded(option)}") from None
                raise refuse(flag, shown if shown is not None else shown_value(e.value), e.worded(option)) from None
            for name in unused:  # the command line overrides the file: its key is left out, and said so
                notes.append(f"--config {path}: key {name} is not used: {e.worded(option)}")
                values.pop(name), where.pop(name)
        except ValueError as e:
            os.environ.clear()
            os.environ.update(saved_environment)
            if "bf16" in str(e) and "use_cpu" in str(e):  # transformers' check, reworded for this package
                raise ValueError(
                    "this configuration asks for bf16 on a GPU, and no CUDA device is available here: run it on a "
                    "CUDA machine, or on CPU with --bf16 false --use_cpu true (slow at Qwen3 scale; the CPU demo is "
                    "--config atr_llm/configs/cpu-tiny.yaml)"
                ) from None
            raise
    for note in notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    return run


def requested_backend(argv=None) -> str:
    """``--backend`` from the command line, else from the ``--config`` file, else 'trl' (read before anything imports
    trl's trainer: Unsloth must be imported first to patch it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, a in enumerate(argv):
        if a == "--backend" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--backend="):
            return a.split("=", 1)[1]
    path = config_path(argv)
    return str((read_config_file(path) if path else {}).get("backend", "trl"))


def load_model_and_tokenizer(script_args, model_args, training_args):
    from .tiny import build_tokenizer_and_model

    attention = getattr(model_args, "attn_implementation", None)  # checked by check_model_options
    if script_args.tiny:
        tok, model = build_tokenizer_and_model(script_args.tiny_vocab, seed=training_args.seed)
        if attention is not None:
            model.set_attn_implementation(attention)
        dtype = getattr(model_args, "dtype", None)
        if dtype not in (None, "auto"):  # trl.ModelConfig's dtype, honoured for the tiny model too
            import torch

            model = model.to(getattr(torch, dtype))
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


def main(argv=None) -> dict:
    """``python -m atr_llm.train``: build and check the run's configuration (``parse``), then ``run`` it."""
    from .config.fields import ConfigError, check_environment
    from .huge_pages import enable_huge_pages_for_large_cpu_tensors

    try:  # before torch is imported: it reads THP_MEM_ALLOC_ENABLE then (and warns on a bad value)
        check_environment()
    except ConfigError as e:
        raise refuse(e.name, e.value, e.expected) from None
    enable_huge_pages_for_large_cpu_tensors()  # before any model is built: torch reads it once
    if requested_backend(argv) == "unsloth":  # before trl's GRPOTrainer / GRPOConfig are imported anywhere
        from .unsloth_backend import require_unsloth

        require_unsloth()
    from .trainer import ATRGRPOTrainer  # noqa: F401  (TRL's trainer imported after Unsloth's check, as Unsloth needs)

    with warnings.catch_warnings(record=True) as deferred:  # a refusal is one line: the libraries' warnings wait
        warnings.simplefilter("always")
        config = parse(argv)
    for w in deferred:  # the checks passed: show what the libraries said while the configs were built
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return run(config)


def run(config) -> dict:
    """Train as ``config`` (an ``atr_llm.config.RunConfig``, checked whole when it was built) says: SFT (unless
    resuming), GRPO, the final model and the summary, in its output folder, which one run at a time holds."""
    from .evaluation_generators import vllm_available
    from .run_lock import output_dir_lock

    note = choose_generation(config.script, config.training, vllm_usable=vllm_available())
    if note:
        warnings.warn(note, stacklevel=1)
    out = Path(config.training.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with output_dir_lock(out):  # one run per folder: a second one is refused here, before any model loads
        return _train(config.script, config.training, config.model, config.datasets, out)


def _train(script_args, training_args, model_args, loaded, out: Path) -> dict:
    """The run itself, from the data to the final model and the summary, inside the folder's lock."""
    from trl import get_peft_config

    from .data import load_source, to_grpo_dataset
    from .rewards import CorrectnessReward, GroupShuffledReward
    from .trainer import ATRGRPOTrainer

    train_ds = loaded.get("dataset_path") or load_source(  # a local file was read by the checks already
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

        sft_ds = loaded.get("sft_dataset_path") or load_source(
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
    if script_args.reward_control == "shuffled":  # the no-signal control: same rewards, permuted within each group
        reward = GroupShuffledReward(reward, training_args.num_generations, training_args.seed)
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
            write_method_record(partial, trainer.args.resolved_method, trainer.model)
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
    from .command_line import run_command

    run_command(main)  # a configuration error: one line naming what to fix, exit status 2, no traceback
