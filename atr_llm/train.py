"""``python -m atr_llm.train``: formatting SFT, then GRPO with any clipping method of atr_theory.

TRL conventions: dataclass arguments (``ScriptArguments``, ``ATRGRPOConfig``,
``trl.ModelConfig``), ``--config FILE.yaml`` for presets (``atr_llm/configs/``), any field overridable
on the command line. Several GPUs: ``accelerate launch -m atr_llm.train --config ...``.

    python -m atr_llm.train --config atr_llm/configs/cpu-tiny.yaml             # offline CPU demo
    python -m atr_llm.train --config atr_llm/configs/cpu-tiny.yaml --max_steps 4 --output_dir runs/x
    python -m atr_llm.train --config atr_llm/configs/qwen3-1.7b-atr.yaml       # the paper's run (GPU)
    python -m atr_llm.train --config ... --resume_from_checkpoint runs/x/checkpoint-20

Bad configurations (unknown method, delta <= 0, a missing dataset file, Unsloth without CUDA) fail
before any model is loaded. This module only turns the command line (and ``atr_llm.config_file``, its YAML file)
into a checked ``RunConfig``; the run itself is ``atr_llm.training_run.run``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings

from .command_line import negative_values_attached, refuse, refuse_unknown_options
from .config_file import config_path, file_values, read_config_file
from .training_run import run

USAGE = """\
python -m atr_llm.train needs a config or arguments. To start:

  python -m atr_llm.train --config atr_llm/configs/cpu-tiny.yaml      # offline CPU demo (a few minutes)
  python -m atr_llm.train --config atr_llm/configs/qwen3-1.7b-atr.yaml  # the paper's ATR run (CUDA GPU)
  python -m atr_llm.train --help                                      # every option (TRL's and ours)

Presets for every method of the paper's Tables 2-3: atr_llm/configs/qwen3-{1.7b,8b}-<run>.yaml."""


# ---------------------------------------------------------------------------------------------------------------
# the command line and its --config file: text -> values (the configs check them, atr_llm.config)
# ---------------------------------------------------------------------------------------------------------------
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


def parse(argv=None, file_content: dict | None = None):
    """Build the run's configuration (``atr_llm.config.RunConfig``) from a command line: TRL-style ``--field value``
    options and ``--config FILE.yaml``, whose keys are the same fields (the command line overrides a key). Parsing
    only turns text into values; the configs' constructors check every value, domain and relation, and a refusal is
    one ValueError naming the option as it was given (``--flag``, or ``--config FILE: key ...``). An option given
    twice, a key written twice, a non-string key or an unknown one are refused here."""
    parser = build_parser()
    values, where = command_line_values(parser, negative_values_attached(sys.argv[1:] if argv is None else list(argv)))
    path = values.pop("config", None)
    where.pop("config", None)
    from_file, file_where, environment = file_values(parser, path, file_content) if path is not None else ({}, {}, None)
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


def build_run(values: dict, where: dict, path: str | None, environment: dict | None):
    """``RunConfig`` of the three configs built once from ``values`` (every one counted as given, ``fields_given``;
    the file's ``environment`` set first, as TRL does, and restored when the build is refused); a ``ConfigError``
    worded with where each value came from. The command line overrides the file: a file's key that an option typed on
    the command line makes unused (``unused_file_keys``, e.g. the file's ``sft_batch_size`` with ``--sft_steps 0``)
    is left out with a warning naming it before the build, instead of refused."""
    from trl import ModelConfig

    from .config import ATRGRPOConfig, ConfigError, RunConfig, ScriptArguments
    from .config.fields import fields_given
    from .relations import shown_value

    def option(name: str) -> str:  # how the user knows a field: the flag as typed, or the file's key
        flag, _, key = where.get(name, (name if name.startswith("$") else f"--{name}", None, None))
        return f"{key.split(':')[0]} (in {path})" if key is not None else flag

    for name, why in unused_file_keys(values, where).items():  # the command line overrides the file, and says so
        warnings.warn(f"--config {path}: key {name} is not used: {why(option)}", UserWarning, stacklevel=2)
        values.pop(name), where.pop(name)
    saved_environment = dict(os.environ)
    os.environ.update({k: str(v) for k, v in (environment or {}).items()})
    part = {
        cls: {k: v for k, v in values.items() if k in {f.name for f in dataclasses.fields(cls)}}
        for cls in (ScriptArguments, ATRGRPOConfig, ModelConfig)
    }
    try:
        with fields_given(values):
            script, training = ScriptArguments(**part[ScriptArguments]), ATRGRPOConfig(**part[ATRGRPOConfig])
            return RunConfig(script, training, ModelConfig(**part[ModelConfig]))
    except ConfigError as e:
        os.environ.clear()
        os.environ.update(saved_environment)
        flag, shown, key = where.get(e.name, (option(e.name), None, None))
        if key is not None:  # a key of the --config file
            raise refuse(flag, shown, f"{key}: {e.worded(option)}") from None
        raise refuse(flag, shown if shown is not None else shown_value(e.value), e.worded(option)) from None
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


