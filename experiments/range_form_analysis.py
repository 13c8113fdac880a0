"""The range x form study's pre-registered tests (docs/experiments/range-form-preregistration.md), computed from the
study's committed table: nothing here trains or evaluates, and nothing is chosen after seeing the data.

- **The family** (held-out Mean@8 at step 400, paired over seeds 200-209, at T = 0.3 and T = 1; two-sided paired t,
  95% t-intervals, Holm over all ten): range within min ``atr-min - clip``; range within mask ``atr - clip-mask``
  (``atr`` is ATR in the mask form, ``MASK_FORM_RUNS``); form at clip's range ``clip-mask - clip``; form at ATR's
  range ``atr - atr-min``; the interaction ``(atr - clip-mask) - (atr-min - clip)``.
- **The trust-region question** (per run, from its logged true KL, ``atr_llm.true_kl``): (a) the fraction of logged
  rows whose mean true KL exceeds delta = 0.07 (``acted_true_kl_frac_rows_above_delta``), (b) the mean per-row 95th
  percentile (``acted_true_kl_p95``); ATR - clip in each form, paired over seeds, Holm over these four. Described:
  the fraction above delta among kept and dropped tokens, and the rank correlation of k3 with the true KL.
- **The answer rule**: a Holm-adjusted p < 0.05 answers a contrast by its interval's sign; else an interval inside
  [-3, +3] points answers "no difference as large as 3 points"; else inconclusive at this n.
- **Regime check**: clip-min's mean fraction of tokens acted on (``acted_frac_masked``) is at least 1%.

The paired statistics are the CPU table's own (``experiments.cpu_table.statistics``: ``paired_contrast``,
``holm_adjusted``, both checked against scipy / statsmodels in ``tests/studies/test_cpu_table_statistics.py``).

    python -m experiments.range_form_analysis [--table ...] [--runs-dir runs/range_form] [--out ...]

writes ``figures/experiments/range_form/analysis.{json,md}``; with ``--runs-dir`` (the runs' ``log_history.json``)
also ``by_step.{csv,png}``: each cell's training reward and mean true KL by step, averaged over its runs.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

from experiments.cpu_table.statistics import contrast_values, holm_adjusted, paired_contrast, paired_equivalence
from experiments.trust_region_analysis import (
    MARGIN,
    REGIME_FLOOR,
    TEMPERATURES,
    interval_text,
    p_text,
    read_table,
    rows_of,
)
from sims._common import png_text_metadata

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "figures" / "experiments" / "range_form" / "table" / "cpu_llm_table.csv"
EARLIER_TABLE = ROOT / "figures" / "experiments" / "trust_region" / "table" / "cpu_llm_table.csv"
"""The trust-region study's table: the runs this study repeats (``clip``, ``atr``, ``atr-min``, ``sft``)."""
OUT = ROOT / "figures" / "experiments" / "range_form"
SEEDS = tuple(range(200, 210))
RANGE_SEEDS = tuple(range(200, 240))
"""Part 3 of docs/experiments/mask-mechanism-preregistration.md: ``atr-min - clip`` over 40 paired seeds."""
RANGE_CONTRAST = "range within min (atr-min - clip)"
DELTA = 0.07
CELLS = {"clip": ("clip", "min"), "clip-mask": ("clip", "mask"), "atr-min": ("atr", "min"), "atr": ("atr", "mask")}
"""Run name -> (range, form) of the four cells."""

FAMILY = {
    "range within min (atr-min - clip)": {"atr-min": 1.0, "clip": -1.0},
    "range within mask (atr - clip-mask)": {"atr": 1.0, "clip-mask": -1.0},
    "form at clip's range (clip-mask - clip)": {"clip-mask": 1.0, "clip": -1.0},
    "form at ATR's range (atr - atr-min)": {"atr": 1.0, "atr-min": -1.0},
    "interaction ((atr - clip-mask) - (atr-min - clip))": {"atr": 1.0, "clip-mask": -1.0, "atr-min": -1.0, "clip": 1.0},
}
TRUST_REGION = {
    "fraction of rows above delta": "acted_true_kl_frac_rows_above_delta",
    "p95 of the true KL": "acted_true_kl_p95",
}
TRUST_CONTRASTS = {
    "min (atr-min - clip)": {"atr-min": 1.0, "clip": -1.0},
    "mask (atr - clip-mask)": {"atr": 1.0, "clip-mask": -1.0},
}
DESCRIBED = (
    "acted_true_kl_mean",
    "acted_true_kl_p95",
    "acted_true_kl_frac_rows_above_delta",
    "acted_true_kl_frac_above_delta_kept",
    "acted_true_kl_frac_above_delta_dropped",
    "acted_true_kl_k3_rank_corr",
    "acted_frac_masked",
    "acted_entropy_first_fifth",
    "acted_entropy_last_fifth",
)


