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


if __name__ == "__main__":
    if len(sys.argv) == 1:
        print(USAGE)
        sys.exit(0)
    from .command_line import run_command

    run_command(main)  # a configuration error: one line naming what to fix, exit status 2, no traceback