def unused_file_keys(values: dict, where: dict) -> dict:
    """``{file key: why(option)}`` for the ``--config`` file's keys that an option typed on the command line makes
    unused: a relation ``Requires`` whose field comes from the file and whose needed field was typed and does not hold
    (``--sft_steps 0`` leaves the file's ``sft_batch_size`` unused), or an ``Exclusive`` of which a typed field is set
    (the file's others are left out). Read from the declared relations (``atr_llm.config.fields``) on the values as
    given, each unset field at its default; ``why(option)`` words the reason with each field named by ``option``."""
    from trl import ModelConfig

    from .config import ATRGRPOConfig, ConfigError, ScriptArguments
    from .config.fields import GENERATION_RELATIONS, RUN_RELATIONS, field_default, training_relations
    from .relations import Exclusive, Requires

    owner = {}
    for cls in (ScriptArguments, ATRGRPOConfig, ModelConfig):
        for f in dataclasses.fields(cls):
            owner.setdefault(f.name, cls)

    def from_file(name: str) -> bool:
        return name in where and where[name][2] is not None and not name.startswith("$")

    def typed(name: str) -> bool:  # on the command line
        return name in where and not from_file(name)

    def value(name: str):
        return values[name] if name in values else field_default(owner[name], name)

    def wording(template: str, names: tuple[str, ...]):  # ConfigError.worded: each other field as the user knows it
        return ConfigError("", None, template, others=names).worded

    unused: dict = {}
    for relation in (*GENERATION_RELATIONS, *training_relations(), *RUN_RELATIONS):
        if any(name not in owner for name in relation.names):  # a field this TRL release does not have
            continue
        broken = relation.violation(lambda name: name in values, value)
        if broken is None:
            continue
        if isinstance(relation, Requires) and from_file(relation.name) and typed(relation.needed):
            unused[relation.name] = wording(broken[1], relation.names)
        elif isinstance(relation, Exclusive) and any(typed(n) for n in relation.names if n in values):
            unused.update({n: wording(broken[1], relation.names) for n in relation.names if from_file(n)})
    return unused


def requested_backend(argv=None, file_content: dict | None = None) -> str:
    """``--backend`` from the command line, else from the ``--config`` file (``file_content``, as
    ``read_config_file`` read it), else 'trl' (read before anything imports trl's trainer: Unsloth must be imported
    first to patch it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, a in enumerate(argv):
        if a == "--backend" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--backend="):
            return a.split("=", 1)[1]
    if file_content is None:
        path = config_path(argv)
        file_content = read_config_file(path) if path else {}
    return str(file_content.get("backend", "trl"))


def main(argv=None) -> dict:
    """``python -m atr_llm.train``: build and check the run's configuration (``parse``), then ``run`` it."""
    from .config.fields import ConfigError, check_environment
    from .huge_pages import enable_huge_pages_for_large_cpu_tensors

    try:  # before torch is imported: it reads THP_MEM_ALLOC_ENABLE then (and warns on a bad value)
        check_environment()
    except ConfigError as e:
        raise refuse(e.name, e.value, e.expected) from None
    enable_huge_pages_for_large_cpu_tensors()  # before any model is built: torch reads it once
    path = config_path(list(sys.argv[1:] if argv is None else argv))
    file_content = read_config_file(path) if path else {}  # the --config file, read once
    if requested_backend(argv, file_content) == "unsloth":  # before trl's GRPOTrainer / GRPOConfig are imported anywhere
        from .unsloth_backend import require_unsloth

        require_unsloth()
    from .trainer import ATRGRPOTrainer  # noqa: F401  (TRL's trainer imported after Unsloth's check, as Unsloth needs)

    with warnings.catch_warnings(record=True) as deferred:  # a refusal is one line: the libraries' warnings wait
        warnings.simplefilter("always")
        config = parse(argv, file_content if path else None)
    for w in deferred:  # the checks passed: show what the libraries said while the configs were built
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return run(config)


if __name__ == "__main__":
    if len(sys.argv) == 1:
        print(USAGE)
        sys.exit(0)
    from .command_line import run_command

    run_command(main)  # a configuration error: one line naming what to fix, exit status 2, no traceback