def answer(difference: dict | None, p_holm: float | None, margin: float | None = MARGIN) -> str:
    """The pre-registered answer rule for one contrast (``margin``: the Mean@8 points inside which an interval
    answers "no difference as large"; None for outcomes the rule gives no margin, the true-KL ones)."""
    if difference is None or difference["n"] < len(SEEDS):
        return f"pending: {0 if difference is None else difference['n']} of {len(SEEDS)} paired seeds"
    if p_holm is not None and p_holm < 0.05:
        return "positive" if difference["mean"] > 0 else "negative"
    if margin is None:
        return "no significant difference at this n"
    if -margin < difference["low"] and difference["high"] < margin:
        return f"no difference as large as {margin:g} points"
    return "inconclusive at this n"


def tested(tests: dict[tuple[str, str], dict | None], margin: float | None = MARGIN) -> dict:
    """``tests`` with Holm-adjusted p over all of them, once every one has all seeds (else unadjusted p only)."""
    complete = all(d is not None and d["n"] == len(SEEDS) for d in tests.values())
    adjusted = holm_adjusted([d["p"] for d in tests.values()]) if complete else [None] * len(tests)
    out: dict[str, dict] = {}
    for ((name, sub), d), p_holm in zip(tests.items(), adjusted):
        out.setdefault(name, {})[sub] = {**(d or {}), "p_holm": p_holm, "answer": answer(d, p_holm, margin)}
    return {"complete": complete, "family_size": len(tests), "tests": out}


def family(rows: list[dict]) -> dict:
    """The five Mean@8 contrasts at both temperatures, Holm over the ten."""
    return tested(
        {
            (name, t): paired_contrast(rows_of(rows, b, SEEDS), weights, "mean_at_8")
            for name, weights in FAMILY.items()
            for t, b in TEMPERATURES.items()
        }
    )


def range_within_min_n40(rows: list[dict], fam: dict) -> dict:
    """Part 3 of the mask-mechanism pre-registration: ``atr-min - clip`` in Mean@8 paired over ``RANGE_SEEDS`` at
    each temperature: the paired t (95% interval), Holm over these two together with the family's other eight tests
    (at n = 10, unchanged), and Schuirmann's two one-sided tests within +-``MARGIN`` points
    (``paired_equivalence``, alpha 0.05 each). The answer rule: a Holm p below 0.05 answers by the interval's sign;
    else an equivalence p below 0.05 answers "within +-3 points"; else "inconclusive at n = 40". Until every seed
    is in: the numbers at the n reached, no Holm, and "pending"."""
    weights = FAMILY[RANGE_CONTRAST]
    by_t = {}
    for t, b in TEMPERATURES.items():
        mine = rows_of(rows, b, RANGE_SEEDS)
        d = paired_contrast(mine, weights, "mean_at_8")
        values = contrast_values(mine, weights, "mean_at_8")
        by_t[t] = {**(d or {}), "equivalence": paired_equivalence(values, MARGIN) if len(values) >= 2 else None}
    complete = all(v.get("n") == len(RANGE_SEEDS) for v in by_t.values())
    others = [d["p"] for name, by in fam["tests"].items() if name != RANGE_CONTRAST for d in by.values()]
    if complete and fam["complete"]:
        adjusted = holm_adjusted([v["p"] for v in by_t.values()] + others)[: len(by_t)]
    else:
        adjusted = [None] * len(by_t)
    for v, p_holm in zip(by_t.values(), adjusted):
        v["p_holm"] = p_holm
        if p_holm is None:
            v["answer"] = f"pending: {v.get('n', 0)} of {len(RANGE_SEEDS)} paired seeds"
        elif p_holm < 0.05:
            v["answer"] = "positive" if v["mean"] > 0 else "negative"
        elif v["equivalence"]["p"] < 0.05:
            v["answer"] = f"within +-{MARGIN:g} points"
        else:
            v["answer"] = f"inconclusive at n = {len(RANGE_SEEDS)}"
    return {"seeds": [RANGE_SEEDS[0], RANGE_SEEDS[-1]], "margin": MARGIN, "family_size": 2 + len(others), "tests": by_t}


