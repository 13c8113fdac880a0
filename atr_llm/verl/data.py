"""Our datasets in verl's parquet schema, and a verl reward function that grades with our math-verify grader.

    python -m atr_llm.verl.data --out data/verl                       # from the hub (needs network)
    python -m atr_llm.verl.data --out data/verl --local dapo-math-17k=dapo.parquet aime24=aime24.jsonl ...
    python -m atr_llm.verl.data --out data/verl-arith --train arithmetic --tests arithmetic   # offline

writes ``train.parquet`` (DAPO-Math-17k, deduplicated) and one ``<benchmark>.parquet`` per test set (AIME 2024,
AIME 2025, AMC 2023 by default; an offline task of ``atr_llm.data.OFFLINE_TASKS`` is generated, 1,024 training
and 200 held-out test rows), each row as verl's RL datasets expect (verl ``examples/data_preprocess``)::

    data_source   "atr_grpo/<source>"
    prompt        [{"role": "system", ...}, {"role": "user", "content": problem}]  (our prompt, answer in \\boxed{})
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": answer}
    extra_info    {"split", "index", "problem", "answer"}

The sources and their loaders are ``atr_llm.data``'s (one loader per dataset in this package). Reward:
``custom_reward_function.path=<this file> custom_reward_function.name=compute_score`` gives 1.0 for a correct
final answer and 0.0 otherwise (wrong, unparsable, timeout), graded by ``atr_llm.rewards.grade``, the
grader the TRL trainer and the evaluation use.
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

from .. import data, rewards

DATA_SOURCE_PREFIX = "atr_grpo/"
TRAIN_SOURCE = "dapo-math-17k"
TEST_SOURCES = ("aime24", "aime25", "amc23")


def verl_rows(rows: list[dict[str, str]], source: str, split: str) -> list[dict[str, Any]]:
    """``{problem, answer}`` rows -> verl's RL rows (see the module docstring)."""
    out = []
    for i, row in enumerate(rows):
        out.append(
            {
                "data_source": DATA_SOURCE_PREFIX + source,
                "prompt": data.format_prompt(row["problem"]),
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": row["answer"]},
                "extra_info": {"split": split, "index": i, "problem": row["problem"], "answer": row["answer"]},
            }
        )
    return out


def write_parquet(rows: list[dict[str, Any]], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


OFFLINE_ROWS = {"train": 1024, "test": 200}
"""Rows an offline task (``atr_llm.data.OFFLINE_TASKS``) is exported with, per split."""


def source_rows(source: str, split: str, path: str | None = None) -> list[dict[str, str]]:
    """``{problem, answer}`` rows of ``source``: a hub or local source (``atr_llm.data.SOURCES``), or an offline
    task (``atr_llm.data.OFFLINE_TASKS``) generated on its ``split`` side of ``atr_llm.data.is_held_out``, so that
    ``--train arithmetic --tests arithmetic`` gives disjoint training and test problems."""
    if source in data.OFFLINE_TASKS:
        kwargs = {**data.OFFLINE_TASKS[source], "split": split}
        ds = data.arithmetic_dataset(OFFLINE_ROWS[split], **kwargs)
    else:
        ds = data.load_source(source, path=path)
    return [{"problem": r["problem"], "answer": r["answer"]} for r in ds]


def export(out: Path, local: dict[str, str] | None = None, train: str = TRAIN_SOURCE, tests=TEST_SOURCES) -> list[Path]:
    """Write ``train.parquet`` and ``<test>.parquet`` under ``out``; ``local`` maps a source name to a local file."""
    local = local or {}
    unknown = set(local) - {train, *tests}
    if unknown:
        raise ValueError(f"--local names {sorted(unknown)}, which are not exported here ({train}, {', '.join(tests)})")
    written = []
    for source, split, name in [(train, "train", "train"), *((t, "test", t) for t in tests)]:
        rows = source_rows(source, split, local.get(source))
        written.append(write_parquet(verl_rows(rows, source, split), out / f"{name}.parquet"))
    return written


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs) -> float:
    """verl's custom reward function: 1.0 when ``solution_str``'s final answer equals ``ground_truth``
    (math-verify, ``atr_llm.rewards.grade``), else 0.0.

    verl 0.9.1's reward loop calls it from a thread pool, where math-verify's timeouts (``signal.alarm``) cannot
    run: there a completion that the plain ``\boxed{integer}`` check does not settle is graded in a worker process
    (``atr_llm.rewards.grade_many``, killed if it hangs), as on the main thread it is graded in place."""
    text, gold = rewards.completion_text(solution_str), str(ground_truth)
    if threading.current_thread() is threading.main_thread():
        status = rewards.grade(text, gold)
    else:
        status = rewards.grade_many([(text, gold)], workers=1)[0][0]
    return 1.0 if status == "correct" else 0.0


def _parse_local(items: list[str]) -> dict[str, str]:
    from ..command_line import refuse

    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise refuse("--local", item, "expected NAME=PATH")
        if not Path(path).is_file():
            raise refuse("--local", item, "no such file" if not Path(path).exists() else "not a file")
        out[name] = path
    return out


def check_arguments(args) -> dict[str, str]:
    """Every refusal before any file is read or written: the sources' names, the local files, the output folder."""
    from ..command_line import refuse

    known = [*data.OFFLINE_TASKS, *sorted(data.SOURCES)]
    for flag, names in (("--train", [args.train]), ("--tests", args.tests)):
        for name in names:
            if name not in known:
                raise refuse(flag, name, f"unknown source; known: {', '.join(known)}")
    local = _parse_local(args.local)
    offline = sorted(set(local) & set(data.OFFLINE_TASKS))
    if offline:
        raise refuse("--local", offline[0], "an offline task is generated here and reads no file")
    unknown = set(local) - {args.train, *args.tests}
    if unknown:
        raise refuse("--local", ",".join(sorted(unknown)), f"not exported here ({args.train}, {', '.join(args.tests)})")
    out = Path(args.out)
    for parent in (out, *out.parents):
        if parent.exists() and not parent.is_dir():
            raise refuse("--out", args.out, f"{parent} is a file, not a folder")
    return local


def main(argv: list[str] | None = None) -> None:
    from ..cli_types import NamedFile, WriteDir
    from ..command_line import Parser

    known = [*data.OFFLINE_TASKS, *sorted(data.SOURCES)]
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=WriteDir(), default="data/verl", help="output directory")
    ap.add_argument(
        "--local", type=NamedFile(), nargs="*", default=[], metavar="NAME=PATH", help="read a source from a local file"
    )
    ap.add_argument("--train", choices=known, default=TRAIN_SOURCE)
    ap.add_argument("--tests", choices=known, nargs="*", default=list(TEST_SOURCES))
    args = ap.parse_args(argv)

    local = check_arguments(args)
    for path in export(Path(args.out), local, args.train, tuple(args.tests)):
        print(f"wrote {path}")


if __name__ == "__main__":
    from ..command_line import run_command

    run_command(main)
