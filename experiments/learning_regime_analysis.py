"""The learning-regime calibration's pre-registered verdict (docs/experiments/learning-regime-calibration-prereg.md):
does clip learn here, where the shuffled-reward control does not?

    python -m experiments.learning_regime_analysis            # the committed table -> analysis.{json,md}
    python -m experiments.learning_regime_analysis --runs-dir runs/learning_regime/calibration/A   # + evals_by_step.csv
    python -m experiments.learning_regime_analysis --comparison figures/experiments/learning_regime/comparison/table
        # the rule comparison (its pre-registration: docs/experiments/learning-regime-comparison-prereg.md): its
        # answers at the calibration's endpoint, the reading at the seeds within the budget and the secondary
        # readings -> analysis.{json,md} beside the table

Reads the calibration's table (``experiments.cpu_table`` output: rows and curves) and writes, beside it,
``analysis.json`` (key ``acceptance``: ``accepted``, ``not accepted`` or ``pending`` before ``SEEDS_NEEDED`` seeds
have every arm), ``analysis.md`` and ``curves.png`` (each arm's training reward, mean over seeds). With
``--runs-dir`` also ``evals_by_step.csv``: every evaluated checkpoint's Mean@8 / Pass@8 per run, seed and sampling.

The four criteria, each over seeds with a 95% Student t interval (``cpu_table.paired_contrast``):
1. clip - SFT, final Mean@8, interval above 0;
2. clip's reward rise (mean reward of its logged rows at steps ``LATE`` minus at steps ``EARLY``), interval above 0;
3. the shuffled arm does neither: shuffled - SFT and shuffled's reward rise, neither interval above 0;
4. clip - shuffled, final Mean@8, interval above 0.
At the primary sampling (T = 0.3) they decide; at T = 1 they are reported as the secondary reading.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

from experiments.cpu_table import (
    BENCHMARKS,
    equivalence_power,
    paired_contrast,
    pairing_key,
    read_table,
    seeds_needed,
)
from sims._common import png_text_metadata

TABLE = Path("figures/experiments/learning_regime/calibration/table")
PRIMARY = "steps-test-T0.3"
FALLBACK = "steps-test-T1"
"""The pre-registered fallback endpoint (the training temperature) when no candidate is accepted at ``PRIMARY``."""
SEEDS_NEEDED = 5
EARLY = (1, 100)
LATE = (901, 1000)
REFERENCE, CONTROL = "clip", "shuffled"


def reward_rise(curves: list[dict], early: tuple[int, int] = EARLY, late: tuple[int, int] = LATE) -> float | None:
    """Mean ``reward`` of the logged rows with ``late[0] <= step <= late[1]`` minus that of the rows in ``early``;
    None when either window has no logged reward."""

    def window(lo: int, hi: int) -> list[float]:
        return [c["reward"] for c in curves if lo <= c["step"] <= hi and c.get("reward") is not None]

    first, last = window(*early), window(*late)
    return statistics.fmean(last) - statistics.fmean(first) if first and last else None


def rise_rows(curve_sets: list[dict]) -> list[dict]:
    """One pseudo-row per (run, seed, SFT model) with its ``reward_rise``, shaped for ``paired_contrast``."""
    rows = []
    for c in curve_sets:
        rise = reward_rise(c["curves"])
        if rise is not None:
            rows.append(
                {
                    "method": c["run"],
                    "seed": c["seed"],
                    "sft_model": c.get("sft_model"),
                    "benchmark": "rise",
                    "rise": rise,
                }
            )
    return rows


def above_zero(d: dict | None) -> bool:
    """Whether a contrast's 95% interval lies above 0 (False without a contrast)."""
    return d is not None and d["low"] > 0


