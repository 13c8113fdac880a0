"""The mask-mechanism study's part 1, reuse dose-response (docs/experiments/mask-mechanism-preregistration.md),
computed from its committed files: nothing here trains or evaluates, and nothing is chosen after seeing the data.

- **Per-step record** (``--runs D<depth>=<runs folder>``, read once from the runs' ``log_history.json``): every
  logged row of every run at every reuse depth D into ``by_step.csv``, so the timing question can be answered from
  the repository without the runs folders.
- **Where the forms part**: at each D, the paired form gap ``clip - clip-mask`` in held-out Mean@8 at step 400 over
  seeds 200-202 with its 95% t-interval (2 degrees of freedom, no correction); the answer is the smallest D whose
  interval lies above 0 at T = 0.3, and whether every larger D's interval does too (``ordered``).
- **Does the fraction against precede the collapse**: per mask-form run, r* is the first logged step whose training
  reward is below half the mean of the run's first two reward rows, a* the first logged step whose
  ``clip/frac_outside_against_advantage`` is at least 0.01 and at least twice the median of the run's first three
  rows that logged it; counted over the collapsing runs of every D as a* < r*, a* = r*, a* > r*, and a* never.
- **Checks**: at D = 1 the two forms' runs are the same bit for bit (every logged row and both Mean@8).
- **Described, not tested**: each form's fraction against and with the advantage, mean true KL and its mean against
  the advantage, per D; and the fraction against in each run's first logged row beside the min form's.

    python -m experiments.mask_mechanism_analysis [--runs D1=runs/mask_mechanism/D1 --runs D32=runs/mask_mechanism ...]

writes, in ``figures/experiments/mask_mechanism/``: ``by_step.csv`` (only with ``--runs``), ``dose_response.csv``
(one row per D, form and seed), ``analysis.{json,md}`` and ``by_step.png`` (reward and fraction against by step, per D).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from pathlib import Path

from experiments.cpu_table.statistics import mean_of_present, paired_difference
from experiments.trust_region_analysis import TEMPERATURES, interval_text, read_table, rows_of
from sims._common import png_text_metadata

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "figures" / "experiments" / "mask_mechanism"
BANDIT = ROOT / "figures" / "paper" / "contextual_bandit.json"
PREREGISTRATION = "docs/experiments/mask-mechanism-preregistration.md"
RUNS = ("clip", "clip-mask")
FORMS = {"clip": "min", "clip-mask": "mask"}
"""Run name -> the form of the clip at epsilon 0.2 it trains."""
SEEDS = (200, 201, 202)
DEPTHS = (1, 4, 8, 16, 32)
"""The pre-registered reuse depths: optimizer steps per generated batch (steps_per_generation x num_iterations)."""
AGAINST = "clip/frac_outside_against_advantage"
KEYS = (
    "reward",
    AGAINST,
    "clip/frac_outside_with_advantage",
    "clip/frac_masked",
    "true_kl/mean",
    "true_kl/mean_against_advantage",
    "entropy",
)
REWARD_FALL = 0.5
"""r*: the reward below this fraction of the mean of the run's first two reward rows."""
AGAINST_FLOOR, AGAINST_RISE = 0.01, 2.0
"""a*: the fraction against at least AGAINST_FLOOR and at least AGAINST_RISE x the median of its first three rows."""
DESCRIBED = (
    "train_reward_last",
    "acted_frac_outside_against_advantage",
    "acted_frac_outside_with_advantage",
    "acted_frac_masked",
    "acted_true_kl_mean",
    "acted_true_kl_mean_against_advantage",
)


def by_step(runs_dirs: dict[int, Path]) -> list[dict]:
    """One row per logged step (a row of TRL's ``log_history`` with a ``step`` and one of ``KEYS``) of each run
    ``<runs_dir>/<run>-s<seed>/log_history.json`` (run in ``RUNS``), by depth, run, seed and step."""
    rows = []
    for depth, runs_dir in sorted(runs_dirs.items()):
        for path in sorted(Path(runs_dir).glob("*/log_history.json")):
            m = re.fullmatch(r"(.+)-s(\d+)", path.parent.name)
            if not m or m.group(1) not in RUNS:
                continue
            for h in json.loads(path.read_text()):
                if "step" in h and any(k in h for k in KEYS):
                    row = {"depth": depth, "run": m.group(1), "seed": int(m.group(2)), "step": h["step"]}
                    rows.append(row | {k: h.get(k) for k in KEYS})
    return rows


