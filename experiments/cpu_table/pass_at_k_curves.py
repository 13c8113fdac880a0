"""Pass@K against K for cpu-table runs (the paper's Fig. 5, "Mean@K and Pass@K with varying K", at CPU scale).

    python -m experiments.cpu_table.pass_at_k_curves --runs-dir runs/cpu_table_forms --runs sft clip atr \
        --seeds 10 11 12 13 14 15 16 17 --out figures/cpu_pass_at_k

Reads the samples each evaluation of ``experiments.cpu_table`` left in its runs directory (``samples.jsonl``: 8
completions per held-out problem; the SFT model's own, and each GRPO run's at ``--step``, default the final one) and
computes, per run, seed and benchmark, Pass@K and Mean@K for each K with the unbiased estimators of
``atr_llm.evaluate.summarise_samples`` (Chen et al. 2021). Nothing is generated again: every Pass@k the run recorded in its
``result.json`` must equal the samples', else the samples are not the ones that were
evaluated and the run is refused. Mean@K's expectation does not depend on K (it is the accuracy of one sample), so
only Pass@K varies; it is written for every K as the paper's figure has it.

Writes ``cpu_pass_at_k.csv`` (run, seed, sft_model, benchmark, k, mean_at_k, pass_at_k), ``cpu_pass_at_k.json`` (the
same, and per reference of ``--references``, benchmark and K each run's paired difference against it over shared seeds,
``experiments.cpu_table.paired_difference``) and ``cpu_pass_at_k.png`` (Pass@K against K, mean over seeds).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from atr_llm.evaluate import summarise_samples
from experiments import cpu_table
from sims._common import png_text_metadata


def evaluation_directory(runs_dir: Path | str, run: str, seed: int, step: int) -> Path:
    """Where ``experiments.cpu_table`` left the samples of (``run``, ``seed``): the SFT model's ``eval/``, a GRPO
    run's ``checkpoint-<step>/eval/``; one sub-directory per benchmark."""
    directory = cpu_table.run_directory(runs_dir, run, seed)
    return directory / "eval" if run == "sft" else directory / f"checkpoint-{step}" / "eval"


def read_samples(path: Path) -> list[dict]:
    """The rows of one ``samples.jsonl``; a missing file raises, naming it."""
    if not path.exists():
        raise FileNotFoundError(f"no evaluation samples at {path}")
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def curve_of_run(runs_dir: Path | str, run: str, seed: int, step: int, ks: list[int]) -> list[dict]:
    """One row per benchmark and K: ``{run, seed, sft_model, benchmark, k, mean_at_k, pass_at_k}`` (%), from the
    run's samples; raises when a Pass@k its ``result.json`` recorded for that step (Pass@1 and Pass@8 for the cpu
    table) differs from the samples' (or the result has no evaluation at that step)."""
    directory = cpu_table.run_directory(runs_dir, run, seed)
    if not (directory / "result.json").exists():
        raise FileNotFoundError(f"{run} seed {seed}: no finished run in {directory} (no result.json)")
    result = json.loads((directory / "result.json").read_text())
    recorded_at = "0" if run == "sft" else str(step)
    if recorded_at not in result.get("evals", {}):
        raise ValueError(f"{run} seed {seed}: no evaluation at step {recorded_at} in {directory / 'result.json'}")
    rows = []
    for benchmark in cpu_table.BENCHMARKS:
        samples = read_samples(evaluation_directory(runs_dir, run, seed, step) / benchmark / "samples.jsonl")
        recorded = {
            int(key[5:]): value
            for key, value in result["evals"][recorded_at][benchmark].items()
            if key.startswith("pass@")
        }
        if not recorded:
            raise ValueError(
                f"{run} seed {seed} {benchmark}: its result.json records no Pass@k to check the samples by"
            )
        summary = summarise_samples(samples, sorted(set(ks) | set(recorded)))["test"]
        for k, value in recorded.items():
            if abs(summary[f"pass@{k}"] - value) > 1e-9:
                raise ValueError(
                    f"{run} seed {seed} {benchmark}: Pass@{k} from the samples is {summary[f'pass@{k}']}, the run"
                    f" recorded {value}: these are not the samples that were evaluated"
                )
        for k in ks:
            rows.append(
                {
                    "run": run,
                    "seed": seed,
                    "sft_model": result.get("sft_model"),
                    "benchmark": benchmark,
                    "k": k,
                    "mean_at_k": summary[f"mean@{k}"],
                    "pass_at_k": summary[f"pass@{k}"],
                }
            )
    return rows