def criteria(rows: list[dict], rises: list[dict], benchmark: str, k: int = 8) -> dict:
    """The four pre-registered criteria at one sampling, with their contrasts."""
    key = f"mean_at_{k}"
    mine = [r for r in rows if r["benchmark"] == benchmark]
    contrasts = {
        "clip_minus_sft": paired_contrast(mine, {REFERENCE: 1.0, "sft": -1.0}, key),
        "shuffled_minus_sft": paired_contrast(mine, {CONTROL: 1.0, "sft": -1.0}, key),
        "clip_minus_shuffled": paired_contrast(mine, {REFERENCE: 1.0, CONTROL: -1.0}, key),
        "clip_reward_rise": paired_contrast(rises, {REFERENCE: 1.0}, "rise"),
        "shuffled_reward_rise": paired_contrast(rises, {CONTROL: 1.0}, "rise"),
    }
    met = {
        "1_clip_beats_sft": above_zero(contrasts["clip_minus_sft"]),
        "2_clip_reward_rises": above_zero(contrasts["clip_reward_rise"]),
        "3_shuffled_does_neither": not above_zero(contrasts["shuffled_minus_sft"])
        and not above_zero(contrasts["shuffled_reward_rise"]),
        "4_clip_beats_shuffled": above_zero(contrasts["clip_minus_shuffled"]),
    }
    return {"contrasts": contrasts, "met": met, "all_met": all(met.values())}


def complete_seeds(rows: list[dict], benchmark: str = PRIMARY) -> list:
    """The starts (seed, SFT model) that have the SFT, clip and shuffled rows at ``benchmark``."""
    have = {}
    for r in rows:
        if r["benchmark"] == benchmark:
            have.setdefault(pairing_key(r), set()).add(r["method"])
    return sorted((s for s, m in have.items() if {"sft", REFERENCE, CONTROL} <= m), key=str)


PAPER_GAP = 2.7
"""The paper's Table 2 gap the comparison should detect (points of Mean@8)."""

MARGIN = 3.0
"""The equivalence margin (points) the comparison tests within."""


def comparison_planning(clip_minus_sft: dict | None, power: float = 0.8, largest: int = 200) -> dict | None:
    """Seeds the rule comparison needs, from the calibration's spread. Two rules trained from one seed's SFT model
    differ by two independent training draws, so the SD of their paired difference is taken as sqrt(2) times the SD
    of clip - SFT over seeds (conservative: clip - SFT also varies with the start, which a rule difference cancels).
    Returns that SD, the seeds for a two-sided paired t test to detect ``PAPER_GAP`` with ``power``
    (``seeds_needed``) and for two one-sided tests to show equivalence within +-``MARGIN`` with ``power`` when the
    true difference is 0 (``equivalence_power``; None above ``largest``). None without a clip - SFT spread."""
    import math

    if clip_minus_sft is None or not clip_minus_sft["sd"] > 0:
        return None
    sd = math.sqrt(2) * clip_minus_sft["sd"]
    equivalent = next((n for n in range(2, largest + 1) if equivalence_power(sd, n, MARGIN) >= power), None)
    return {
        "sd_clip_minus_sft": clip_minus_sft["sd"],
        "sd_between_rules_assumed": sd,
        "power": power,
        "seeds_to_detect_paper_gap": seeds_needed(sd, PAPER_GAP, power),
        "seeds_for_equivalence_within_margin": equivalent,
        "paper_gap": PAPER_GAP,
        "margin": MARGIN,
    }


def analyse(rows: list[dict], curve_sets: list[dict], k: int = 8) -> dict:
    """``analysis.json``'s content: per sampling the criteria, the verdict at the primary one."""
    rises = rise_rows(curve_sets)
    by_benchmark = {b: criteria(rows, rises, b, k) for b in BENCHMARKS}
    seeds = complete_seeds(rows)
    if len(seeds) < SEEDS_NEEDED:
        acceptance = "pending"
    else:
        acceptance = "accepted" if by_benchmark[PRIMARY]["all_met"] else "not accepted"
    fallback = None
    if acceptance == "not accepted":  # the pre-registered fallback: the same four criteria at the training temperature
        met = by_benchmark[FALLBACK]["all_met"]
        fallback = {"benchmark": FALLBACK, "all_met": met, "endpoint": FALLBACK if met else None}
    return {
        "acceptance": acceptance,
        "fallback": fallback,
        "primary": PRIMARY,
        "seeds_complete": [s for s, _ in seeds],
        "seeds_needed": SEEDS_NEEDED,
        "windows": {"early": EARLY, "late": LATE},
        "by_benchmark": by_benchmark,
        "reward_rise_by_seed": sorted(rises, key=lambda r: (r["method"], r["seed"])),
        "comparison_planning": {
            b: comparison_planning(by_benchmark[b]["contrasts"]["clip_minus_sft"]) for b in BENCHMARKS
        },
    }


