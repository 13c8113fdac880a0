"""Where two cpu-table runs from the same SFT models part, and how far apart they end: one pair per ``--pair``.

Training on one machine kind is deterministic, so two rules run from the same SFT model make the same updates -- and
log the same curves bit for bit -- until a batch on which their gradients differ (README, "Two declarations of one
rule"). Per shared start (seed and SFT model) this reads, from the committed tables only (no run is re-trained):
the first logged step at which the curves part (``experiments.cpu_table.where_curves_part``), whether the final
Mean@k / Pass@k are equal, and over the starts that parted the spread of the final Mean@k differences, beside the
paired difference over every shared start (``experiments.cpu_table.paired_difference``) and the pooled spread of a
difference between two rules in the first run's table (``experiments.cpu_table.between_rule_noise``). The two runs may
come from two tables written with the same protocol (the other table is refused, naming the settings that differ).

    python -m experiments.cpu_table.parted_runs \
        --pair figures/experiments/cpu_table/startC:clip-higher-0.329-0.422 figures/experiments/cpu_table/forms_lr1e-4:atr-min \
        --pair figures/experiments/cpu_table/startC:dual-clip figures/experiments/cpu_table/startC:clip \
        --out figures/experiments/cpu_table/readouts/parted_runs.json

Prints and writes JSON: a list, per pair ``{"run", "reference", "tables", "starts": [{"seed", "sft_model",
"parts_at", "<benchmark>": {"run", "reference", "equal"}}], "benchmarks": {"<benchmark>": {"parted_n",
"parted_min", "parted_max", "parted_sd", "unparted_all_equal", "paired", "table_between_rule_sd"}}}``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def parted_pair(
    run: str,
    run_rows: list[dict],
    run_curves: list[dict],
    reference: str,
    reference_rows: list[dict],
    reference_curves: list[dict],
    k: int = 8,
) -> dict:
    """Per shared start of ``run`` and ``reference`` (each with its own table's rows and curve sets, so the two may
    come from two tables): ``parts_at`` and, per benchmark, both final Mean@k and whether they are equal (Mean@k
    and Pass@k, to the last digit); per
    benchmark, over the starts whose curves parted, the final Mean@k differences' ``parted_min`` / ``parted_max`` /
    ``parted_sd`` (sample sd; None below 2 starts), ``unparted_all_equal`` (every start that did not part ends
    equal: False would say the outcome moved without any logged update changing), and the ``paired`` difference over
    every shared start. Raises when the two share no start."""
    from experiments import cpu_table

    key = f"mean_at_{k}"
    # the two runs under labels of their own: they may have one name (the same rule in two tables)
    labelled = [{**c, "run": "run"} for c in run_curves if c["run"] == run] + [
        {**c, "run": "reference"} for c in reference_curves if c["run"] == reference
    ]
    parted = {
        (p["seed"], p["sft_model"]): p["parts_at"]
        for p in cpu_table.where_curves_part(labelled, ["run"], "reference").get("run", [])
    }
    if not parted:
        raise ValueError(f"{run} and {reference} share no start (seed and SFT model) with curves in both tables")
    mine = [{**r, "method": "run"} for r in run_rows if r["method"] == run]
    theirs = [{**r, "method": "reference"} for r in reference_rows if r["method"] == reference]
    benchmarks = sorted({r["benchmark"] for r in mine} & {r["benchmark"] for r in theirs})
    value = {(r["method"], r["benchmark"], *cpu_table.pairing_key(r)): r[key] for r in mine + theirs}
    passed = {(r["method"], r["benchmark"], *cpu_table.pairing_key(r)): r.get(f"pass_at_{k}") for r in mine + theirs}
    starts = []
    for (seed, model), parts_at in sorted(parted.items(), key=str):
        entry = {"seed": seed, "sft_model": model, "parts_at": parts_at}
        for b in benchmarks:
            a, c = value.get(("run", b, seed, model)), value.get(("reference", b, seed, model))
            same_pass = passed.get(("run", b, seed, model)) == passed.get(("reference", b, seed, model))
            entry[b] = {"run": a, "reference": c, "equal": a is not None and a == c and same_pass}
        starts.append(entry)
    summary = {}
    for b in benchmarks:
        present = [s for s in starts if s[b]["run"] is not None and s[b]["reference"] is not None]
        differences = [s[b]["run"] - s[b]["reference"] for s in present if s["parts_at"] is not None]
        rows = [r for r in mine + theirs if r["benchmark"] == b]
        summary[b] = {
            "parted_n": len(differences),
            "parted_min": min(differences, default=None),
            "parted_max": max(differences, default=None),
            "parted_sd": statistics.stdev(differences) if len(differences) >= 2 else None,
            "unparted_all_equal": all(s[b]["equal"] for s in present if s["parts_at"] is None),
            "paired": cpu_table.paired_difference(rows, "run", "reference", key),
        }
    return {"run": run, "reference": reference, "starts": starts, "benchmarks": summary}


def table_and_run(spec: str) -> tuple[Path, str]:
    """``figures/experiments/cpu_table/startC:clip`` -> (that directory, ``clip``)."""
    directory, sep, run = spec.rpartition(":")
    if not sep or not directory or not run:
        raise ValueError(f"expected TABLE_DIR:RUN (e.g. figures/experiments/cpu_table/startC:clip), got {spec!r}")
    return Path(directory), run


def main(argv: list[str] | None = None) -> list[dict]:
    from atr_llm.cli_types import Text, WriteFile
    from atr_llm.command_line import Parser
    from experiments import cpu_table

    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--pair", type=Text(), nargs=2, action="append", required=True, metavar=("TABLE:RUN", "TABLE:REFERENCE")
    )
    ap.add_argument("--out", type=WriteFile(as_path=True))
    args = ap.parse_args(argv)
    results = []
    for run_spec, reference_spec in args.pair:
        (run_dir, run), (reference_dir, reference) = table_and_run(run_spec), table_and_run(reference_spec)
        (run_summary, run_rows, run_curves), (_, reference_rows, reference_curves) = (
            cpu_table.read_tables_of_one_protocol(run_dir, reference_dir)
        )
        k = run_summary["settings"]["samples"]
        result = parted_pair(run, run_rows, run_curves, reference, reference_rows, reference_curves, k)
        result["tables"] = [str(run_dir), str(reference_dir)]
        for b, s in result["benchmarks"].items():
            s["table_between_rule_sd"] = (run_summary.get("between_rule_noise", {}).get(b) or {}).get("sd")
        results.append(result)
        for b, s in result["benchmarks"].items():
            p = s["paired"]
            print(
                f"{run} - {reference} [{b}]: parted {s['parted_n']} of {len(result['starts'])} starts "
                f"(at {[st['parts_at'] for st in result['starts']]}); parted differences "
                f"{s['parted_min']} .. {s['parted_max']}, sd {s['parted_sd']}; table's between-rule sd "
                f"{s['table_between_rule_sd']}; over all starts {p and round(p['mean'], 2)} "
                f"[{p and round(p['low'], 2)}, {p and round(p['high'], 2)}]"
            )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