def paired_by_k(rows: list[dict], runs: list[str], reference: str) -> dict[str, dict[str, dict]]:
    """``{benchmark: {k: {run: paired difference of pass_at_k against reference}}}`` over shared starts. Against
    ``"sft"`` with two GRPO runs or more, also ``"mean of runs"``: the GRPO runs' mean minus their SFT models, one
    contrast per start shared by all (``experiments.cpu_table.paired_contrast``), with ``p_holm``: Holm over these
    contrasts at every benchmark and K (``experiments.cpu_table.holm_adjusted``)."""
    out: dict[str, dict[str, dict]] = {}
    others = [run for run in runs if run != reference]
    for benchmark in sorted({r["benchmark"] for r in rows}):
        for k in sorted({r["k"] for r in rows}):
            table = [
                {**r, "method": r["run"], f"pass_at_{k}": r["pass_at_k"]}
                for r in rows
                if r["benchmark"] == benchmark and r["k"] == k
            ]
            by_run = {run: cpu_table.paired_difference(table, run, reference, f"pass_at_{k}") for run in others}
            if reference == "sft" and len(others) > 1:
                weights = {**{run: 1 / len(others) for run in others}, reference: -1.0}
                by_run["mean of runs"] = cpu_table.paired_contrast(table, weights, f"pass_at_{k}")
            out.setdefault(benchmark, {})[str(k)] = by_run
    pooled = [
        by_k["mean of runs"] for by_k in (d for b in out.values() for d in b.values()) if by_k.get("mean of runs")
    ]
    for d, p_holm in zip(pooled, cpu_table.holm_adjusted([d["p"] for d in pooled])):
        d["p_holm"] = p_holm
    return out


def plot(rows: list[dict], runs: list[str], path: Path) -> None:
    """Pass@K against K (log2 axis), mean over seeds, one panel per benchmark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benchmarks = list(dict.fromkeys(r["benchmark"] for r in rows))
    fig, axes = plt.subplots(1, len(benchmarks), figsize=(5 * len(benchmarks) + 2.5, 4.2), squeeze=False)
    colours = plt.get_cmap("tab20")
    for ax, benchmark in zip(axes[0], benchmarks):
        for i, run in enumerate(runs):
            mine = [r for r in rows if r["run"] == run and r["benchmark"] == benchmark]
            ks = sorted({r["k"] for r in mine})
            means = [cpu_table.mean_of_present(r["pass_at_k"] for r in mine if r["k"] == k) for k in ks]
            style = dict(color="black", ls="--", lw=2.2) if run == "sft" else dict(color=colours(i % 20), lw=1.2)
            if run == "atr":
                style["lw"] = 2.4
            ax.plot(ks, means, marker="o", ms=3, label=run, **style)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K")
        ax.set_ylabel("Pass@K (%)")
        ax.set_title(cpu_table.sampling_label(benchmark))
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=png_text_metadata(fig, 120))
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    from atr_llm.cli_types import SEED, Integer, ReadDir, WriteDir
    from atr_llm.command_line import Parser

    runs = ["sft", *sorted(cpu_table.CPU_RUNS)]
    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs-dir", type=ReadDir(as_path=True), required=True)
    ap.add_argument("--runs", nargs="+", required=True, choices=runs)
    ap.add_argument("--seeds", nargs="+", type=SEED, required=True)
    ap.add_argument(
        "--step", type=Integer(1), default=cpu_table.FULL["max_steps"], help="the GRPO checkpoint (default final)"
    )
    ap.add_argument("--ks", nargs="+", type=Integer(1), default=[1, 2, 4, 8])
    ap.add_argument(
        "--references", nargs="+", choices=runs, default=["sft"], help="runs to pair every other run against"
    )
    ap.add_argument("--out", type=WriteDir(as_path=True), required=True)
    args = ap.parse_args(argv)
    if not set(args.references) <= set(args.runs):
        ap.error(f"--references {sorted(set(args.references) - set(args.runs))}: not among --runs {args.runs}")
    rows = [
        r
        for run in args.runs
        for seed in args.seeds
        for r in curve_of_run(args.runs_dir, run, seed, args.step, args.ks)
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "cpu_pass_at_k.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = {
        "settings": {
            "runs_dir": str(args.runs_dir),
            "runs": args.runs,
            "seeds": args.seeds,
            "step": args.step,
            "ks": args.ks,
            "references": args.references,
        },
        "paired_pass_at_k": {ref: paired_by_k(rows, args.runs, ref) for ref in args.references},
        "rows": rows,
    }
    (args.out / "cpu_pass_at_k.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(rows, args.runs, args.out / "cpu_pass_at_k.png")
    for benchmark in cpu_table.BENCHMARKS:
        print(cpu_table.sampling_label(benchmark))
        for run in args.runs:
            means = [
                cpu_table.mean_of_present(
                    r["pass_at_k"] for r in rows if r["run"] == run and r["benchmark"] == benchmark and r["k"] == k
                )
                for k in args.ks
            ]
            print(f"  {run:12s} " + "  ".join(f"Pass@{k} {m:5.1f}" for k, m in zip(args.ks, means)))
    return summary


if __name__ == "__main__":
    main()