COMPARISON_TABLE = Path("figures/experiments/learning_regime/comparison/table")
COMPARISON_SEEDS = 12
"""Paired seeds the comparison's answer waits for (its pre-registration)."""

FAMILY: dict[str, dict[str, float]] = {
    "range, min form (atr-min - clip)": {"atr-min": 1.0, "clip": -1.0},
    "clip-higher - clip": {"clip-higher": 1.0, "clip": -1.0},
    "range, mask form (atr - clip-mask)": {"atr": 1.0, "clip-mask": -1.0},
    "form at clip's range (clip-mask - clip)": {"clip-mask": 1.0, "clip": -1.0},
    "form at ATR's range (atr - atr-min)": {"atr": 1.0, "atr-min": -1.0},
}
"""The comparison's pre-registered family of paired contrasts (Holm over these at the endpoint)."""

EQUIVALENCE = "range, min form (atr-min - clip)"
"""The contrast also tested for equivalence within +-``MARGIN`` (two one-sided tests)."""


def compare(rows: list[dict], endpoint: str, k: int = 8, needed: int = COMPARISON_SEEDS) -> dict:
    """The comparison's answer at ``endpoint``: each ``FAMILY`` contrast (``paired_contrast``, final Mean@k) with
    Holm's adjustment over the family, TOST within +-``MARGIN`` for ``EQUIVALENCE``, the validity rule (clip above its
    SFT model and the shuffled arm), and ``answer``: "pending" until every arm has ``COMPARISON_SEEDS`` seeds, then per
    contrast "positive" / "negative" (Holm p < 0.05, by sign), "within +-3 points" (TOST p < 0.05) or "inconclusive"."""
    from experiments.cpu_table import comparison_validity, contrast_values, holm_adjusted, paired_equivalence

    key = f"mean_at_{k}"
    mine = [r for r in rows if r["benchmark"] == endpoint]
    tests = {name: paired_contrast(mine, weights, key) for name, weights in FAMILY.items()}
    present = [d for d in tests.values() if d is not None]
    for d, p_holm in zip(present, holm_adjusted([d["p"] for d in present])):
        d["p_holm"] = p_holm
    differences = contrast_values(mine, FAMILY[EQUIVALENCE], key)
    equivalence = paired_equivalence(differences, MARGIN) if len(differences) >= 2 else None
    arms = {run for weights in FAMILY.values() for run in weights} | {"sft", CONTROL}
    seeds = min(len({pairing_key(r) for r in mine if r["method"] == arm}) for arm in arms)
    complete = seeds >= needed
    answers = {}
    for name, d in tests.items():
        if not complete or d is None:
            answers[name] = "pending"
        elif d["p_holm"] < 0.05:
            answers[name] = "positive" if d["mean"] > 0 else "negative"
        elif name == EQUIVALENCE and equivalence is not None and equivalence["equivalent"]:
            answers[name] = f"within +-{MARGIN:g} points"
        else:
            answers[name] = "inconclusive"
    return {
        "endpoint": endpoint,
        "seeds_per_arm": seeds,
        "seeds_needed": needed,
        "validity": comparison_validity(rows, k).get(endpoint),
        "tests": tests,
        "equivalence": equivalence,
        "answers": answers,
    }


def _interval(d: dict | None) -> str:
    return "n < 2" if d is None else f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] (n = {d['n']})"


def _rise_interval(d: dict | None) -> str:
    return "n < 2" if d is None else f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] (n = {d['n']})"