def write_csv(rows: list[dict], out: Path, fields: list[str]) -> Path:
    """``rows`` into the CSV ``out`` with the columns ``fields`` (``by_step.csv``, ``dose_response.csv``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return out


def read_by_step(path: Path) -> list[dict]:
    """``by_step.csv`` back: depth, seed and step as ints, every key of ``KEYS`` a float or None (not logged)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["depth"], r["seed"], r["step"] = int(r["depth"]), int(r["seed"]), int(r["step"])
        for k in KEYS:
            r[k] = float(r[k]) if r.get(k) not in (None, "") else None
    return rows


def read_tables(folder: Path) -> dict[int, list[dict]]:
    """Each depth's table ``<folder>/D<depth>/cpu_llm_table.csv`` (written by ``experiments.cpu_table``), by depth."""
    tables = {}
    for path in sorted(folder.glob("D*/cpu_llm_table.csv")):
        if path.parent.name[1:].isdigit():
            tables[int(path.parent.name[1:])] = read_table(path, argument="--out")
    return tables


def series(rows: list[dict], depth: int, run: str, seed: int, key: str) -> list[tuple[int, float]]:
    """(step, value) of one run's logged rows that logged ``key``, by step."""
    return sorted(
        (r["step"], r[key])
        for r in rows
        if (r["depth"], r["run"], r["seed"]) == (depth, run, seed) and r[key] is not None
    )


def first_collapse(rewards: list[tuple[int, float]], fall: float = REWARD_FALL) -> int | None:
    """r*: the first logged step whose reward is below ``fall`` x the mean of the first two logged rewards (None:
    the run does not collapse, or logged fewer than two rewards)."""
    if len(rewards) < 2:
        return None
    floor = fall * (rewards[0][1] + rewards[1][1]) / 2
    return next((step for step, r in rewards if r < floor), None)


def first_rise(
    fractions: list[tuple[int, float]],
    floor: float = AGAINST_FLOOR,
    rise: float = AGAINST_RISE,
    after_start: bool = False,
) -> int | None:
    """a*: the first logged step whose fraction against the advantage is at least ``floor`` and at least ``rise`` x
    the median of the first three logged fractions (None: it never is, or fewer than three rows logged it).

    Two readings of the pre-registration's "first logged step": any row (``after_start=False``, the literal one: a
    first row above twice the median of the first three is a* at once), or only the rows after the three that
    define the start (``after_start=True``: a rise *from* the start)."""
    if len(fractions) < 3:
        return None
    start = statistics.median(f for _, f in fractions[:3])
    candidates = fractions[3:] if after_start else fractions
    return next((step for step, f in candidates if f >= floor and f >= rise * start), None)


def timing(rows: list[dict], after_start: bool = False) -> dict:
    """r* and a* of every mask-form run, and the pre-registered counts over the collapsing ones: ``before``
    (a* < r*: at least one logged row earlier), ``same`` (a* = r*), ``after`` (a* > r*) and ``never`` (a* does not
    exist: a case the pre-registration did not name). Answer "yes" if a* < r* in every collapsing run, "no" if in
    none (with no collapsing run: "no run collapsed"). ``after_start``: the reading of a* (``first_rise``)."""
    runs = []
    for depth, run, seed in sorted({(r["depth"], r["run"], r["seed"]) for r in rows}):
        r_star = first_collapse(series(rows, depth, run, seed, "reward"))
        a_star = first_rise(series(rows, depth, run, seed, AGAINST), after_start=after_start)
        runs.append({"depth": depth, "run": run, "form": FORMS[run], "seed": seed, "r_star": r_star, "a_star": a_star})
    collapsing = [x for x in runs if x["form"] == "mask" and x["r_star"] is not None]
    counts = {
        "before": sum(x["a_star"] is not None and x["a_star"] < x["r_star"] for x in collapsing),
        "same": sum(x["a_star"] == x["r_star"] for x in collapsing),
        "after": sum(x["a_star"] is not None and x["a_star"] > x["r_star"] for x in collapsing),
        "never": sum(x["a_star"] is None for x in collapsing),
    }
    if not collapsing:
        answer = "no run collapsed"
    elif counts["before"] == len(collapsing):
        answer = "yes"
    elif counts["before"] == 0:
        answer = "no"
    else:
        answer = "mixed: see counts"
    return {
        "collapsing_mask_runs": len(collapsing),
        "mask_runs": sum(x["form"] == "mask" for x in runs),
        "collapsing_min_runs": sum(x["form"] == "min" and x["r_star"] is not None for x in runs),
        "counts": counts,
        "answer": answer,
        "runs": runs,
    }


