"""Datasets in one schema ``{problem, answer}`` and one prompt format (answer in ``\\boxed{}``).

Every source loads from its hub id or from a local jsonl / json / parquet file with the same
columns (``path``); a malformed row raises ValueError naming the file, the row and the column.

============================  ===========================================  ==========================
name                          hub id (config)                              columns -> problem, answer
============================  ===========================================  ==========================
dapo-math-17k                 BytedTsinghua-SIA/DAPO-Math-17k              prompt[0].content (task text
                                                                           stripped), reward_model.ground_truth;
                                                                           rows are duplicated ~100x: deduplicated
dapo-math-17k-processed       open-r1/DAPO-Math-17k-Processed (en)         prompt, solution
aime24                        HuggingFaceH4/aime_2024                      problem, answer
aime25                        opencompass/AIME2025 (AIME2025-I + -II)      question, answer
amc23                         AI-MO/aimo-validation-amc (83 problems:      problem, answer (a number)
                              AMC 12 2022-2023, the paper's AMC2023)
amc23-40                      math-ai/amc23 (40 problems, another set)     question, answer
openmathreasoning             nvidia/OpenMathReasoning (split cot)         problem, expected_answer (+ solution)
openmathreasoning-mini        unsloth/OpenMathReasoning-mini               problem, expected_answer (+ solution)
arithmetic                    generated offline (``arithmetic_dataset``)  problem, answer
arithmetic-3step              generated offline: ``a +- b +- c``, digits   problem, answer
                              0-9, training split (``OFFLINE_TASKS``)
arithmetic-3step-steps        the same problems with a step-by-step        problem, answer, solution
                              solution (one line per operation)
============================  ===========================================  ==========================
"""

from __future__ import annotations

import random
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = "Solve the problem. Put the final answer in \\boxed{}."