def markdown(analysis: dict) -> str:
    """``analysis.md``: the verdict, then each sampling's criteria."""
    lines = [f"# Learning-regime calibration: {analysis['acceptance']}", ""]
    if analysis.get("fallback"):
        f = analysis["fallback"]
        lines += [f"Fallback at {f['benchmark']}: the four criteria {'hold' if f['all_met'] else 'do not hold'}.", ""]
    lines.append(
        f"Seeds with every arm: {len(analysis['seeds_complete'])} of {analysis['seeds_needed']} "
        f"({', '.join(map(str, analysis['seeds_complete'])) or 'none'}). Decided at {PRIMARY}."
    )
    for benchmark, c in analysis["by_benchmark"].items():
        con = c["contrasts"]
        lines += ["", f"## {benchmark}", "", "| criterion | contrast, 95% t | met |", "|---|---|---|"]
        lines.append(
            f"| 1. clip - SFT, final Mean@8 | {_interval(con['clip_minus_sft'])} | {c['met']['1_clip_beats_sft']} |"
        )
        lines.append(
            f"| 2. clip's reward rise | {_rise_interval(con['clip_reward_rise'])} | {c['met']['2_clip_reward_rises']} |"
        )
        lines.append(
            f"| 3. shuffled - SFT; shuffled's reward rise | {_interval(con['shuffled_minus_sft'])}; "
            f"{_rise_interval(con['shuffled_reward_rise'])} | {c['met']['3_shuffled_does_neither']} |"
        )
        lines.append(
            f"| 4. clip - shuffled, final Mean@8 | {_interval(con['clip_minus_shuffled'])} | "
            f"{c['met']['4_clip_beats_shuffled']} |"
        )
    return "\n".join(lines) + "\n"


def evals_by_step(runs_dir: Path) -> list[dict]:
    """Every evaluated checkpoint of every finished run (``result.json``) in ``runs_dir``: run, seed, step, sampling,
    Mean@8 and Pass@8 (the SFT model's rows are step 0)."""
    out = []
    for path in sorted(Path(runs_dir).glob("*/result.json")):
        result = json.loads(path.read_text())
        for step, by_benchmark in result["evals"].items():
            for benchmark, scores in by_benchmark.items():
                out.append(
                    {
                        "run": result["run"],
                        "seed": result["seed"],
                        "sft_model": result.get("sft_model"),
                        "step": int(step),
                        "benchmark": benchmark,
                        "mean_at_8": scores["mean@8"],
                        "pass_at_8": scores["pass@8"],
                    }
                )
    return sorted(out, key=lambda r: (r["run"], r["seed"], r["benchmark"], r["step"]))


