"""Where the spread of a paired Mean@8 difference comes from (docs/experiments/mask-mechanism-preregistration.md,
part 3): each step-400 model of the given runs evaluated again, on the table's own held-out problems and samplings
(``experiments.cpu_table.BENCHMARKS``), with other sampling seeds at 8 samples per problem and once at 32.

The evaluation noise of one Mean@8 is ``s_e^2``, the mean over models of the variance (n - 1) of Mean@8 across the
sampling seeds; a paired difference of two models carries ``2 s_e^2`` of it. The pre-registered rule compares that
with the variance of the range x form study's paired ``atr-min - clip`` difference at n = 10 (its ``sd`` in
``figures/experiments/range_form/analysis.json``): at a temperature where ``2 s_e^2`` is at least a quarter of it,
Mean@32 becomes part 3's outcome.

    python -m experiments.evaluation_noise --runs-dir runs/range_form --seeds 210 211 212 213 214

writes ``figures/experiments/range_form/evaluation_noise.{csv,json}``; the samples go to each model's folder
(``<run>-s<seed>/final/eval-noise/``), and an interrupted call resumes from them.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from experiments.cpu_table.protocol import BENCHMARKS, FULL, run_directory

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "figures" / "experiments" / "range_form"
ANALYSIS = OUT / "analysis.json"
CONTRAST = "range within min (atr-min - clip)"
SAMPLING_SEEDS = (1, 2, 3, 4)
LARGE_N = 32
SHARE = 0.25
"""The pre-registered threshold: evaluation noise of a paired difference as a share of its variance at n = 10."""


def evaluate_again(runs_dir: str, run: str, seed: int, sampling_seed: int, n: int) -> list[dict]:
    """Mean@n and Pass@n (%) of ``<run>-s<seed>/final`` at each of ``BENCHMARKS``, sampled with ``sampling_seed``."""
    from experiments.cpu_table.driver import evaluate_model

    run_dir = run_directory(runs_dir, run, seed)
    tokenizer = Path(runs_dir) / f"sft-s{seed}"
    if not (run_dir / "final" / "config.json").is_file():
        raise FileNotFoundError(f"{run_dir}/final holds no trained model: train {run} on seed {seed} first")
    rows = []
    for benchmark, sampling in BENCHMARKS.items():
        out = run_dir / "final" / "eval-noise" / f"seed{sampling_seed}-n{n}" / benchmark
        got = evaluate_model(
            run_dir / "final", tokenizer, FULL["test_problems"], n, out, sampling=sampling, sampling_seed=sampling_seed
        )
        rows.append({
            "run": run, "seed": seed, "benchmark": benchmark, "sampling_seed": sampling_seed, "n": n,
            "mean_at_n": got[f"mean@{n}"], "pass_at_n": got[f"pass@{n}"],
        })  # fmt: skip
    return rows


def _evaluate_job(job: tuple) -> list[dict]:
    return evaluate_again(*job)


def noise(rows: list[dict], paired_sd: dict[str, float]) -> dict:
    """Per temperature: ``s_e^2`` over the models that have every sampling seed at n = 8, ``2 s_e^2``, the paired
    difference's variance at n = 10 (``paired_sd`` squared), their ratio and the pre-registered outcome."""
    out = {}
    for t, benchmark in (("T0.3", "steps-test-T0.3"), ("T1", "steps-test-T1")):
        per_model: dict[tuple, list[float]] = {}
        for r in rows:
            if r["benchmark"] == benchmark and r["n"] == 8:
                per_model.setdefault((r["run"], r["seed"]), []).append(r["mean_at_n"])
        variances = [statistics.variance(v) for v in per_model.values() if len(v) == len(SAMPLING_SEEDS)]
        if not variances:
            out[t] = None
            continue
        s_e2 = statistics.fmean(variances)
        paired_var = paired_sd[t] ** 2
        share = 2 * s_e2 / paired_var
        out[t] = {
            "models": len(variances), "s_e2": s_e2, "evaluation_variance_of_a_paired_difference": 2 * s_e2,
            "paired_difference_variance_n10": paired_var, "share": share,
            "outcome": f"Mean@{LARGE_N}" if share >= SHARE else "Mean@8",
        }  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict:
    from atr_llm.cli_types import SEED, Integer, ReadDir, WriteDir
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs-dir", type=ReadDir(), required=True, help="the study's runs folder")
    ap.add_argument("--runs", nargs="+", choices=["clip", "atr-min", "clip-mask", "atr"], default=["clip", "atr-min"])
    ap.add_argument("--seeds", nargs="+", type=SEED, required=True, help="training seeds whose models to evaluate")
    ap.add_argument("--workers", type=Integer(1, 64), default=2, help="parallel evaluation processes")
    ap.add_argument("--out", type=WriteDir(), default=str(OUT), help="folder for evaluation_noise.{csv,json}")
    args = ap.parse_args(argv)
    from experiments.cpu_table.driver import worker_init

    for run in args.runs:  # every model exists before any evaluation starts
        for seed in args.seeds:
            final = run_directory(args.runs_dir, run, seed) / "final" / "config.json"
            if not final.is_file():
                from atr_llm.command_line import refuse

                raise refuse(
                    "--seeds",
                    seed,
                    f"{final.parents[1]} holds no trained model of {run} (no final/config.json): train it first",
                )
    jobs = [(args.runs_dir, run, seed, s, 8) for run in args.runs for seed in args.seeds for s in SAMPLING_SEEDS]
    jobs += [(args.runs_dir, run, seed, SAMPLING_SEEDS[0], LARGE_N) for run in args.runs for seed in args.seeds]
    from tqdm.auto import tqdm

    rows: list[dict] = []
    with ProcessPoolExecutor(args.workers, initializer=worker_init) as pool:
        for got in tqdm(pool.map(_evaluate_job, jobs), total=len(jobs), desc="evaluations"):
            rows += got
    paired_sd = {t: d["sd"] for t, d in json.loads(ANALYSIS.read_text())["family"]["tests"][CONTRAST].items()}
    result = {
        "preregistration": "docs/experiments/mask-mechanism-preregistration.md",
        "runs_dir": str(args.runs_dir),
        "sampling_seeds": list(SAMPLING_SEEDS),
        "large_n": LARGE_N,
        "share_threshold": SHARE,
        "noise": noise(rows, paired_sd),
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "evaluation_noise.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "evaluation_noise.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["noise"], indent=1))
    return result


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