def format_prompt(problem: str) -> list[dict[str, str]]:
    """The conversational prompt every trainer and evaluator uses."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem}]


def format_completion(answer: str, solution: str | None = None) -> str:
    """A target completion for SFT: an optional solution, then ``\\boxed{answer}``."""
    boxed = f"\\boxed{{{answer}}}"
    return f"{solution.strip()}\n{boxed}" if solution else boxed


# ---------------------------------------------------------------------------------------------
# the offline task
# ---------------------------------------------------------------------------------------------
def arithmetic_problem(
    rng: random.Random, max_operand: int = 9, ops: str = "+", terms: int = 2, steps: bool = False
) -> dict[str, str]:
    """``"What is a + b?"`` (``terms`` operands in 0..``max_operand``, operators from ``ops`` in ``+-*``) with its
    exact answer under the usual precedence (``*`` before ``+``/``-``, then left to right).

    ``steps=True`` (``ops`` from ``+-`` only) adds a ``solution``: one line per operation, left to right,
    ``"6 + 3 = 9\n9 - 2 = 7"``, which the SFT target puts before ``\boxed{7}``."""
    if terms < 2 or max_operand < 0 or not ops or set(ops) - set("+-*"):
        raise ValueError(f"need terms >= 2, max_operand >= 0 and ops from '+-*', got {terms}, {max_operand}, {ops!r}")
    if steps and "*" in ops:
        raise ValueError(f"steps=True writes left-to-right steps, so ops must come from '+-', got {ops!r}")
    operands = [rng.randint(0, max_operand) for _ in range(terms)]
    operators = [rng.choice(ops) for _ in range(terms - 1)]
    products, signs = [operands[0]], [1]  # products folded in first, then a sum of signed products
    for op, x in zip(operators, operands[1:]):
        if op == "*":
            products[-1] *= x
        else:
            products.append(x)
            signs.append(1 if op == "+" else -1)
    value = sum(s * v for s, v in zip(signs, products))
    text = " ".join([str(operands[0])] + [f"{op} {x}" for op, x in zip(operators, operands[1:])])
    row = {"problem": f"What is {text}?", "answer": str(value)}
    if steps:
        lines, acc = [], operands[0]
        for op, x in zip(operators, operands[1:]):
            new = acc + x if op == "+" else acc - x
            lines.append(f"{acc} {op} {x} = {new}")
            acc = new
        row["solution"] = "\n".join(lines)
    return row


def is_held_out(problem: str) -> bool:
    """The offline tasks' test split: a fixed fifth of all problems, chosen by a hash of the problem text
    (CRC-32 mod 5 == 0), so that no training row of any seed is ever a test problem."""
    import zlib

    return zlib.crc32(problem.encode()) % 5 == 0


def arithmetic_dataset(
    n: int = 512,
    seed: int = 0,
    max_operand: int = 9,
    ops: str = "+",
    terms: int = 2,
    split: str = "all",
    steps: bool = False,
):
    """A ``datasets.Dataset`` of ``n`` generated arithmetic problems with verifiable answers; ``split``:
    ``"all"``, or ``"train"`` / ``"test"`` (rows drawn until ``n`` fall on that side of ``is_held_out``);
    ``steps``: with a step-by-step ``solution`` column (``arithmetic_problem``)."""
    from datasets import Dataset

    if split not in ("all", "train", "test"):
        raise ValueError(f"split must be 'all', 'train' or 'test', got {split!r}")
    rng = random.Random(seed)
    rows = []
    while len(rows) < n:
        row = arithmetic_problem(rng, max_operand, ops, terms, steps)
        if split == "all" or is_held_out(row["problem"]) == (split == "test"):
            rows.append(row)
    return Dataset.from_list(rows)


OFFLINE_TASKS: dict[str, dict] = {
    "arithmetic": {},
    "arithmetic-3step": {"terms": 3, "ops": "+-", "max_operand": 9, "split": "train"},
    "arithmetic-3step-steps": {"terms": 3, "ops": "+-", "max_operand": 9, "split": "train", "steps": True},
}
"""Offline task name -> ``arithmetic_dataset`` arguments (``arithmetic-3step``: the CPU analog of Tables 2-3;
its test split is ``arithmetic_dataset(..., split="test")`` with the same arguments)."""


# ---------------------------------------------------------------------------------------------
# hub / local sources
# ---------------------------------------------------------------------------------------------
def _get(row: dict, dotted: str) -> Any:
    cur: Any = row
    for part in dotted.split("."):
        if part.isdigit():
            cur = cur[int(part)]
        else:
            cur = cur[part]
    return cur


_DAPO_HEAD = re.compile(r"^.*?Answer: \$Answer.*?\n\n", re.S)
_DAPO_TAIL = re.compile(r"\n\nRemember to put your answer.*$", re.S)


def _strip_dapo_instructions(text: str) -> str:
    """DAPO-Math-17k wraps each problem in task instructions; keep the problem."""
    return _DAPO_TAIL.sub("", _DAPO_HEAD.sub("", text)).strip()


@dataclass(frozen=True)
class Source:
    hub_id: str | None
    problem: str
    answer: str
    solution: str | None = None
    configs: tuple[str | None, ...] = (None,)
    split: str = "train"
    clean_problem: Callable[[str], str] | None = None
    deduplicate: bool = False
    n_problems: int | None = None  # a benchmark's known size: loading another count warns


SOURCES: dict[str, Source] = {
    "dapo-math-17k": Source(
        "BytedTsinghua-SIA/DAPO-Math-17k",
        "prompt.0.content",
        "reward_model.ground_truth",
        clean_problem=_strip_dapo_instructions,
        deduplicate=True,
    ),
    "dapo-math-17k-processed": Source("open-r1/DAPO-Math-17k-Processed", "prompt", "solution", configs=("en",)),
    "aime24": Source("HuggingFaceH4/aime_2024", "problem", "answer", n_problems=30),
    "aime25": Source(
        "opencompass/AIME2025", "question", "answer", configs=("AIME2025-I", "AIME2025-II"), split="test", n_problems=30
    ),
    # The paper's AMC percentages are multiples of 1/83 (48.19 = 40/83, 80.72 = 67/83): the 83-problem set
    "amc23": Source("AI-MO/aimo-validation-amc", "problem", "answer", n_problems=83),
    "amc23-40": Source("math-ai/amc23", "question", "answer", split="test", n_problems=40),
    "openmathreasoning": Source(
        "nvidia/OpenMathReasoning", "problem", "expected_answer", solution="generated_solution", split="cot"
    ),
    "openmathreasoning-mini": Source(
        "unsloth/OpenMathReasoning-mini", "problem", "expected_answer", solution="generated_solution", split="cot"
    ),
}


def _read_local(path: Path, argument: str = "dataset file") -> tuple[list, list[int] | None]:
    """The rows of a local file and, for JSON Lines, each row's line number (a bad row is then named by its line).
    A file that cannot be read as its suffix says is refused naming ``argument``, the file and why."""
    from atr_llm.command_line import existing_file, jsonl_rows, one_line, refuse

    existing_file(argument, path)
    suffix = path.suffix.lower()
    kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(suffix)
    if kind is None:
        raise refuse(argument, str(path), f"expected a .jsonl, .json or .parquet file, got {suffix or 'no suffix'!r}")
    if suffix == ".jsonl":
        numbered = jsonl_rows(argument, path)
        return [row for _, row in numbered], [line for line, _ in numbered]
    from datasets import load_dataset

    try:
        return load_dataset(kind, data_files=str(path), split="train"), None
    except Exception as e:  # datasets wraps the parser's error in a generic one: name the file instead
        cause = e.__cause__ or e
        raise refuse(argument, str(path), f"cannot be read as {suffix[1:]} ({one_line(cause)[:200]})") from None


def map_rows(rows, source: Source, origin: str, lines: list[int] | None = None) -> list[dict[str, str]]:
    """Map raw rows to ``{problem, answer[, solution]}``; a bad row raises naming origin, its line (``lines``: the
    line number of each row, for a JSON Lines file) or row index, and the column expected."""
    out, seen = [], set()
    for i, row in enumerate(rows):
        where = f"line {lines[i]}" if lines is not None else f"row {i}"
        rec = {}
        for key, col in (("problem", source.problem), ("answer", source.answer), ("solution", source.solution)):
            if col is None:
                continue
            try:
                value = _get(row, col)
            except (KeyError, IndexError, TypeError):
                raise ValueError(
                    f"{origin}: {where} has no column {col!r} (needed for {key}); columns: {sorted(row)}"
                ) from None
            if isinstance(value, float) and value.is_integer():
                value = str(int(value))  # AMC answers are stored as floats: 142.0 -> "142"
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{origin}: {where}, column {col!r} must be a non-empty string, got {value!r}")
            rec[key] = value.strip()
        if source.clean_problem:
            rec["problem"] = source.clean_problem(rec["problem"])
        if source.deduplicate:
            key = (rec["problem"], rec["answer"])
            if key in seen:
                continue
            seen.add(key)
        out.append(rec)
    return out


def load_source(
    name: str,
    path: str | Path | None = None,
    limit: int | None = None,
    seed: int = 0,
    argument: str = "dataset file",
    published: bool = True,
):
    """Load a named source (see the module table) from ``path`` if given, else from its hub id.

    A name in ``OFFLINE_TASKS`` generates that offline task (``limit`` rows, default 512).
    Returns a ``datasets.Dataset`` with columns problem, answer (and solution where the source has one). ``argument``
    names ``path`` in a refusal (the command-line flag it came from); a path given for an offline task is refused.
    ``published=False``: ``path`` is the user's own file read in ``name``'s format, not a copy of the published set,
    so its row count is not compared with the published one.
    """
    from datasets import Dataset, load_dataset

    if name in OFFLINE_TASKS:
        if path is not None:
            from atr_llm.command_line import refuse

            raise refuse(argument, str(path), f"dataset {name!r} is generated offline and reads no file")
        return arithmetic_dataset(limit or 512, seed=seed, **OFFLINE_TASKS[name])
    if name not in SOURCES:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join([*OFFLINE_TASKS, *SOURCES])}")
    src = SOURCES[name]
    if path is not None:
        p = Path(path)
        raw, lines = _read_local(p, argument)
        origin = f"{argument} {p}"
        try:
            rows = map_rows(raw, src, origin, lines)
        except ValueError as e:  # a bad row, refused as the argument it came from (the flag as typed)
            from atr_llm.command_line import refuse

            raise refuse(argument, str(p), str(e).removeprefix(f"{origin}: ")) from None
    else:
        rows = []
        for cfg in src.configs:
            raw = load_dataset(src.hub_id, cfg, split=src.split)
            rows += map_rows(raw, src, f"{src.hub_id}[{cfg or 'default'}]")
    if limit:
        rows = rows[:limit]
    elif published and src.n_problems is not None and len(rows) != src.n_problems:
        warnings.warn(f"{name} has {src.n_problems} problems, this file/hub copy has {len(rows)}", stacklevel=2)
    return Dataset.from_list(rows)


def to_grpo_dataset(ds):
    """Add the conversational ``prompt`` column TRL's GRPOTrainer expects (``answer`` goes to the reward)."""
    return ds.map(lambda r: {"prompt": format_prompt(r["problem"])})


def to_sft_dataset(ds):
    """Conversational prompt-completion pairs for TRL's SFTTrainer (loss on the completion only)."""

    def fmt(r):
        completion = format_completion(r["answer"], r.get("solution"))
        return {"prompt": format_prompt(r["problem"]), "completion": [{"role": "assistant", "content": completion}]}

    return ds.map(fmt, remove_columns=list(ds.column_names))