def plot_rewards(curve_sets: list[dict], path: Path) -> None:
    """Each arm's training reward by step, mean over seeds (thin lines: single seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for run, colour in ((REFERENCE, "C0"), (CONTROL, "C3")):
        mine = [c["curves"] for c in curve_sets if c["run"] == run]
        for curves in mine:
            ax.plot([p["step"] for p in curves], [p["reward"] for p in curves], color=colour, alpha=0.25, lw=0.8)
        steps = sorted({p["step"] for curves in mine for p in curves})
        means = [statistics.fmean(p["reward"] for curves in mine for p in curves if p["step"] == s) for s in steps]
        if steps:
            ax.plot(steps, means, color=colour, lw=2, label=f"{run} (mean of {len(mine)} seeds)")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("training reward (T = 1)")
    ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130, metadata=png_text_metadata(fig, 130))
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    from atr_llm.cli_types import ReadDir
    from atr_llm.command_line import Parser
    from atr_llm.files import atomic_write_text

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=ReadDir(), default=str(TABLE), help="the calibration's cpu_table output")
    ap.add_argument("--runs-dir", type=ReadDir(), help="its runs, for evals_by_step.csv (optional)")
    ap.add_argument(
        "--comparison",
        type=ReadDir(),
        help="the rule comparison's table (figures/experiments/learning_regime/comparison/table): write its "
        "analysis.json beside it, at the endpoint the calibration's verdict chose, instead of the calibration's",
    )
    args = ap.parse_args(argv)
    if args.comparison:
        return comparison_main(Path(args.comparison), Path(args.table))
    table = Path(args.table)
    summary, rows, curve_sets = read_table(table)
    analysis = analyse(rows, curve_sets, summary["settings"]["samples"])
    out = table.parent
    atomic_write_text(out / "analysis.json", json.dumps(analysis, indent=1))
    atomic_write_text(out / "analysis.md", markdown(analysis))
    plot_rewards(curve_sets, out / "curves.png")
    if args.runs_dir:
        by_step = evals_by_step(Path(args.runs_dir))
        with (out / "evals_by_step.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(by_step[0]) if by_step else ["run"])
            w.writeheader()
            w.writerows(by_step)
    print(markdown(analysis))
    return analysis


BUDGET_SEEDS = (310, 311, 312, 313, 314)
"""The seeds complete when the study had used the hours its pre-registration left it (8.5 of the 10, after the
calibration's 1.5), counting each seed's invocation from its SFT log's creation to its last run's ``result.json``
(times of its run folders; the machine also ran other jobs meanwhile): 61, 82, 78, 104 and 107 minutes for seeds
310-314 (432), and seed 315's 93 more pass the 510. The pre-registration reads the answer at these seeds if the budget
ends first; the runs went on to the planned twelve, so both are reported (the twelve as planned, these as the
deviation)."""

ARMS = ("sft", "clip", "atr-min", "clip-higher", "atr", "clip-mask", "shuffled")
"""The comparison's runs, in its pre-registration's order, its SFT models first."""
SECONDARY_MEANS = {
    "acted_true_kl_mean": "true KL per position, mean",
    "acted_true_kl_p95": "true KL per position, 95th percentile",
    "frac_masked_mean": "masked / clipped tokens",
    "late_reward": f"training reward, steps {LATE[0]}-{LATE[1]}",
}
"""The per-arm secondary readings (pre-registration, "Secondary"): column of the endpoint's rows -> its name."""


def secondary(rows: list[dict], curve_sets: list[dict], endpoint: str, k: int = 8) -> dict:
    """The pre-registration's secondary readings, outside the family: the five contrasts at the other sampling (no
    answers, with its validity), ``atr-min - clip`` in entropy over the last fifth of training, and per arm the mean
    over seeds of ``SECONDARY_MEANS`` (the late training reward from the curves, mean of the logged rows in
    ``LATE``)."""
    from experiments.cpu_table import comparison_validity

    other = PRIMARY if endpoint == FALLBACK else FALLBACK
    mine = [r for r in rows if r["benchmark"] == endpoint]
    late = {}
    for c in curve_sets:
        values = [x["reward"] for x in c["curves"] if LATE[0] <= x["step"] <= LATE[1] and x.get("reward") is not None]
        if values:
            late[(c["run"], c["seed"])] = statistics.fmean(values)
    per_arm = {}
    for arm in ARMS:
        arm_rows = [r for r in mine if r["method"] == arm]
        means = {}
        for column in SECONDARY_MEANS:
            values = [late.get((arm, r["seed"])) if column == "late_reward" else r.get(column) for r in arm_rows]
            values = [float(v) for v in values if v not in (None, "")]
            means[column] = statistics.fmean(values) if values else None
        per_arm[arm] = {"seeds": len(arm_rows), **means}
    other_rows = [r for r in rows if r["benchmark"] == other]
    return {
        "other_sampling": other,
        "other_validity": comparison_validity(rows, k).get(other),
        "other_tests": {name: paired_contrast(other_rows, w, f"mean_at_{k}") for name, w in FAMILY.items()},
        "entropy_last_fifth": paired_contrast(mine, FAMILY[EQUIVALENCE], "acted_entropy_last_fifth"),
        "per_arm": per_arm,
    }


def _p(value: float | None) -> str:
    return "-" if value is None else ("< 0.001" if value < 0.001 else f"{value:.3f}")


def comparison_markdown(result: dict) -> str:
    """``analysis.md`` of the comparison: the validity rule, the family's answers at the endpoint (Holm), the TOST,
    then the secondary readings."""
    validity, tests, eq = result["validity"], result["tests"], result["equivalence"]
    lines = [
        f"# The rule comparison at {result['endpoint']}: final held-out Mean@8, points",
        "",
        f"Seeds per arm: {result['seeds_per_arm']} of {result['seeds_needed']}.",
        "",
        f"**A comparison counts here: {'yes' if validity and validity['counts'] else 'no'}** (clip - SFT "
        f"{_interval(validity and validity['reference_minus_sft'])}; clip - shuffled "
        f"{_interval(validity and validity['reference_minus_control'])}).",
        "",
        "| contrast | difference, 95% t | p | Holm p | answer |",
        "|---|---|---|---|---|",
    ]
    for name, d in tests.items():
        lines.append(
            f"| {name} | {_interval(d)} | {_p(d and d['p'])} | {_p(d and d.get('p_holm'))} | "
            f"{result['answers'][name]} |"
        )
    if eq is not None:
        lines += [
            "",
            f"Equivalence of {EQUIVALENCE} within +-{eq['margin']:g} points (two one-sided tests): 90% interval "
            f"[{eq['low90']:+.1f}, {eq['high90']:+.1f}], p {_p(eq['p'])}: "
            f"{'equivalent' if eq['equivalent'] else 'not shown equivalent'}.",
        ]
    budget = result.get("budget_reading")
    if budget:
        lines += [
            "",
            f"## Deviation: the budget ran out after seed {BUDGET_SEEDS[-1]}",
            "",
            f"The same family on seeds {BUDGET_SEEDS[0]}-{BUDGET_SEEDS[-1]} only ({budget['seeds_per_arm']} per arm), "
            "the seeds complete when the budget had passed:",
            "",
            "| contrast | difference, 95% t | Holm p | answer |",
            "|---|---|---|---|",
        ]
        for name, d in budget["tests"].items():
            lines.append(f"| {name} | {_interval(d)} | {_p(d and d.get('p_holm'))} | {budget['answers'][name]} |")
    more = result.get("secondary")
    if more:
        v = more["other_validity"]
        lines += [
            "",
            f"## Secondary, outside the family: the same contrasts at {more['other_sampling']}",
            "",
            f"A comparison counts there: {'yes' if v and v['counts'] else 'no'} (clip - SFT "
            f"{_interval(v and v['reference_minus_sft'])}; clip - shuffled {_interval(v and v['reference_minus_control'])}).",
            "",
            "| contrast | difference, 95% t | p (one test alone) |",
            "|---|---|---|",
        ]
        lines += [f"| {name} | {_interval(d)} | {_p(d and d['p'])} |" for name, d in more["other_tests"].items()]
        e = more["entropy_last_fifth"]
        lines += [
            "",
            "Entropy over the last fifth of training, atr-min - clip: "
            + ("n < 2" if e is None else f"{e['mean']:+.4f} [{e['low']:+.4f}, {e['high']:+.4f}] (n = {e['n']})")
            + ".",
            "",
            "| arm | seeds | " + " | ".join(SECONDARY_MEANS.values()) + " |",
            "|---|---|" + "---|" * len(SECONDARY_MEANS),
        ]
        for arm, m in more["per_arm"].items():
            cells = ["-" if m[c] is None else f"{m[c]:.4g}" for c in SECONDARY_MEANS]
            lines.append(f"| {arm} | {m['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def comparison_main(table: Path, calibration_table: Path) -> dict:
    """Write the comparison's ``analysis.json`` and ``analysis.md`` beside ``table``: ``compare`` at the endpoint the
    calibration chose (its primary one if accepted, else its fallback's), with the seeds and power the calibration
    planned, and the secondary readings (``secondary``)."""
    from atr_llm.command_line import refuse
    from atr_llm.files import atomic_write_text

    calibration = json.loads((calibration_table.parent / "analysis.json").read_text())
    if calibration["acceptance"] == "accepted":
        endpoint = calibration["primary"]
    elif calibration.get("fallback") and calibration["fallback"]["endpoint"]:
        endpoint = calibration["fallback"]["endpoint"]
    else:
        raise refuse("--comparison", str(table), "the calibration chose no endpoint: no rule comparison is run")
    _, rows, curve_sets = read_table(table)
    result = {
        **compare(rows, endpoint),
        "planned": calibration["comparison_planning"][endpoint],
        "secondary": secondary(rows, curve_sets, endpoint),
        "budget_reading": compare(
            [r for r in rows if int(r["seed"]) in BUDGET_SEEDS], endpoint, needed=len(BUDGET_SEEDS)
        ),
    }
    atomic_write_text(table.parent / "analysis.json", json.dumps(result, indent=1))
    atomic_write_text(table.parent / "analysis.md", comparison_markdown(result))
    print(json.dumps(result["answers"], indent=1))
    return result


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