def trust_region(rows: list[dict]) -> dict:
    """ATR - clip in the true-KL outcomes (a) and (b), in each form, Holm over the four (one value per run: the
    T = 1 rows carry the run's training summary)."""
    runs = rows_of(rows, TEMPERATURES["T1"], SEEDS)
    return tested(
        {
            (outcome, form): paired_contrast(runs, weights, column)
            for outcome, column in TRUST_REGION.items()
            for form, weights in TRUST_CONTRASTS.items()
        },
        margin=None,
    )


def described(rows: list[dict]) -> dict[str, dict]:
    """Per cell, over its runs: mean, min and max of each ``DESCRIBED`` column and of Mean@8 at each temperature."""
    out: dict[str, dict] = {}
    for run, (rng, form) in CELLS.items():
        runs = [r for r in rows_of(rows, TEMPERATURES["T1"], SEEDS) if r["method"] == run]
        entry: dict = {"range": rng, "form": form, "seeds": sorted(r["seed"] for r in runs)}
        columns = [(key, runs, key) for key in DESCRIBED]
        for t, b in TEMPERATURES.items():
            of = [r for r in rows_of(rows, b, SEEDS) if r["method"] == run]
            columns += [(f"mean_at_8_{t}", of, "mean_at_8"), (f"best_mean_at_8_{t}", of, "best_mean_at_8")]
            steps = [r["best_step"] for r in of if r.get("best_step") is not None]
            if steps:  # the table keeps the better of the step-200 and step-400 checkpoints, not each
                entry[f"runs_best_at_step_200_{t}"] = sum(step == 200 for step in steps)
        for name, of, key in columns:
            xs = [r[key] for r in of if r.get(key) is not None]
            if xs:
                entry[name] = {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs)}
        out[run] = entry
    return out


def regime(rows: list[dict]) -> dict:
    """clip-min's mean fraction of tokens acted on, and whether it passes the pre-registered 1%."""
    xs = [r["acted_frac_masked"] for r in rows_of(rows, TEMPERATURES["T1"], SEEDS) if r["method"] == "clip"]
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"runs": 0}
    return {"runs": len(xs), "mean": statistics.fmean(xs), "passes": statistics.fmean(xs) >= REGIME_FLOOR}


def against_earlier(rows: list[dict], earlier: list[dict]) -> dict[str, dict]:
    """Each run this study repeats from the trust-region study, per temperature, over the seeds both tables hold:
    how many started from the same SFT model (``sft_model``, the weights' hash), how many end at the same Mean@8
    bit for bit, each study's mean, and the mean of the per-seed differences (this - earlier) with its 95% t interval.
    Described, not tested: where the SFT models differ the two runs of a seed share only the seed and the data order."""
    from scipy import stats

    out: dict[str, dict] = {}
    for run in ("sft", *CELLS):
        for t, b in TEMPERATURES.items():
            now = {r["seed"]: r for r in rows_of(rows, b, SEEDS) if r["method"] == run}
            then = {r["seed"]: r for r in rows_of(earlier, b, SEEDS) if r["method"] == run}
            shared = sorted(set(now) & set(then))
            if len(shared) < 2:
                continue
            diffs = [now[s]["mean_at_8"] - then[s]["mean_at_8"] for s in shared]
            mean, half = statistics.fmean(diffs), 0.0
            if len(set(diffs)) > 1:
                half = stats.t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
            out.setdefault(run, {})[t] = {
                "seeds": shared,
                "same_sft_model": sum(now[s]["sft_model"] == then[s]["sft_model"] for s in shared),
                "same_mean_at_8": sum(now[s]["mean_at_8"] == then[s]["mean_at_8"] for s in shared),
                "this_study": statistics.fmean(now[s]["mean_at_8"] for s in shared),
                "trust_region_study": statistics.fmean(then[s]["mean_at_8"] for s in shared),
                "mean": mean,
                "low": mean - half,
                "high": mean + half,
                "n": len(diffs),
            }
    return out


def analyse(rows: list[dict], earlier: list[dict] | None = None) -> dict:
    return {
        "preregistration": "docs/experiments/range-form-preregistration.md",
        "seeds": list(SEEDS),
        "delta": DELTA,
        "family": (fam := family(rows)),
        "range_within_min_equivalence_n40": range_within_min_n40(rows, fam),
        "trust_region": trust_region(rows),
        "regime": regime(rows),
        "described": described(rows),
        "against_trust_region_study": against_earlier(rows, earlier or []),
    }


