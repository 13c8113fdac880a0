"""A pre-registered replication of one comparison of a cpu table on fresh starts, read from two committed tables.

The exploratory table (many rules, a Holm family) suggests a direction for one difference, ``run - reference``; a
second table written with the same protocol on *new* seeds (new SFT models) tests that one difference alone, one-sided
in the direction fixed before it ran (the prediction commit). This reads, per benchmark: the exploratory paired
difference, the replication's paired difference with its one-sided p in that direction and how many of its seeds
lie on that side, and both pooled (every start of the two tables). It refuses two tables whose protocols differ
(``experiments.cpu_table.protocol_differences``) or that share a start: a replication on the same SFT models is not
independent of what it replicates.

    python -m experiments.cpu_table.replication --exploratory figures/experiments/cpu_table/startC \
        --replication figures/experiments/cpu_table/startC_replication --run atr --reference clip --direction below \
        --out figures/experiments/cpu_table/readouts/replication_atr_clip.json
"""

from __future__ import annotations

import json

DIRECTIONS = ("below", "above")


def one_sided_p(difference: dict, direction: str) -> float:
    """One-sided p of a paired difference (``experiments.cpu_table.paired_difference``, two-sided ``p`` of a
    Student t) for the alternative ``mean < 0`` (``direction`` "below") or ``mean > 0`` ("above"): half the
    two-sided p when the mean lies on that side, one minus half of it otherwise."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    on_side = difference["mean"] < 0 if direction == "below" else difference["mean"] > 0
    return difference["p"] / 2 if on_side else 1 - difference["p"] / 2


def replication_readout(
    exploratory_rows: list[dict],
    replication_rows: list[dict],
    run: str,
    reference: str,
    direction: str,
    k: int = 8,
) -> dict:
    """Per benchmark the ``exploratory``, ``replication`` and ``pooled`` paired Mean@k difference ``run -
    reference`` (``experiments.cpu_table.paired_difference``); the replication's also carries ``p_one_sided`` in
    ``direction`` and ``on_side`` / ``starts`` (its starts where the difference lies strictly on that side). Raises
    when a start (seed and SFT model) or an SFT model (under any seed) of ``run`` or ``reference`` is in both tables,
    or the replication has fewer than two paired starts."""
    from experiments import cpu_table

    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    key = f"mean_at_{k}"
    mine = [r for r in replication_rows if r["method"] in (run, reference)]
    theirs = [r for r in exploratory_rows if r["method"] in (run, reference)]
    shared = {cpu_table.pairing_key(r) for r in mine} & {cpu_table.pairing_key(r) for r in theirs}
    shared_models = {r.get("sft_model") for r in mine} & {r.get("sft_model") for r in theirs} - {None}
    if shared or shared_models:
        raise ValueError(
            f"the two tables share starts {sorted(shared, key=str)} / SFT models {sorted(shared_models)}: a replication"
            " needs fresh SFT models"
        )
    out = {"run": run, "reference": reference, "direction": direction, "benchmarks": {}}
    for b in sorted({r["benchmark"] for r in mine}):
        replication = [r for r in mine if r["benchmark"] == b]
        exploratory = [r for r in theirs if r["benchmark"] == b]
        d = cpu_table.paired_difference(replication, run, reference, key)
        if d is None:
            raise ValueError(f"{b}: the replication has fewer than two starts where {run} and {reference} both ran")
        value = {(r["method"], cpu_table.pairing_key(r)): r[key] for r in replication}
        differences = [value[run, s] - value[reference, s] for m, s in value if m == run and (reference, s) in value]
        out["benchmarks"][b] = {
            "exploratory": cpu_table.paired_difference(exploratory, run, reference, key),
            "replication": {
                **d,
                "p_one_sided": one_sided_p(d, direction),
                "on_side": sum(x < 0 if direction == "below" else x > 0 for x in differences),
                "starts": len(differences),
            },
            "pooled": cpu_table.paired_difference(exploratory + replication, run, reference, key),
        }
    return out


def _difference(d: dict | None) -> str:
    if d is None:
        return "none (fewer than two paired starts)"
    return f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] (n {d['n']}, p {d['p']:.4g})"


def main(argv: list[str] | None = None) -> dict:
    from atr_llm.cli_types import ReadDir, WriteFile
    from atr_llm.command_line import Parser
    from experiments import cpu_table

    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--exploratory", type=ReadDir(as_path=True), required=True, help="the table that suggested the direction"
    )
    ap.add_argument("--replication", type=ReadDir(as_path=True), required=True, help="the table of fresh starts")
    ap.add_argument("--run", choices=sorted(cpu_table.CPU_RUNS), required=True)
    ap.add_argument("--reference", choices=sorted(cpu_table.CPU_RUNS), required=True)
    ap.add_argument("--direction", choices=DIRECTIONS, required=True, help="the pre-registered side of run - reference")
    ap.add_argument("--out", type=WriteFile(as_path=True))
    args = ap.parse_args(argv)
    if args.run == args.reference:  # a run against itself: every difference is 0, nothing is replicated
        from atr_llm.command_line import refuse

        raise refuse("--reference", args.reference, f"the same run as --run {args.run}; compare two runs")
    (_, exploratory_rows, _), (replication_summary, replication_rows, _) = cpu_table.read_tables_of_one_protocol(
        args.exploratory, args.replication
    )
    k = replication_summary["settings"]["samples"]
    result = replication_readout(exploratory_rows, replication_rows, args.run, args.reference, args.direction, k)
    result["tables"] = {"exploratory": str(args.exploratory), "replication": str(args.replication)}
    for b, by in result["benchmarks"].items():
        r = by["replication"]
        print(
            f"{args.run} - {args.reference} [{b}]: exploratory {_difference(by['exploratory'])}; replication"
            f" {_difference(r)}, one-sided p {r['p_one_sided']:.4f}, {r['on_side']} of {r['starts']} {args.direction};"
            f" pooled {_difference(by['pooled'])}"
        )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