def first_rows(rows: list[dict]) -> dict[str, dict]:
    """Described: per D and form, the mean over seeds of the fraction against the advantage in each run's first
    logged row, and the mean and the largest value over the rows logged before the run's second reward row (at
    D = 16 and 32, where the reward is logged once per generated batch: the rows of the first batch, before a reward
    of the updated policy is seen; where it is logged every row, the first row alone)."""
    out: dict[str, dict] = {}
    for depth in sorted({r["depth"] for r in rows}):
        for run in RUNS:
            first, batch, peak = [], [], []
            for seed in sorted({r["seed"] for r in rows if (r["depth"], r["run"]) == (depth, run)}):
                fractions = series(rows, depth, run, seed, AGAINST)
                rewards = series(rows, depth, run, seed, "reward")
                if not fractions:
                    continue
                first.append(fractions[0][1])
                second_reward = rewards[1][0] if len(rewards) > 1 else None
                before = [f for s, f in fractions if second_reward is None or s < second_reward]
                batch.append(statistics.fmean(before))
                peak.append(max(before))
            out.setdefault(f"D{depth}", {})[FORMS[run]] = {
                "first_row_mean": mean_of_present(first),
                "first_batch_mean": mean_of_present(batch),
                "first_batch_peak": mean_of_present(peak),
                "seeds": len(first),
            }
    return out


def form_gaps(tables: dict[int, list[dict]]) -> dict[str, dict[str, dict | None]]:
    """Per temperature and D: ``paired_difference`` of ``clip - clip-mask`` in Mean@8 at step 400 over ``SEEDS``
    (mean, 95% t-interval with n - 1 degrees of freedom, p; None with fewer than 2 pairs)."""
    return {
        t: {
            f"D{d}": paired_difference(rows_of(rows, b, SEEDS), "clip", "clip-mask", "mean_at_8")
            for d, rows in sorted(tables.items())
        }
        for t, b in TEMPERATURES.items()
    }


def where_forms_part(gaps: dict[str, dict | None]) -> dict:
    """The smallest D whose gap interval lies above 0 (None if none does), the Ds that do, and ``ordered``: every
    D at or above that one parts and none below it does (the pre-registration's "intervals ordered in D")."""
    depths = sorted(int(k[1:]) for k in gaps)
    parted = [d for d in depths if gaps[f"D{d}"] is not None and gaps[f"D{d}"]["low"] > 0]
    smallest = parted[0] if parted else None
    ordered = smallest is not None and parted == [d for d in depths if d >= smallest]
    return {"depth": smallest, "parted": parted, "ordered": ordered, "depths": depths}


def identical_at_depth_one(tables: dict[int, list[dict]], rows: list[dict]) -> dict | None:
    """The D = 1 check: the two forms' logged rows (every key of ``KEYS``) and Mean@8 at both temperatures equal,
    seed by seed (None if D = 1 has not run)."""
    if 1 not in tables:
        return None
    seeds = sorted({r["seed"] for r in tables[1]})

    def logged(run: str, seed: int) -> list[tuple]:
        return sorted(
            (r["step"], *(r[k] for k in KEYS)) for r in rows if (r["depth"], r["run"], r["seed"]) == (1, run, seed)
        )

    def mean8(run: str, seed: int) -> list[float]:
        return sorted((r["benchmark"], r["mean_at_8"]) for r in tables[1] if (r["method"], r["seed"]) == (run, seed))

    same_rows = [bool(logged("clip", s)) and logged("clip", s) == logged("clip-mask", s) for s in seeds]
    same_mean = [mean8("clip", s) == mean8("clip-mask", s) for s in seeds]
    return {"seeds": seeds, "logged_rows_identical": all(same_rows), "mean_at_8_identical": all(same_mean)}


