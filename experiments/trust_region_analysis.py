"""The trust-region study's pre-registered tests (docs/experiments/trust-region-preregistration.md), computed from
the study's committed table: nothing here trains or evaluates, and nothing is chosen after seeing the data.

- **Primary**: ``atr - clip`` in held-out Mean@8 at step 400, paired over seeds 200-209, at T = 0.3 and T = 1;
  two-sided paired t, Holm over the two, 95% t-intervals. The answer rule: a Holm-adjusted p < 0.05 at a
  temperature answers "better / worse" by its interval; else an interval inside [-3, +3] points answers "no
  difference as large as 3 points"; else inconclusive at this n.
- **Secondary**: each of ``clip-higher, atr-min, atr-seq, dppo-kl, cispo, reinforce-tis`` minus ``clip``, paired
  over seeds 200-204, at both temperatures; Holm over the twelve (computed only once all twelve exist: until then
  the unadjusted p is reported and the family is marked incomplete).
- **Entropy**: ``atr - clip`` in the mean token entropy over the last fifth of the logged steps
  (``acted_entropy_last_fifth``), paired over seeds 200-209; one test at alpha 0.05.
- **Regime check**: the mean over the clip runs of the fraction of tokens whose gradient clip removed
  (``acted_frac_masked``) must be at least 1%.
- **Described, not tested**: every rule's fraction acted on, ratio quantiles and entropy, and its training reward
  by step.

The paired statistics are the CPU table's own (``experiments.cpu_table.statistics``: ``paired_difference``,
``holm_adjusted``, both checked against scipy / statsmodels in ``tests/studies/test_cpu_table_statistics.py``).

    python -m experiments.trust_region_analysis [--table figures/experiments/trust_region/table/cpu_llm_table.csv]

writes ``figures/experiments/trust_region/analysis.{json,md}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

from experiments.cpu_table.statistics import holm_adjusted, paired_difference

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "figures" / "experiments" / "trust_region" / "table" / "cpu_llm_table.csv"
OUT = ROOT / "figures" / "experiments" / "trust_region"
TEMPERATURES = {"T0.3": "steps-test-T0.3", "T1": "steps-test-T1"}
PRIMARY_SEEDS = tuple(range(200, 210))
SECONDARY_SEEDS = tuple(range(200, 205))
SECONDARY_RULES = ("clip-higher", "atr-min", "atr-seq", "dppo-kl", "cispo", "reinforce-tis")
MARGIN = 3.0  # points: an interval inside [-MARGIN, +MARGIN] answers "no difference as large as 3 points"
REGIME_FLOOR = 0.01  # the pre-registered regime check: clip acts on >= 1% of tokens on average
DESCRIBED = (
    "acted_frac_masked",
    "acted_frac_clipped_low",
    "acted_frac_clipped_high",
    "acted_ratio_p05",
    "acted_ratio_p95",
    "acted_entropy_first_fifth",
    "acted_entropy_last_fifth",
)


TABLE_COLUMNS = ("method", "seed", "benchmark", "mean_at_8")
"""Columns a study table (``cpu_llm_table.csv``, written by ``experiments.cpu_table``) has at least."""


def read_table(path: Path, argument: str = "--table") -> list[dict]:
    """The study table's rows, numbers as floats (empty cells None); a file that is not such a table (no header with
    ``TABLE_COLUMNS``, no rows, a number column with text in it) is refused naming ``argument`` and the line."""
    from atr_llm.command_line import refuse

    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except UnicodeDecodeError:
        raise refuse(argument, str(path), "not UTF-8 text: expected the study's cpu_llm_table.csv") from None
    missing = [c for c in TABLE_COLUMNS if not rows or c not in rows[0]]
    if missing:
        raise refuse(argument, str(path), f"not a study table (cpu_llm_table.csv): no column(s) {', '.join(missing)}")
    for line, row in enumerate(rows, 2):
        for key, value in row.items():
            if key in ("method", "benchmark", "sft_model", "sft_machine", "invocation"):
                continue
            try:
                row[key] = None if value in ("", None) else float(value)
            except (TypeError, ValueError):
                raise refuse(argument, str(path), f"line {line}: column {key!r} is not a number ({value!r})") from None
        row["seed"] = int(row["seed"])
    return rows


def rows_of(rows: list[dict], benchmark: str, seeds: tuple[int, ...]) -> list[dict]:
    return [r for r in rows if r["benchmark"] == benchmark and r["seed"] in seeds]


def verdict(difference: dict | None, p_holm: float | None, n_needed: int) -> str:
    """The pre-registered answer rule for one primary temperature (``difference``: ``paired_difference``)."""
    if difference is None or difference["n"] < n_needed:
        have = 0 if difference is None else difference["n"]
        return f"pending: {have} of {n_needed} paired seeds"
    if p_holm is not None and p_holm < 0.05:
        return "atr better than clip" if difference["mean"] > 0 else "atr worse than clip"
    if -MARGIN < difference["low"] and difference["high"] < MARGIN:
        return f"no difference as large as {MARGIN:g} points"
    return "inconclusive at this n"


def primary(rows: list[dict]) -> dict:
    """atr - clip at both temperatures, Holm over the two (once both have all ten seeds)."""
    out = {
        t: paired_difference(rows_of(rows, b, PRIMARY_SEEDS), "atr", "clip", "mean_at_8")
        for t, b in TEMPERATURES.items()
    }
    complete = all(d is not None and d["n"] == len(PRIMARY_SEEDS) for d in out.values())
    adjusted = holm_adjusted([d["p"] for d in out.values()]) if complete else [None] * len(out)
    for (t, d), p_holm in zip(list(out.items()), adjusted):
        out[t] = {**(d or {}), "p_holm": p_holm, "answer": verdict(d, p_holm, len(PRIMARY_SEEDS))}
    return out


def secondary(rows: list[dict]) -> dict:
    """Each secondary rule - clip at both temperatures; Holm over the twelve once every one has five pairs."""
    tests = {
        (rule, t): paired_difference(rows_of(rows, b, SECONDARY_SEEDS), rule, "clip", "mean_at_8")
        for rule in SECONDARY_RULES
        for t, b in TEMPERATURES.items()
    }
    complete = all(d is not None and d["n"] == len(SECONDARY_SEEDS) for d in tests.values())
    adjusted = holm_adjusted([d["p"] for d in tests.values()]) if complete else [None] * len(tests)
    out: dict[str, dict] = {}
    for ((rule, t), d), p_holm in zip(tests.items(), adjusted):
        entry = {**(d or {}), "p_holm": p_holm}
        if d is not None and p_holm is not None:
            entry["significant_holm"] = p_holm < 0.05
        out.setdefault(rule, {})[t] = entry
    return {"complete": complete, "family_size": len(tests), "tests": out}


def entropy(rows: list[dict]) -> dict | None:
    """atr - clip in the last fifth's mean token entropy (one value per run: the T = 1 rows carry it)."""
    return paired_difference(
        rows_of(rows, TEMPERATURES["T1"], PRIMARY_SEEDS), "atr", "clip", "acted_entropy_last_fifth"
    )


