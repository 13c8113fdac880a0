"""What ``python -m atr_llm.evaluate`` checks before a model loads or a file is written: the combinations of its
arguments (``check_args``; each value's own domain is its declaration in ``atr_llm.evaluate.parse_args``), the
weights it will load (``check_model_folders``), and a rerun's settings against the samples it would reuse
(``SETTINGS_FILE``). A refusal names the argument."""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

PAPER_BENCHMARKS = {"amc23": "AMC2023", "aime24": "AIME2024", "aime25": "AIME2025"}
"""The paper's Table 2 benchmarks (83, 30 and 30 problems; ``amc23-40`` is another, 40-problem AMC set)."""


def checkpoints_every(run_dir: Path, every: int) -> list[tuple[int, Path]]:
    """Every ``every``-th complete checkpoint of ``run_dir`` and the last one (a checkpoint cut by a kill is skipped)."""
    from .checkpoints import complete_checkpoints

    found = complete_checkpoints(run_dir)
    chosen = found[::every]
    if found and found[-1] not in chosen:
        chosen.append(found[-1])
    return chosen


def check_chat_template(argument: str, folder: Path) -> None:
    """Refuse a local model folder whose tokenizer has no chat template (evaluation formats every prompt with it):
    neither ``chat_template.jinja`` nor a ``chat_template`` entry in ``tokenizer_config.json``."""
    from .command_line import refuse

    config = folder / "tokenizer_config.json"
    has = (folder / "chat_template.jinja").is_file()
    if not has and config.is_file():
        try:
            has = bool(json.loads(config.read_text()).get("chat_template"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise refuse(argument, str(folder), "its tokenizer_config.json is not JSON") from None
    if not has:
        raise refuse(
            argument,
            str(folder),
            "its tokenizer has no chat template (no chat_template.jinja, no chat_template in tokenizer_config.json); "
            "evaluation formats every prompt with it",
        )


def check_same_architecture(argument: str, checkpoint: Path, base_argument: str, base: Path) -> None:
    """Refuse a full-model checkpoint whose ``config.json`` differs from the base model's in ``ARCHITECTURE_KEYS``
    (a run of another model): its weights would not load into the base's tokenizer and shapes."""
    from .checkpoints import ARCHITECTURE_KEYS
    from .command_line import refuse

    if not (checkpoint / "config.json").is_file() or not (base / "config.json").is_file():
        return
    mine, theirs = (json.loads((p / "config.json").read_text()) for p in (checkpoint, base))
    differ = [k for k in ARCHITECTURE_KEYS if mine.get(k) != theirs.get(k)]
    if differ:
        shown = ", ".join(f"{k} {mine.get(k)!r} vs {theirs.get(k)!r}" for k in differ)
        raise refuse(argument, str(checkpoint), f"another architecture than {base_argument} {base}: {shown}")


SETTINGS_FILE = "generation_settings.json"
"""Written in ``--output_dir`` by the first run: the settings its samples were generated with (``generation_settings``),
against which a rerun, which reuses the samples written, is checked."""


def generation_settings(args) -> dict:
    """What decides the samples an evaluation writes: the weights (model, tiny model, adapter, checkpoints) and the
    sampling (temperature, top_p, max_tokens, thinking, seed), as given."""
    names = ("model", "tiny_model", "adapter", "checkpoints", "temperature", "top_p", "max_tokens", "thinking", "seed")
    values = {name: getattr(args, name, None) for name in names}
    return {name: str(v) if isinstance(v, os.PathLike) else v for name, v in values.items()}


def check_args(args, given=()) -> None:
    """The combinations of arguments (each value's own domain was checked by its declaration in ``parse_args``),
    checked before a model loads or a file is written; a refusal names the argument. ``given``: the arguments typed
    (their dests; a default is not typed)."""
    from .command_line import refuse
    from .config.fields import ConfigError, check_environment

    try:  # the variables a run reads, as train checks them (THP_MEM_ALLOC_ENABLE: torch reads it once)
        check_environment()
    except ConfigError as e:
        raise refuse(e.name, e.value, e.expected) from None
    recorded = Path(args.output_dir) / SETTINGS_FILE
    if recorded.is_file():  # its samples are reused: they must come from these settings
        try:
            before = json.loads(recorded.read_text())
        except (OSError, ValueError):
            raise refuse("--output_dir", args.output_dir, f"its {SETTINGS_FILE} does not parse") from None
        now = generation_settings(args)
        changed = [k for k in now if before.get(k) != now[k]]
        if changed:
            shown = ", ".join(f"{k} {before.get(k)!r} there, {now[k]!r} now" for k in changed)
            raise refuse(
                "--output_dir",
                args.output_dir,
                f"holds samples generated with other settings ({shown}); give another --output_dir, or the same "
                "settings to resume",
            )
    if args.model is None and args.tiny_model is None:
        raise refuse("--model", None, "give --model (hub id or folder) or --tiny-model FOLDER")
    # not a declared relation (ap.relate): the fuzzer's candidate temperatures (tests/fuzzing.py) hold no 0 to break it
    if args.temperature == 0 and "top_p" in given:
        raise refuse(
            "--top_p",
            args.top_p,
            "greedy decoding (--temperature 0) ignores top-p; leave --top_p out or give a temperature > 0",
        )
    if args.checkpoints is not None and not checkpoints_every(Path(args.checkpoints), 1):
        raise refuse("--checkpoints", args.checkpoints, "holds no complete checkpoint-* folder")
    names = [b for b in args.benchmarks.split(",") if b]
    if not names:
        raise refuse("--benchmarks", args.benchmarks, "expected a comma-separated list of benchmark names")
    twice = next((b for i, b in enumerate(names) if b in names[:i]), None)
    if twice is not None:  # its samples would be generated twice and its rows would count twice in the average
        raise refuse("--benchmarks", args.benchmarks, f"names {twice!r} twice; give each benchmark once")
    for spec in args.benchmark_path:
        name = spec.partition("=")[0]
        if name not in names:
            raise refuse("--benchmark_path", spec, f"benchmark {name!r} is not in --benchmarks {args.benchmarks}")
    given = {spec.partition("=")[0] for spec in args.benchmark_path}
    known = (*PAPER_BENCHMARKS, "amc23-40")
    for name in names:  # a name that is neither a published set nor given a file: a typo, most likely
        if name not in known and name not in given:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise refuse(
                "--benchmarks",
                name,
                f"unknown benchmark; {hint}known: {', '.join(known)}, or any name given a "
                f"file with --benchmark_path {name}=FILE (columns question, answer)",
            )
    base = args.tiny_model or args.model
    flag = "--tiny-model" if args.tiny_model else "--model"
    check_model_folders(args, flag, base)


def check_model_folders(args, flag: str, base: str) -> None:
    """The weights an evaluation loads, checked before any loads (``atr_llm.checkpoint_files.model_folder_problem``): the
    base model's folder (its tokenizer included) or hub id (``atr_llm.config.run.check_model_source``: a path that is
    no folder, or a hub id missing from the cache under ``HF_HUB_OFFLINE``), the adapter, and each checkpoint to
    evaluate (of the base model's architecture); a refusal names the argument."""
    from .checkpoint_files import model_folder_problem
    from .command_line import refuse
    from .config.fields import ConfigError
    from .config.run import check_model_source

    if not Path(base).is_dir():
        try:
            check_model_source(base)
        except ConfigError as e:
            raise refuse(flag, base, e.expected) from None
        return
    problem = model_folder_problem(Path(base), tokenizer=True)
    if problem:
        raise refuse(flag, base, f"cannot be loaded: {problem}")
    check_chat_template(flag, Path(base))
    if args.adapter is not None and (problem := model_folder_problem(Path(args.adapter))):
        raise refuse("--adapter", args.adapter, f"cannot be loaded: {problem}")
    if args.checkpoints is not None:
        for _, checkpoint in checkpoints_every(Path(args.checkpoints), args.every):
            problem = model_folder_problem(checkpoint)
            if problem:
                raise refuse("--checkpoints", args.checkpoints, f"{checkpoint.name} cannot be loaded: {problem}")
            check_same_architecture("--checkpoints", checkpoint, flag, Path(base))