EARLIER_TABLES = {
    "range_form": ROOT / "figures" / "experiments" / "range_form" / "table" / "cpu_llm_table.csv",
    "trust_region": ROOT / "figures" / "experiments" / "trust_region" / "table" / "cpu_llm_table.csv",
}
"""The studies that ran ``clip`` (and, for the range x form study, ``clip-mask``) at D = 32 on seeds 200-202."""


def depth_32_check(tables: dict[int, list[dict]], earlier: dict[str, Path] = EARLIER_TABLES) -> dict | None:
    """The D = 32 check: per earlier study, over the (run, seed, temperature) rows both hold, how many started from
    the same SFT model (``sft_model``) and how many end at the same Mean@8 and last training reward bit for bit."""
    if 32 not in tables:
        return None
    out = {}
    for name, path in earlier.items():
        if not path.is_file():
            continue
        then = {(r["method"], r["seed"], r["benchmark"]): r for r in read_table(path)}
        pairs = [
            (r, then[k])
            for r in tables[32]
            if (k := (r["method"], r["seed"], r["benchmark"])) in then and r["method"] in RUNS
        ]
        out[name] = {
            "rows": len(pairs),
            "runs": sorted({f"{r['method']}-s{r['seed']}" for r, _ in pairs}),
            "same_sft_model": sum(r["sft_model"] == e["sft_model"] for r, e in pairs),
            "same_mean_at_8": sum(r["mean_at_8"] == e["mean_at_8"] for r, e in pairs),
            "same_train_reward_last": sum(r["train_reward_last"] == e["train_reward_last"] for r, e in pairs),
            "machines": sorted({e["sft_machine"] or "-" for _, e in pairs}),
        }
    return out


def dose_response(tables: dict[int, list[dict]]) -> list[dict]:
    """One row per D, form and seed: Mean@8 at step 400 at each temperature and the ``DESCRIBED`` columns."""
    out = []
    for depth, rows in sorted(tables.items()):
        for run in RUNS:
            for seed in sorted({r["seed"] for r in rows if r["method"] == run}):
                mine = {r["benchmark"]: r for r in rows if (r["method"], r["seed"]) == (run, seed)}
                any_row = next(iter(mine.values()))
                row = {"depth": depth, "run": run, "form": FORMS[run], "seed": seed}
                row |= {f"mean_at_8_{t}": mine[b]["mean_at_8"] if b in mine else None for t, b in TEMPERATURES.items()}
                out.append(row | {k: any_row.get(k) for k in DESCRIBED})
    return out


def sft_means(tables: dict[int, list[dict]]) -> dict:
    """The start models' Mean@8 (the ``sft`` rows, the same models at every D) per temperature: the mean over seeds,
    and whether every D's table holds the same SFT models (``sft_model``) with the same Mean@8."""
    per_depth = {
        d: sorted((r["seed"], r["benchmark"], r["sft_model"], r["mean_at_8"]) for r in rows if r["method"] == "sft")
        for d, rows in tables.items()
    }
    first = next(iter(per_depth.values()), [])
    return {
        "same_at_every_depth": all(v == first for v in per_depth.values()),
        **{
            f"mean_at_8_{t}": mean_of_present(m for _, bench, _, m in first if bench == b)
            for t, b in TEMPERATURES.items()
        },
    }


def described(dose: list[dict]) -> dict[str, dict]:
    """Per D and form, the mean over seeds of each ``DESCRIBED`` column and of Mean@8."""
    keys = (*(f"mean_at_8_{t}" for t in TEMPERATURES), *DESCRIBED)
    out: dict[str, dict] = {}
    for depth in sorted({r["depth"] for r in dose}):
        for form in ("min", "mask"):
            mine = [r for r in dose if (r["depth"], r["form"]) == (depth, form)]
            out.setdefault(f"D{depth}", {})[form] = {k: mean_of_present(r[k] for r in mine) for k in keys} | {
                "seeds": len(mine)
            }
    return out