def regime(rows: list[dict]) -> dict:
    """The clip runs' fraction of tokens acted on: mean, range, and whether it passes the pre-registered 1%."""
    fractions = [
        r["acted_frac_masked"]
        for r in rows_of(rows, TEMPERATURES["T1"], PRIMARY_SEEDS)
        if r["method"] == "clip" and r.get("acted_frac_masked") is not None
    ]
    if not fractions:
        return {"runs": 0}
    mean = statistics.fmean(fractions)
    return {
        "runs": len(fractions),
        "mean": mean,
        "min": min(fractions),
        "max": max(fractions),
        "passes": mean >= REGIME_FLOOR,
    }


def described(rows: list[dict]) -> dict[str, dict]:
    """Per rule, over its runs: mean and range of every ``DESCRIBED`` column, the seeds, and Mean@8 per temperature."""
    out: dict[str, dict] = {}
    for rule in sorted({r["method"] for r in rows}):
        runs = [r for r in rows if r["method"] == rule and r["benchmark"] == TEMPERATURES["T1"]]
        entry: dict = {"seeds": sorted(r["seed"] for r in runs)}
        for key in DESCRIBED:
            xs = [r[key] for r in runs if r.get(key) is not None]
            if xs:
                entry[key] = {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs)}
        for t, b in TEMPERATURES.items():
            xs = [r["mean_at_8"] for r in rows if r["method"] == rule and r["benchmark"] == b]
            if xs:
                entry[f"mean_at_8_{t}"] = {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs)}
        out[rule] = entry
    return out