def by_step(runs_dir: Path) -> list[dict]:
    """Per cell and logged step, the mean over the cell's runs (``<run>-s<seed>/log_history.json``) of the training
    reward and of ``true_kl/mean`` (each over the runs that logged it: the reward is logged every 30 steps, the true
    KL every 10), and ``runs``, the number of runs that logged the step; steps no run logged are left out."""
    values: dict[tuple[str, int], dict[str, list[float]]] = {}
    seen: dict[tuple[str, int], set[int]] = {}
    for run in CELLS:
        for seed in SEEDS:
            path = runs_dir / f"{run}-s{seed}" / "log_history.json"
            if not path.is_file():
                continue
            for h in json.loads(path.read_text()):
                if "step" not in h:
                    continue
                slot = values.setdefault((run, int(h["step"])), {"reward": [], "true_kl_mean": []})
                seen.setdefault((run, int(h["step"])), set()).add(seed)
                for name, key in (("reward", "reward"), ("true_kl_mean", "true_kl/mean")):
                    if h.get(key) is not None:
                        slot[name].append(float(h[key]))
    return [
        {
            "run": run,
            "step": step,
            **{k: statistics.fmean(v) if v else None for k, v in slot.items()},
            "runs": len(seen[run, step]),
        }
        for (run, step), slot in sorted(values.items())
    ]


def read_by_step(path: Path) -> list[dict]:
    """``by_step.csv`` back as ``by_step`` returned it (empty cells None)."""
    with path.open(newline="") as f:
        return [
            {
                "run": r["run"],
                "step": int(r["step"]),
                **{k: float(r[k]) if r[k] else None for k in ("reward", "true_kl_mean")},
                "runs": int(r["runs"]),
            }
            for r in csv.DictReader(f)
        ]


def plot_by_step(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for run, (rng, form) in CELLS.items():
        mine = [r for r in rows if r["run"] == run]
        for ax, key in zip(axes, ("reward", "true_kl_mean")):
            pts = [(r["step"], r[key]) for r in mine if r[key] is not None]
            if pts:
                label = f"{rng}, {form} form ({run})" if key == "reward" else None  # one legend, on the left
                ax.plot(*zip(*pts), label=label, ls="-" if form == "min" else "--")
    axes[0].set(xlabel="GRPO step", ylabel="training reward (T = 1)")
    axes[1].axhline(DELTA, color="grey", lw=0.8, ls=":", label=f"delta = {DELTA}")
    axes[1].set(xlabel="GRPO step", ylabel="mean true KL(pi_old || pi) per position", yscale="log")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=7, frameon=False)
    axes[1].legend(fontsize=7, loc="center right")  # between the two groups of curves: it covers none
    fig.tight_layout(rect=(0, 0.07, 1, 1))  # the cells' legend below the panels, off every curve
    fig.savefig(path, dpi=150, metadata=png_text_metadata(fig, 150))
    plt.close(fig)