def bandit(path: Path) -> dict | None:
    """Part 2's answer as ``sims.contextual_bandit`` wrote it (None if it has not run)."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return {"file": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path), **data["answer"]}


def analyse(tables: dict[int, list[dict]], rows: list[dict], bandit_path: Path = BANDIT) -> dict:
    gaps = form_gaps(tables)
    dose = dose_response(tables)
    return {
        "preregistration": PREREGISTRATION,
        "seeds": list(SEEDS),
        "depths_run": sorted(tables),
        "depths_not_run": [d for d in DEPTHS if d not in tables],
        "form_gap": gaps,
        "forms_part": {t: where_forms_part(g) for t, g in gaps.items()},
        "depth_one_check": identical_at_depth_one(tables, rows),
        "depth_32_check": depth_32_check(tables),
        "timing": timing(rows),
        "timing_a_star_after_its_start_rows": timing(rows, after_start=True),
        "sft": sft_means(tables),
        "first_rows": first_rows(rows),
        "described": described(dose),
        "bandit": bandit(bandit_path),
    }


def markdown(result: dict) -> str:
    """The tables the study page quotes: the form gap per D, the timing per mask-form run, each form by D."""
    lines = [
        "# Mask-mechanism study, part 1: the pre-registered answers",
        "",
        "Written by `python -m experiments.mask_mechanism_analysis` from the depth tables and `by_step.csv`. "
        "`clip` is PPO's clip (epsilon 0.2) in the min form, `clip-mask` the same clip in the mask form; D is the "
        "number of optimizer steps each generated batch serves.",
        "",
        "## The form gap `clip - clip-mask` in held-out Mean@8 at step 400 (points; 95% t-interval, 2 df)",
        "",
        "| D | T = 0.3 | T = 1 | above 0 at T = 0.3 |",
        "|---|---|---|---|",
    ]
    parted = result["forms_part"]["T0.3"]["parted"]
    for depth in result["depths_run"]:
        cells = [interval_text(result["form_gap"][t][f"D{depth}"], "+.1f") for t in TEMPERATURES]
        lines.append(f"| {depth} | {cells[0]} | {cells[1]} | {'yes' if depth in parted else 'no'} |")
    t = result["timing"]
    lines += [
        "",
        f"## Does the fraction against precede the collapse? (`r*`: reward below {REWARD_FALL:g} x its start; `a*`: the "
        f"fraction against >= {AGAINST_FLOOR:g} and >= {AGAINST_RISE:g} x its start)",
        "",
        "| D | seed | `r*` (mask form) | `a*` (mask form) | where `a*` falls |",
        "|---|---|---|---|---|",
    ]
    for x in t["runs"]:
        if x["form"] != "mask":
            continue
        if x["r_star"] is None:
            where = "no collapse"
        elif x["a_star"] is None:
            where = "`a*` never"
        else:
            where = "before" if x["a_star"] < x["r_star"] else "same row" if x["a_star"] == x["r_star"] else "after"
        lines.append(f"| {x['depth']} | {x['seed']} | {x['r_star'] or '-'} | {x['a_star'] or '-'} | {where} |")
    c = t["counts"]
    t2 = result["timing_a_star_after_its_start_rows"]
    c2 = t2["counts"]
    lines += [
        "",
        f"Collapsing mask-form runs: {t['collapsing_mask_runs']} of {t['mask_runs']} (min form: "
        f"{t['collapsing_min_runs']}); `a*` before `r*` in {c['before']}, in the same row in {c['same']}, after in "
        f"{c['after']}, never in {c['never']}: **{t['answer']}**. Read as a rise after the three rows that set its start, "
        f"`a*` comes before `r*` in {c2['before']}, in the same row in {c2['same']}, after in {c2['after']}, never in "
        f"{c2['never']}: **{t2['answer']}**.",
        "",
        "## Each form by D (mean over seeds; described, not tested)",
        "",
        "| D | form | Mean@8 T = 0.3 | Mean@8 T = 1 | last reward | outside against A | outside with A | "
        "against A, first row | true KL mean | true KL against A |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, by in result["described"].items():
        for form, d in by.items():
            first = result["first_rows"].get(key, {}).get(form, {}).get("first_row_mean")

            def f(k, spec=".3g"):
                return "-" if d.get(k) is None else format(d[k], spec)

            lines.append(
                f"| {key[1:]} | {form} | {f('mean_at_8_T0.3', '.1f')} | {f('mean_at_8_T1', '.1f')} | "
                f"{f('train_reward_last')} | {f('acted_frac_outside_against_advantage', '.2%')} | "
                f"{f('acted_frac_outside_with_advantage', '.2%')} | {'-' if first is None else format(first, '.2%')} | "
                f"{f('acted_true_kl_mean')} | {f('acted_true_kl_mean_against_advantage')} |"
            )
    return "\n".join(lines) + "\n"


def plot_by_step(rows: list[dict], path: Path) -> None:
    """Per D (columns): the training reward and the fraction of tokens outside the range against their advantage
    by step, each form's mean over its seeds (thin lines: each seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = sorted({r["depth"] for r in rows})
    fig, axes = plt.subplots(2, len(depths), figsize=(3.0 * len(depths), 5.4), sharey="row", squeeze=False)
    colours = {"clip": "tab:blue", "clip-mask": "tab:red"}
    for col, depth in enumerate(depths):
        for row_index, key in enumerate(("reward", AGAINST)):
            ax = axes[row_index][col]
            for run in RUNS:
                seeds = sorted({r["seed"] for r in rows if (r["depth"], r["run"]) == (depth, run)})
                per_seed = [dict(series(rows, depth, run, s, key)) for s in seeds]
                for values in per_seed:
                    ax.plot(list(values), list(values.values()), color=colours[run], lw=0.5, alpha=0.35)
                steps = sorted(set.intersection(*(set(v) for v in per_seed))) if per_seed else []
                mean = [statistics.fmean(v[s] for v in per_seed) for s in steps]
                label = f"clip, {FORMS[run]} form ({run})" if (row_index, col) == (0, 0) else None
                ax.plot(steps, mean, color=colours[run], lw=1.6, ls="-" if FORMS[run] == "min" else "--", label=label)
            if row_index == 0:
                ax.set_title(f"D = {depth} steps per batch", fontsize=9)
            ax.set_xlabel("GRPO step", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("training reward (T = 1)", fontsize=8)
    axes[1][0].set_ylabel("fraction outside, against A", fontsize=8)
    fig.legend(loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=150, metadata=png_text_metadata(fig, 150))
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    from atr_llm.cli_types import Text, WriteDir
    from atr_llm.command_line import Parser, refuse

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--runs",
        type=Text(),
        action="append",
        default=[],
        metavar="D=DIR",
        help="D<depth>=<runs folder>: rewrite by_step.csv",
    )
    ap.add_argument("--out", type=WriteDir(), default=str(OUT), help="the study's folder (D<depth>/ tables inside)")
    args = ap.parse_args(argv)
    runs_dirs = {}
    for item in args.runs:
        depth, _, folder = item.partition("=")
        if not (depth.startswith("D") and depth[1:].isdigit() and folder):
            raise refuse("--runs", item, "D<depth>=<runs folder>, e.g. D32=runs/mask_mechanism")
        if not Path(folder).is_dir():
            raise refuse("--runs", item, f"{folder} is not a folder")
        runs_dirs[int(depth[1:])] = Path(folder)
    out = Path(args.out)
    tables = read_tables(out)
    if not tables:
        raise refuse("--out", str(out), "no D<depth>/cpu_llm_table.csv inside: run the study's depths first")
    if runs_dirs:
        write_csv(by_step(runs_dirs), out / "by_step.csv", ["depth", "run", "seed", "step", *KEYS])
    if not (out / "by_step.csv").is_file():
        raise refuse("--out", str(out), "no by_step.csv inside: give the runs folders with --runs D<depth>=<folder>")
    rows = read_by_step(out / "by_step.csv")
    result = analyse(tables, rows)
    dose = dose_response(tables)
    write_csv(dose, out / "dose_response.csv", list(dose[0]))
    (out / "analysis.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "analysis.md").write_text(markdown(result))
    plot_by_step(rows, out / "by_step.png")
    print(
        json.dumps(
            {k: result[k] for k in ("forms_part", "depth_one_check")} | {"timing": result["timing"]["counts"]}, indent=1
        )
    )
    return result


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
