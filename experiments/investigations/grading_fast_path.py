"""The reward's integer fast path (``atr_llm.rewards.boxed_integer_grade``) against math-verify's stored verdicts.

Every evaluation of the CPU table wrote each sample's completion with math-verify's status and extracted answer
(``samples.jsonl`` under the runs directory). This script re-grades every distinct (completion, gold) pair there
that the fast path settles and counts the pairs where its ``(status, extracted)`` differs from the stored one
(must be 0), reports how many samples the fast path covers, and times both graders side by side on a subset of
the distinct pairs (math-verify live, without its cache).

    python -m experiments.investigations.grading_fast_path [--runs-dir runs/cpu_table_forms] [--out figures/experiments/investigations/grading_fast_path.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tqdm.auto import tqdm

from atr_llm.rewards import boxed_integer_grade, math_verify_grade
from experiments.cpu_table import evaluation_problems


def test_golds(problems: int = 200) -> list[str]:
    """The gold answers of the CPU table's test split by problem id (``cpu_table.evaluation_problems``)."""
    return [str(row["answer"]) for row in evaluation_problems(problems)]


def stored_pairs(runs_dir: Path, golds: list[str]) -> tuple[dict, int]:
    """``{(completion, gold): {(status, extracted), ...}}`` over every stored sample, and the number of samples."""
    pairs: dict = {}
    n = 0
    for path in tqdm(sorted(runs_dir.rglob("samples.jsonl")), desc="sample files"):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            n += 1
            key = (row["completion"], golds[row["problem_id"]])
            pairs.setdefault(key, {"verdicts": set(), "samples": 0})
            pairs[key]["verdicts"].add((row["status"], row["extracted_answer"]))
            pairs[key]["samples"] += 1
    return pairs, n


def main(argv: list[str] | None = None) -> None:
    from atr_llm.cli_types import Integer, ReadDir, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs-dir", type=ReadDir(), default="runs/cpu_table_forms")
    ap.add_argument("--out", type=WriteFile(), default="figures/experiments/investigations/grading_fast_path.json")
    ap.add_argument(
        "--timed-pairs", type=Integer(1), default=2000, help="distinct fast-path pairs timed with both graders"
    )
    args = ap.parse_args(argv)
    golds = test_golds()
    pairs, n_samples = stored_pairs(Path(args.runs_dir), golds)
    fast_pairs, mismatches, fast_samples = [], [], 0
    for (completion, gold), seen in tqdm(pairs.items(), desc="pairs"):
        fast = boxed_integer_grade(completion, gold)
        if fast is None:
            continue
        fast_pairs.append((completion, gold))
        fast_samples += seen["samples"]
        if seen["verdicts"] != {fast}:
            mismatches.append(
                {"completion": completion, "gold": gold, "fast": fast, "stored": sorted(seen["verdicts"])}
            )
    timed = fast_pairs[:: max(1, len(fast_pairs) // args.timed_pairs)][: args.timed_pairs]
    seconds = {}
    for name, grader in (("fast_path", boxed_integer_grade), ("math_verify", math_verify_grade)):
        t0 = time.perf_counter()
        live = [grader(c, g) for c, g in timed]
        seconds[name] = (time.perf_counter() - t0) / len(timed)
        if name == "math_verify":
            live_mismatch = sum(a != b for a, b in zip(live, (boxed_integer_grade(c, g) for c, g in timed)))
    result = {
        "runs_dir": args.runs_dir,
        "samples": n_samples,
        "distinct_pairs": len(pairs),
        "fast_path_pairs": len(fast_pairs),
        "fast_path_samples": fast_samples,
        "fast_path_sample_fraction": fast_samples / max(n_samples, 1),
        "mismatches_against_stored": len(mismatches),
        "mismatch_examples": mismatches[:20],
        "timed_pairs": len(timed),
        "timed_mismatches_against_live_math_verify": live_mismatch,
        "seconds_per_pair": seconds,
        "speedup": seconds["math_verify"] / seconds["fast_path"],
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "mismatch_examples"}, indent=1))


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