def markdown(result: dict) -> str:
    """The tests as the tables the study page quotes."""
    fam, tr = result["family"], result["trust_region"]
    lines = [
        "# Range x form study: the pre-registered tests",
        "",
        "Written by `python -m experiments.range_form_analysis` from the study's table. `atr` is ATR in the mask form "
        "(pure clip, the Section 4 objective), `atr-min` ATR in the min form (the Section 2 surrogate), `clip` PPO's "
        "clip in the min form, `clip-mask` in the mask form.",
        "",
        f"## Held-out Mean@8 at step 400 (points; Holm over {fam['family_size']}"
        + ("" if fam["complete"] else "; incomplete: unadjusted p only")
        + ")",
        "",
        "| contrast | T = 0.3 [95% CI] | p (Holm) | answer | T = 1 [95% CI] | p (Holm) | answer |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, by in fam["tests"].items():
        cells = [
            f"{interval_text(by[t], '+.3g')} | {p_text(by[t].get('p_holm'))} | {by[t]['answer']}" for t in TEMPERATURES
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    n40 = result["range_within_min_equivalence_n40"]
    lines += [
        "",
        f"## The range within the min form at up to {len(RANGE_SEEDS)} paired seeds (seeds {n40['seeds'][0]}-"
        f"{n40['seeds'][1]}; Holm over {n40['family_size']} with the family's other tests; equivalence within "
        f"+-{n40['margin']:g} points)",
        "",
        "| T | seeds | atr-min - clip [95% CI] | p (Holm) | 90% CI | equivalence p | answer |",
        "|---|---|---|---|---|---|---|",
    ]
    for t, d in n40["tests"].items():
        eq = d.get("equivalence") or {}
        ninety = f"[{eq['low90']:+.3g}, {eq['high90']:+.3g}]" if eq else "-"
        lines.append(
            f"| {t} | {d.get('n', 0)} | {interval_text(d, '+.3g') if d.get('n') else '-'} | {p_text(d.get('p_holm'))} | "
            f"{ninety} | {p_text(eq.get('p'))} | {d['answer']} |"
        )
    lines += [
        "",
        f"## The true KL: ATR - clip in each form (Holm over {tr['family_size']}"
        + ("" if tr["complete"] else "; incomplete: unadjusted p only")
        + ")",
        "",
        "| outcome | form | ATR - clip [95% CI] | p | p (Holm) | answer |",
        "|---|---|---|---|---|---|",
    ]
    for outcome, by in tr["tests"].items():
        for form, d in by.items():
            lines.append(
                f"| {outcome} | {form} | {interval_text(d, '+.3g')} | {p_text(d.get('p'))} | {p_text(d.get('p_holm'))} | {d['answer']} |"
            )
    lines += [
        "",
        "## Each cell (mean over its runs)",
        "",
        "| run | range | form | seeds | Mean@8 T = 0.3 | Mean@8 T = 1 | true KL mean | true KL p95 | rows above delta | "
        "kept above delta | dropped above delta | rank corr (k3, true KL) | acted on |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run, d in result["described"].items():

        def m(key, fmt="{:.3g}"):
            return fmt.format(d[key]["mean"]) if key in d else "-"

        lines.append(
            f"| {run} | {d['range']} | {d['form']} | {len(d['seeds'])} | {m('mean_at_8_T0.3', '{:.1f}')} | "
            f"{m('mean_at_8_T1', '{:.1f}')} | {m('acted_true_kl_mean')} | {m('acted_true_kl_p95')} | "
            f"{m('acted_true_kl_frac_rows_above_delta')} | {m('acted_true_kl_frac_above_delta_kept')} | "
            f"{m('acted_true_kl_frac_above_delta_dropped')} | {m('acted_true_kl_k3_rank_corr')} | "
            f"{m('acted_frac_masked', '{:.2%}')} |"
        )
    again = result.get("against_trust_region_study") or {}
    if again:
        lines += [
            "",
            "## The runs this study repeats from the trust-region study (described, not tested)",
            "",
            "| run | T | seeds in both | same SFT model | same Mean@8 | this study | trust-region study | "
            "this - earlier [95% CI] |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for run, by in again.items():
            for t, d in by.items():
                lines.append(
                    f"| {run} | {t} | {d['n']} | {d['same_sft_model']} | "
                    f"{d['same_mean_at_8']} | {d['this_study']:.1f} | {d['trust_region_study']:.1f} | "
                    f"{interval_text(d, '+.3g')} |"
                )
    reg = result["regime"]
    if reg.get("runs"):
        lines += [
            "",
            f"Regime check: clip (min) acts on {reg['mean']:.2%} of tokens on average over {reg['runs']} runs "
            f"({'passes' if reg['passes'] else 'fails'} the pre-registered 1%).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    from atr_llm.cli_types import ReadDir, ReadFile, WriteDir
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=ReadFile(), default=str(TABLE), help="the study's cpu_llm_table.csv")
    ap.add_argument(
        "--earlier-table",
        type=ReadFile(),
        default=str(EARLIER_TABLE),
        help="the trust-region study's cpu_llm_table.csv",
    )
    ap.add_argument("--runs-dir", type=ReadDir(), default=None, help="the study's runs (for by_step.{csv,png})")
    ap.add_argument("--out", type=WriteDir(), default=str(OUT), help="folder for analysis.json and analysis.md")
    args = ap.parse_args(argv)
    result = analyse(read_table(Path(args.table)), read_table(Path(args.earlier_table), argument="--earlier-table"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "analysis.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "analysis.md").write_text(markdown(result))
    if args.runs_dir is not None:
        steps = by_step(Path(args.runs_dir))
        with (out / "by_step.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["run", "step", "reward", "true_kl_mean", "runs"])
            writer.writeheader()
            writer.writerows(steps)
        plot_by_step(steps, out / "by_step.png")
    elif (out / "by_step.csv").is_file():  # the runs are gone: the figure is drawn again from the written record
        plot_by_step(read_by_step(out / "by_step.csv"), out / "by_step.png")
    print(markdown(result))
    return result


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