def reward_curves(path: Path) -> dict[str, dict[str, float]]:
    """Per rule, the training reward at each logged step averaged over the rule's runs (the table's
    ``cpu_llm_curves.csv``; steps that log no reward are left out). Described, not tested."""
    by: dict[tuple[str, int], list[float]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if row.get("reward"):
                by.setdefault((row["method"], int(row["step"])), []).append(float(row["reward"]))
    out: dict[str, dict[str, float]] = {}
    for (rule, step), xs in sorted(by.items()):
        out.setdefault(rule, {})[str(step)] = statistics.fmean(xs)
    return out


def on_secondary_seeds(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per rule, the mean Mean@8 over seeds 200-204 at each temperature: every rule on the same five starts (the
    primary rules ran ten; described, not tested). Rules without all five seeds are left out."""
    out: dict[str, dict[str, float]] = {}
    for rule in sorted({r["method"] for r in rows}):
        entry = {}
        for t, b in TEMPERATURES.items():
            xs = {r["seed"]: r["mean_at_8"] for r in rows_of(rows, b, SECONDARY_SEEDS) if r["method"] == rule}
            if len(xs) == len(SECONDARY_SEEDS):
                entry[t] = statistics.fmean(xs.values())
        if entry:
            out[rule] = entry
    return out


def analyse(rows: list[dict], curves: Path | None = None) -> dict:
    return {
        "preregistration": "docs/experiments/trust-region-preregistration.md",
        "primary": primary(rows),
        "secondary": secondary(rows),
        "entropy": entropy(rows),
        "regime": regime(rows),
        "described": described(rows),
        "mean_at_8_on_seeds_200_204": on_secondary_seeds(rows),
        "reward_curves": reward_curves(curves) if curves is not None and curves.is_file() else {},
    }


def interval_text(d: dict | None, spec: str = "+.2f") -> str:
    """A paired difference as ``mean [low, high] (n = N)`` (``-`` when there is none)."""
    if not d or d.get("mean") is None:
        return "-"
    return f"{d['mean']:{spec}} [{d['low']:{spec}}, {d['high']:{spec}}] (n = {d['n']})"


def p_text(x) -> str:
    """A p-value in 3 significant digits (``-`` when there is none)."""
    return "-" if x is None else f"{x:.3g}"


def labelled(rule: str) -> str:
    """``rule`` with the form it trained where its name does not say it: ``"atr (mask)"``, ``"clip (min)"``."""
    from experiments.cpu_table.protocol import run_form

    form = run_form(rule)
    return rule if form is None or rule.endswith(("-min", "-mask")) else f"{rule} ({form})"


def markdown(result: dict) -> str:
    """The analysis as the tables the study page quotes, every rule labelled by its form (``labelled``)."""
    lines = [
        "# Trust-region study: the pre-registered tests",
        "",
        "Written by `python -m experiments.trust_region_analysis` from the study's table. `atr` is ATR in the mask "
        "form (the paper's Section 4 pure-clip objective; `atr`'s default when the study ran), `atr-min` ATR in the "
        "min form (its Section 2 surrogate, the clip inside PPO's min). The primary contrast, atr (mask) - clip (min), "
        "changes the range and the form at once; atr-min - clip changes the range only.",
        "",
        "## Primary: atr (mask) - clip (min), held-out Mean@8 at step 400 (points)",
        "",
        "| temperature | difference [95% CI] | p | p (Holm, 2) | answer |",
        "|---|---|---|---|---|",
    ]
    for t, d in result["primary"].items():
        lines.append(f"| {t} | {interval_text(d)} | {p_text(d.get('p'))} | {p_text(d.get('p_holm'))} | {d['answer']} |")
    sec = result["secondary"]
    lines += [
        "",
        f"## Secondary: rule - clip, seeds 200-204 (Holm over {sec['family_size']}"
        + ("" if sec["complete"] else "; family incomplete: unadjusted p only")
        + ")",
        "",
        "| rule | T = 0.3 [95% CI] | p | p (Holm) | T = 1 [95% CI] | p | p (Holm) |",
        "|---|---|---|---|---|---|---|",
    ]
    for rule, by_t in sec["tests"].items():
        a, b = by_t["T0.3"], by_t["T1"]
        lines.append(
            f"| {labelled(rule)} | {interval_text(a)} | {p_text(a.get('p'))} | {p_text(a.get('p_holm'))} | "
            f"{interval_text(b)} | {p_text(b.get('p'))} | {p_text(b.get('p_holm'))} |"
        )
    e, reg = result["entropy"], result["regime"]
    lines += ["", "## Entropy: atr (mask) - clip (min), mean token entropy over the last fifth of training (nats)", ""]
    lines.append(f"{interval_text(e)}, p = {p_text(e and e.get('p'))}" if e else "pending")
    lines += ["", "## Regime check (clip's fraction of tokens acted on; pre-registered floor 1%)", ""]
    if reg.get("runs"):
        lines.append(
            f"{reg['runs']} clip runs: mean {100 * reg['mean']:.2f}%, range {100 * reg['min']:.2f}-"
            f"{100 * reg['max']:.2f}%; {'passes' if reg['passes'] else 'fails'}"
        )
    lines += [
        "",
        "## Every rule, described (runs at T = 1 rows; acted fractions and entropy over all logged steps)",
        "",
        "| rule | seeds | acted % | clipped low % | clipped high % | ratio p05 | ratio p95 | entropy first / last fifth | Mean@8 T = 0.3 | Mean@8 T = 1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def m(entry, key, scale=1.0, spec=".2f"):
        return "-" if key not in entry else format(scale * entry[key]["mean"], spec)

    for rule, entry in result["described"].items():
        seeds = entry["seeds"]
        lines.append(
            f"| {labelled(rule)} | {seeds[0]}-{seeds[-1]} ({len(seeds)}) | {m(entry, 'acted_frac_masked', 100)} | "
            f"{m(entry, 'acted_frac_clipped_low', 100)} | {m(entry, 'acted_frac_clipped_high', 100)} | "
            f"{m(entry, 'acted_ratio_p05', 1, '.3f')} | {m(entry, 'acted_ratio_p95', 1, '.3f')} | "
            f"{m(entry, 'acted_entropy_first_fifth', 1, '.3f')} / {m(entry, 'acted_entropy_last_fifth', 1, '.3f')} | "
            f"{m(entry, 'mean_at_8_T0.3', 1, '.1f')} | {m(entry, 'mean_at_8_T1', 1, '.1f')} |"
        )
    common = result.get("mean_at_8_on_seeds_200_204") or {}
    if common:
        lines += ["", "## Mean@8 of every rule on the same five starts (seeds 200-204)", ""]
        lines += ["| rule | T = 0.3 | T = 1 |", "|---|---|---|"]
        for rule, by_t in common.items():
            lines.append(
                f"| {labelled(rule)} | {by_t.get('T0.3', float('nan')):.1f} | {by_t.get('T1', float('nan')):.1f} |"
            )
    curves = result.get("reward_curves") or {}
    if curves:
        logged = sorted({int(s) for c in curves.values() for s in c})
        steps = sorted({*logged[:2], *logged[2::3], logged[-1]})  # a page-wide selection; the JSON has every step
        lines += ["", "## Training reward by step (mean over each rule's runs; every logged step in analysis.json)", ""]
        lines.append("| rule | " + " | ".join(str(s) for s in steps) + " |")
        lines.append("|---|" + "---|" * len(steps))
        for rule, c in curves.items():
            lines.append(
                f"| {labelled(rule)} | " + " | ".join(f"{c[str(s)]:.3f}" if str(s) in c else "-" for s in steps) + " |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    from atr_llm.cli_types import ReadFile, WriteDir
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=ReadFile(), default=str(TABLE), help="the study's cpu_llm_table.csv")
    ap.add_argument("--out", type=WriteDir(), default=str(OUT), help="folder for analysis.json and analysis.md")
    args = ap.parse_args(argv)
    table, out = Path(args.table), Path(args.out)
    result = analyse(read_table(table), table.with_name("cpu_llm_curves.csv"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "analysis.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "analysis.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
