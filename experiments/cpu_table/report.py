"""The CPU table's outputs: the Markdown tables, the plots, the CSV / JSON files, and reading a written table back
(``--rewrite`` writes a table again from its own rows)."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

from sims._common import png_text_metadata

from .protocol import BENCHMARKS, CPU_RUNS, CURVE_KEYS, TABLE2, protocol_differences, run_form
from .statistics import (
    REFERENCES,
    TAIL_STEPS,
    _of_start,
    _units,
    between_rule_noise,
    comparison_validity,
    curve_tail_differences,
    curve_tails,
    delta_ablation,
    delta_optimum,
    display_name,
    forms_factorial,
    grpo_minus_own_sft,
    mean_of_present,
    outcome_association,
    paired_against_references,
    pairing_key,
    start_labels,
    table_rows,
    where_curves_part,
)


def sampling_label(benchmark: str) -> str:
    """How a benchmark of ``BENCHMARKS`` samples, for a table: "T = 0.3", "T = 1" (shortest form, as the README
    writes it; the benchmark's name when it is not one of them)."""
    sampling = BENCHMARKS.get(benchmark, {})
    return f"T = {sampling['temperature']:g}" if "temperature" in sampling else benchmark


def markdown_tables(rows: list[dict], runs: list[str], k: int) -> str:
    """One ``markdown_table`` per benchmark, each under its own heading, then which SFT models each start
    holds when there is more than one."""
    parts = []
    for benchmark, sampling in BENCHMARKS.items():
        mine = [r for r in rows if r["benchmark"] == benchmark]
        if mine:
            head = f"### {benchmark} ({sampling_label(benchmark)}, top-p {sampling['top_p']})"
            parts.append(f"{head}\n\n{markdown_table(mine, runs, k)}")
    labels = start_labels(rows)
    if any(labels.values()):
        lines = ["### Starts (the SFT models a row started from; only rows of one start are paired)", ""]
        for letter in sorted(set(labels.values())):
            of_start = _of_start(rows, labels, letter)
            models = sorted({(r["seed"], r.get("sft_model")) for r in of_start})
            invocations = sorted({str(r.get("invocation")) for r in of_start})
            machines = sorted({r["sft_machine"] for r in of_start if r.get("sft_machine")})
            listed = ", ".join(f"seed {seed}: {model}" for seed, model in models)
            trained_on = f"trained on: {'; '.join(machines)}; " if machines else ""
            lines.append(f"- **{letter}**: {listed} ({trained_on}written by: {'; '.join(invocations)})")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def markdown_comparison_validity(validity: dict[str, dict], k: int) -> str:
    """The table's first lines: per benchmark, whether a rule comparison counts there (``comparison_validity``):
    clip against its SFT model and against the shuffled-reward control, paired Mean@k with 95% intervals."""
    if not validity:
        return ""
    lines = [f"## Where a rule comparison counts (clip's final Mean@{k} above its SFT model and the shuffled arm)", ""]
    for benchmark, v in validity.items():
        sft = v["reference_minus_sft"]
        control = v["reference_minus_control"]
        sft_text = "no pairs" if sft is None else difference_cell({**sft, "p_holm": 1.0})
        if v["beats_control"] is None:
            control_text = "not run"
        else:
            control_text = "no pairs" if control is None else difference_cell({**control, "p_holm": 1.0})
        missing = [] if v["beats_sft"] else ["its SFT model"]
        if v["beats_control"] is None:
            missing.append("the shuffled arm (not run)")
        elif not v["beats_control"]:
            missing.append("the shuffled arm")
        answer = "counts" if v["counts"] else "does not count: clip does not beat " + " or ".join(missing)
        lines.append(
            f"- **{sampling_label(benchmark)}**: clip - SFT {sft_text}; clip - shuffled {control_text}: {answer}"
        )
    return "\n".join(lines) + "\n\n"


def masks_tokens(run: str) -> bool:
    """Whether ``run``'s method masks or clips tokens at all: a soft gate (sapo) or no clipping has no masked
    fraction to report (its logged ``clip/frac_masked`` is 0 by construction, not a measurement)."""
    from atr_theory.methods import get_method

    spec = CPU_RUNS.get(run)
    if spec is None:  # "sft": no GRPO step
        return False
    return spec.get("form", get_method(spec["method"]).default_form) not in ("soft", "none")


def difference_cell(d: dict, places: int = 1) -> str:
    """A paired difference as a table cell: "mean [low, high]" with ``places`` decimals, then " *" where the 95%
    interval excludes 0 and " †" where its Holm-adjusted p (``p_holm``) is < 0.05."""
    mark = (" *" if d["significant"] else "") + (" †" if d["p_holm"] < 0.05 else "")
    return f"{d['mean']:+.{places}f} [{d['low']:+.{places}f}, {d['high']:+.{places}f}]{mark}"


def markdown_table(rows: list[dict], runs: list[str], k: int) -> str:
    """Means (and standard deviations) over seeds, with paired differences against clip and atr (rows of one
    benchmark); one line per run and start (``start_labels``), paired only within a start ("other start"
    where the reference ran those seeds from other SFT models only; "*" where the 95% interval excludes 0, "†"
    where Holm's adjustment over the table's differences keeps p < 0.05: ``paired_against_references``); the
    masked fraction is "-" for a run that masks nothing by construction (``masks_tokens``)."""
    key, pkey, bkey = f"mean_at_{k}", f"pass_at_{k}", f"best_mean_at_{k}"
    labels = start_labels(rows)

    units = _units(rows, ["sft", *runs], labels)
    paired = paired_against_references(rows, ["sft", *runs], key)

    def fmt(name, ref):
        mine, theirs = units[name], [r for r in rows if r["method"] == ref]
        d = paired[name][ref]
        if d is None:
            same_seed = {r["seed"] for r in mine} & {r["seed"] for r in theirs}
            same_start = {pairing_key(r) for r in mine} & {pairing_key(r) for r in theirs}
            return "other start" if same_seed and not same_start and mine[0]["method"] != ref else "-"
        return difference_cell(d)

    def detectable(name):
        found = [paired[name][ref] for ref in REFERENCES]
        return " / ".join("-" if d is None else f"{d['detectable_80']:.1f}" for d in found)

    lines = [
        f"| run | form | seeds | Mean@{k} final (best) | Pass@{k} final | "
        + "".join(f"Mean@{k}: run - {ref} [95% CI] | " for ref in REFERENCES)
        + f"detectable vs {' / '.join(REFERENCES)} | masked/clipped tokens |",
        "|---|---|---|---|---|" + "---|" * len(REFERENCES) + "---|---|",
    ]
    for name, mine in units.items():
        m, p, b = (mean_of_present([r[x] for r in mine]) for x in (key, pkey, bkey))
        sd = statistics.stdev([r[key] for r in mine]) if len(mine) > 1 else 0.0
        fm = mean_of_present([r["frac_masked_mean"] for r in mine]) if masks_tokens(mine[0]["method"]) else None
        form = run_form(mine[0]["method"]) or "-"
        lines.append(
            f"| {name} | {form} | {len(mine)} | {m:.1f} ± {sd:.1f} ({b:.1f}) | {p:.1f} | "
            + "".join(f"{fmt(name, ref)} | " for ref in REFERENCES)
            + f"{detectable(name)} | "
            + ("-" if fm is None else f"{100 * fm:.2f}%")
            + " |"
        )
    tested = [d for by_ref in paired.values() for d in by_ref.values() if d is not None]
    lines += [
        "",
        "Form: min = the rule's clip inside PPO's min (the paper's Section 2 surrogate); mask = pure clip, w A where the "
        "constraint holds, else the constant A (its Section 4 objective). `atr`, `kl1`, `kl2`, `is-kl3` and the "
        "delta ablation trained the mask form (their rules' default until 2026-11-27), `atr-min` ATR's min form "
        "(`experiments.cpu_table.protocol.run_form`).",
        "",
        f"{len(tested)} paired differences in this table. *: the 95% t interval excludes 0 (one test alone; about "
        f"{len(tested) / 20:.1f} such are expected by chance when no method differs); †: Holm-adjusted p < 0.05 over "
        f"the {len(tested)} (significant for the table as a whole). Detectable: the true difference a paired t test "
        "over these seeds would find (5% level, one test alone) with 80% power, taking the line's observed spread of "
        "the differences as the true one (`experiments.cpu_table.statistics.detectable_difference`); a difference that is not "
        "significant may still be this large.",
    ]
    noise = between_rule_noise(rows, runs, k)
    if noise:
        needed = ", ".join(f"{x} points: {n}" for x, n in noise["seeds_needed_80"].items())
        lines[-1] += (
            f" Pooled over the differences between rules, a paired difference has sd {noise['sd']:.1f} (sum of n - 1: "
            f"{noise['df']}, fewer independent, as lines share runs; a line's own sd rests on its n - 1 alone); seeds "
            f"needed for 80% power at that spread: {needed}."
        )
    return "\n".join(lines) + "\n"


def markdown_delta_optimum(optima: list[dict], k: int) -> str:
    """``delta_optimum`` as a short section ("" when there is nothing to show)."""
    if not optima:
        return ""
    lines = [
        f"### Is delta 0.07 the best delta? (the paper's Fig. 4; `delta_optimum`, Mean@{k})",
        "",
    ]
    for o in optima:
        where = sampling_label(o["benchmark"])
        start = f", start {o['start']}" if o["start"] else ""
        cells = "; ".join(
            f"- {c['delta']:g}: {c['minus_delta']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}] (Holm {_p_value(c['p_holm'])})"
            for c in o["comparisons"]
        )
        peak = o["peak"]
        peak_text = (
            ""
            if peak is None
            else f"; 0.07 - mean of {peak['low_delta']:g} and {peak['high_delta']:g}: {peak['mean']:+.1f} "
            f"[{peak['low']:+.1f}, {peak['high']:+.1f}], p {_p_value(peak['p'])}"
        )
        lines.append(
            f"- {where}{start}: 0.07 {cells}; all above at once: intersection-union p {_p_value(o['iut_p'])}"
            f"{peak_text}; highest mean at delta {o['best_delta']:g}"
        )
    lines += [
        "",
        "0.07 - delta paired over seeds with its 95% t interval; Holm over this line's comparisons; the "
        "intersection-union p (the largest one-sided p of 0.07 - delta > 0) is below 0.05 only when 0.07 beats every "
        "other delta; peak: 0.07 against the mean of the smallest and largest delta, paired.",
    ]
    return "\n".join(lines) + "\n"


def _p_value(p: float) -> str:
    """A p-value for a table: three decimals, or "< 0.001"."""
    return f"{p:.3f}" if p >= 0.001 else "< 0.001"


def markdown_forms_factorial(factorial: dict[str, dict[str, dict]], k: int) -> str:
    """The ``forms_factorial`` effects as one Markdown table (a line per benchmark and effect)."""
    lines = [
        "### The forms as a 2 x 2: ratio range x form of Eq. 5 (clip, clip-mask, atr-min, atr)",
        "",
        f"| benchmark | effect on Mean@{k} | seeds | mean [95% CI] | p | p (Holm over 3) | detectable (80%) |",
        "|---|---|---|---|---|---|---|",
    ]
    for benchmark, effects in factorial.items():
        for name, e in effects.items():
            lines.append(
                f"| {benchmark} | {name} | {e['n']} | {e['mean']:+.1f} [{e['low']:+.1f}, {e['high']:+.1f}] | "
                f"{_p_value(e['p'])} | {_p_value(e['p_holm'])} | {e['detectable_80']:.1f} |"
            )
    lines += [
        "",
        "range: atr's [0.671, 1.422] minus clip's [0.8, 1.2], averaged over the two forms; form: the mask form "
        "(freeze outside the range whatever the advantage's sign) minus PPO's min form, averaged over the two ranges; "
        "interaction: (atr - atr-min) - (clip-mask - clip), the form's effect at atr's range minus at clip's. Each is "
        "a within-seed contrast with a paired t interval (`experiments.cpu_table.statistics.paired_contrast`).",
    ]
    return "\n".join(lines) + "\n"


def markdown_curves_equal(
    parted: dict[str, list[dict]], labels: dict[str, str] | None = None, reference: str = "clip"
) -> str:
    """One line per run of ``where_curves_part`` that equals ``reference`` on at least one start: on how many
    starts (which seeds, with their start letter from ``labels`` where the table has several:
    ``start_labels``) its curves are ``reference``'s bit for bit, and at which step they part on the others.
    "" when no run equals ``reference`` anywhere."""
    labels = labels or {}

    def names(starts: list[dict]) -> str:
        shown = [
            f"{s['seed']} [{labels[s['sft_model']]}]" if labels.get(s["sft_model"]) else str(s["seed"]) for s in starts
        ]
        return f"seed{'s' * (len(shown) > 1)} {', '.join(shown)}"

    lines = []
    for run, starts in parted.items():
        same = [s for s in starts if s["parts_at"] is None]
        if not same:
            continue
        by_step: dict[int, list[dict]] = {}
        for s in starts:
            if s["parts_at"] is not None:
                by_step.setdefault(s["parts_at"], []).append(s)
        elsewhere = "; ".join(f"step {t} ({names(v)})" for t, v in sorted(by_step.items()))
        lines.append(
            f"- {run}: every logged value equals {reference}'s on {len(same)} of {len(starts)} starts ({names(same)}):"
            " the rule never changed an update there"
            + (f"; elsewhere the curves part at {elsewhere}" if elsewhere else "")
        )
    if not lines:
        return ""
    return (
        f"Runs whose training curves equal {reference}'s bit for bit (`where_curves_part`; training on one machine kind"
        " is deterministic, so equal curves mean equal updates; where curves part at logged step t, the first changed"
        " update came no later than step t):\n\n" + "\n".join(lines) + "\n"
    )


def markdown_curve_tails(
    tails: list[dict], runs: list[str], last_steps: int = TAIL_STEPS, paired: dict[str, dict] | None = None
) -> str:
    """Training reward, entropy and completion length where the runs end (``curve_tails``), mean over seeds,
    with the paired differences of reward and entropy against clip and atr (``paired``, by default
    ``curve_tail_differences``; * and † as in ``markdown_table``, Holm over each column family: one
    quantity's differences in this table)."""
    labels = start_labels(tails)
    units = _units(tails, runs, labels)
    paired = curve_tail_differences(tails, runs) if paired is None else paired
    places = {"reward": 3, "entropy": 4, "length": 1, "ratio_max": 3}

    def fmt(name, quantity, ref):
        d = paired[quantity][name][ref]
        return "-" if d is None else difference_cell(d, places[quantity])

    pairs = [(quantity, ref) for ref in REFERENCES for quantity in ("reward", "entropy")]
    lines = [
        f"### Where the runs end: training curves over the last {last_steps} steps",
        "",
        "| run | seeds | reward (T = 1) | entropy (nats) | length (tokens) | max ratio | "
        + " | ".join(f"{quantity}: run - {ref} [95% CI]" for quantity, ref in pairs)
        + " |",
        "|---|---|---|---|---|---|" + "---|" * len(pairs),
    ]
    for name, mine in units.items():
        means = {q: mean_of_present(r[f"{q}_tail"] for r in mine) for q in places}
        lines.append(
            f"| {name} | {len(mine)} | "
            + "".join("- | " if means[q] is None else f"{means[q]:.{places[q]}f} | " for q in places)
            + " | ".join(fmt(name, quantity, ref) for quantity, ref in pairs)
            + " |"
        )
    lines += [
        "",
        f"Each run's mean over its logged points in its last {last_steps} steps, then the mean over seeds; max ratio: "
        "the largest token ratio pi / pi_old of a loss call (`clip/ratio_max`), how far the rule let ratios go in "
        "fact. Differences paired over seeds from the same SFT model. *: the 95% t interval excludes 0; †: "
        "Holm-adjusted p < 0.05 over the column family (one quantity's differences in this table).",
    ]
    return "\n".join(lines) + "\n"


def markdown_outcome_association(association: dict[str, dict[str, dict | None]], k: int) -> str:
    """``outcome_association`` as one line per benchmark and quantity ("" when there is nothing to show)."""
    lines = []
    for benchmark, by_name in association.items():
        where = sampling_label(benchmark)
        for name, a in by_name.items():
            if a is not None:
                lines.append(
                    f"- {where}, {name}: r = {a['r']:+.2f}, slope {a['slope']:+.3g} points per unit "
                    f"[{a['low']:+.3g}, {a['high']:+.3g}], p {_p_value(a['p'])} ({a['n']} runs, {a['starts']} starts"
                    + (
                        f"; {a['copies']} runs equal to another on their start counted once)"
                        if a.get("copies")
                        else ")"
                    )
                )
    if not lines:
        return ""
    return (
        f"Final Mean@{k} against where the runs end, within starts (`outcome_association`: both centred on their "
        "start's mean, a fixed-effects regression over the runs of every rule; exploratory -- rules were not assigned "
        "these quantities, and no correction for choosing among them):\n\n" + "\n".join(lines) + "\n"
    )


def plot_delta_ablation(points: list[dict], k: int, path: Path) -> None:
    """Mean@k against delta per benchmark (log x), with the paired 95% interval of each delta's difference to
    0.07 drawn around delta 0.07's mean (``delta_ablation``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benchmarks = list(dict.fromkeys(p["benchmark"] for p in points))
    fig, axes = plt.subplots(1, len(benchmarks), figsize=(5.5 * len(benchmarks), 4), squeeze=False)
    for ax, benchmark in zip(axes[0], benchmarks):
        for start in sorted({p["start"] for p in points if p["benchmark"] == benchmark}):
            mine = [p for p in points if p["benchmark"] == benchmark and p["start"] == start]
            x = [p["delta"] for p in mine]
            ax.errorbar(
                x,
                [p[f"mean_at_{k}"] for p in mine],
                yerr=[p[f"sd_mean_at_{k}"] for p in mine],
                marker="o",
                capsize=3,
                label=f"start {start}: mean +- sd over seeds" if start else "mean +- sd over seeds",
            )
            ref = next(p[f"mean_at_{k}"] for p in mine if p["run"] == "atr")
            paired = [p for p in mine if p["ci_low"] is not None]
            ax.vlines(
                [p["delta"] for p in paired],
                [ref + p["ci_low"] for p in paired],
                [ref + p["ci_high"] for p in paired],
                colors="gray",
                lw=6,
                alpha=0.35,
                label="0.07's mean + paired 95% CI of the difference",
            )
        ax.set_xscale("log")
        deltas = sorted({p["delta"] for p in points})
        ax.set_xticks(deltas, [f"{d:g}" for d in deltas])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylim(0, 100)  # a percentage: an interval of two seeds can reach past it
        ax.set_xlabel("delta")
        ax.set_ylabel(f"held-out Mean@{k} (%)")
        ax.set_title(benchmark)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=png_text_metadata(fig, 120))
    plt.close(fig)


def plot_curves(results: list[dict], runs: list[str], path: Path) -> None:
    """Training reward, entropy and completion length against the step, mean over seeds (Fig. 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("reward", "training reward (T = 1)"), ("entropy", "entropy (nats)"), ("completions/mean_length", "length")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for run in runs:
        curves = [r["curves"] for r in results if r["run"] == run and r["curves"]]
        if not curves:
            continue
        steps = [c["step"] for c in curves[0]]
        for ax, (key, label) in zip(axes, keys):
            ys = [mean_of_present([cur[i].get(key) for cur in curves if i < len(cur)]) for i in range(len(steps))]
            ax.plot(steps, ys, label=run, lw=2.2 if run == "atr" else 1.2)
            ax.set_xlabel("step")
            ax.set_title(label)
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=png_text_metadata(fig, 120))
    plt.close(fig)


def previous_outputs(
    out: Path, settings: dict, fresh: set[tuple[str, int, str | None]]
) -> tuple[list[dict], list[dict], str]:
    """The rows and training curves already written into ``out`` by an earlier invocation with the same protocol
    (``_PROTOCOL_KEYS``), for the (run, seed, SFT model) triples that are not in ``fresh``; so the table
    accumulates over invocations (also when an earlier ``--runs-dir`` is gone) while a re-run triple replaces its
    old rows, and a run of the same seed from another SFT model (another machine kind) is kept beside it.

    Returns ``(rows, curve_sets, why)``: ``curve_sets`` are ``{"run", "seed", "sft_model", "curves"}`` dicts;
    ``why`` says what was kept or, when nothing is, why (no earlier output, or a different protocol, named)."""
    summary_path, curves_path = out / "cpu_llm_table.json", out / "cpu_llm_curves.csv"
    if not summary_path.exists():
        return [], [], "no earlier table in " + str(out)
    before = json.loads(summary_path.read_text())
    differ = protocol_differences(before.get("settings", {}), settings)
    if differ:
        return [], [], f"earlier table in {out} not kept: its settings differ in {differ}"
    rows = [r for r in before["rows"] if (r["method"], *pairing_key(r)) not in fresh]
    kept = {(r["method"], *pairing_key(r)) for r in rows}
    curves: dict[tuple[str, int, str | None], list[dict]] = {}
    if curves_path.exists():
        with curves_path.open(newline="") as f:
            for point in csv.DictReader(f):
                triple = (point["method"], int(point["seed"]), point.get("sft_model") or None)
                if triple in kept:
                    curves.setdefault(triple, []).append({k: _number_or_none(point.get(k) or "") for k in CURVE_KEYS})
    curve_sets = [{"run": run, "seed": seed, "sft_model": m, "curves": c} for (run, seed, m), c in curves.items()]
    return rows, curve_sets, f"kept {len(kept)} (run, seed, SFT model) triples of the earlier table in {out}"


def read_table(out: Path | str) -> tuple[dict, list[dict], list[dict]]:
    """A written table's ``(summary, rows, curve_sets)``: its ``cpu_llm_table.json`` and, through
    ``previous_outputs``, every row and training curve it holds. Raises when ``out`` has no table."""
    out = Path(out)
    summary_path = out / "cpu_llm_table.json"
    if not summary_path.exists():
        raise FileNotFoundError(f"no cpu table in {out}: {summary_path} is missing")
    summary = json.loads(summary_path.read_text())
    rows, curve_sets, _ = previous_outputs(out, summary["settings"], set())
    return summary, rows, curve_sets


def read_tables_of_one_protocol(
    first: Path | str, second: Path | str
) -> tuple[tuple[dict, list[dict], list[dict]], tuple[dict, list[dict], list[dict]]]:
    """``read_table`` of two tables whose rows may be compared or pooled: raises when their settings differ in a
    ``_PROTOCOL_KEYS`` entry (``protocol_differences``), naming the entries."""
    a, b = read_table(first), read_table(second)
    differ = protocol_differences(a[0]["settings"], b[0]["settings"])
    if differ:
        raise ValueError(f"{first} and {second} were written with different protocols: they differ in {differ}")
    return a, b


def _number_or_none(text: str) -> float | int | None:
    """A CSV cell back to the number ``csv.DictWriter`` wrote (``""`` was None)."""
    if text == "":
        return None
    value = float(text)
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def _table_order(runs: set[str]) -> list[str]:
    """Runs in the order of ``CPU_RUNS`` (Table 2, Table 3, the ablation), unknown names last."""
    known = [r for r in CPU_RUNS if r in runs]
    return known + sorted(runs - set(known))


def write_outputs(
    results: list[dict], settings: dict, out: Path, keep_previous: bool = True, versions: dict | None = None
) -> dict:
    """Write the CSV / Markdown / JSON / curves of ``main`` into ``out``; with ``keep_previous`` the rows of
    earlier invocations with the same protocol stay (``previous_outputs``), and the table covers all of them.
    ``versions``: the library versions to record (default: this process's, ``_versions``)."""
    k = settings["samples"]
    fresh = {(r["run"], r["seed"], r.get("sft_model")) for r in results}
    old_rows, old_curves, why = previous_outputs(out, settings, fresh) if keep_previous else ([], [], "")
    if why:
        print(why)
    rows = old_rows + table_rows(results, k)
    curve_sets = old_curves + [
        {"run": r["run"], "seed": r["seed"], "sft_model": r.get("sft_model"), "curves": r["curves"]} for r in results
    ]
    runs = _table_order({r["method"] for r in rows} - {"sft"})
    labels = start_labels(rows)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "cpu_llm_table.csv").open("w", newline="") as f:
        # every row's keys: rows kept from an older table may lack a newer column (sft_machine), left empty there
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(key for r in rows for key in r)))
        w.writeheader()
        w.writerows(sorted(rows, key=lambda r: (r["method"], r["seed"], r["benchmark"], str(r.get("sft_model")))))
    with (out / "cpu_llm_curves.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["method", "seed", "sft_model", *CURVE_KEYS])
        w.writeheader()
        for r in sorted(curve_sets, key=lambda r: (r["run"], r["seed"], str(r.get("sft_model")))):
            for c in r["curves"]:
                w.writerow({"method": r["run"], "seed": r["seed"], "sft_model": r.get("sft_model"), **c})
    validity = comparison_validity(rows, k)
    md = markdown_comparison_validity(validity, k) + markdown_tables(rows, runs, k)
    factorial = forms_factorial(rows, k)
    if factorial:
        md += "\n" + markdown_forms_factorial(factorial, k)
    tails = curve_tails(rows, curve_sets)
    tail_differences = curve_tail_differences(tails, runs)
    if tails:
        md += "\n" + markdown_curve_tails(tails, runs, paired=tail_differences)
    association = outcome_association(rows, tails, k)
    association_lines = markdown_outcome_association(association, k)
    if association_lines:
        md += "\n" + association_lines
    parted = where_curves_part(curve_sets, runs)
    equal_lines = markdown_curves_equal(parted, labels)
    if equal_lines:
        md += "\n" + equal_lines
    optima = delta_optimum(rows, k)
    if optima:
        md += "\n" + markdown_delta_optimum(optima, k)
    (out / "cpu_llm_table.md").write_text(md)
    named = [{**c, "run": display_name({"method": c["run"], **c}, labels)} for c in curve_sets]
    shown = list(_units(rows, TABLE2 if set(TABLE2) <= set(runs) else runs, labels))
    plot_curves(named, shown, out / "cpu_llm_curves.png")
    ablation = delta_ablation(rows, k)
    if ablation:
        with (out / "cpu_llm_delta_ablation.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(ablation[0]))
            w.writeheader()
            w.writerows(ablation)
        plot_delta_ablation(ablation, k, out / "cpu_llm_delta_ablation.png")
    paired = {
        benchmark: paired_against_references(
            [r for r in rows if r["benchmark"] == benchmark], ["sft", *runs], f"mean_at_{k}"
        )
        for benchmark in BENCHMARKS
    }
    seeds = sorted({r["seed"] for r in rows})
    summary = {
        # a rewrite (no results) keeps the invocation that trained the rows
        "settings": {
            **settings,
            "runs": runs,
            "seeds": seeds,
            "this_invocation": sorted(map(list, fresh)) if results else settings.get("this_invocation", []),
        },
        "versions": versions or _versions(),
        "paired_mean_at_k": paired,
        "between_rule_noise": {
            benchmark: between_rule_noise([r for r in rows if r["benchmark"] == benchmark], runs, k)
            for benchmark in BENCHMARKS
        },
        "delta_ablation": ablation,
        "delta_optimum": optima,
        "forms_factorial": factorial,
        "curve_tails": {
            "last_steps": TAIL_STEPS,
            "paired": tail_differences,
            "rows": tails,
        },
        "outcome_association": association,
        "curves_part_from_clip": parted,
        "grpo_minus_own_sft": grpo_minus_own_sft(rows, k),
        "comparison_validity": validity,
        "rows": rows,
    }
    (out / "cpu_llm_table.json").write_text(json.dumps(summary, indent=1))
    return summary


def rewrite_outputs(out: Path) -> dict:
    """Write ``out``'s table again from its own rows and curves (``cpu_llm_table.json``, ``cpu_llm_curves.csv``),
    training and evaluating nothing: for when the table's statistics or layout change after its runs are gone.
    Settings and library versions stay those of the invocations that trained the rows."""
    summary_path = out / "cpu_llm_table.json"
    if not summary_path.exists():
        raise FileNotFoundError(f"--rewrite: no table to rewrite in {out} (expected {summary_path})")
    before = json.loads(summary_path.read_text())
    settings = {k: v for k, v in before["settings"].items() if k not in ("runs", "seeds")}
    return write_outputs([], settings, out, keep_previous=True, versions=before.get("versions"))


def _versions() -> dict:
    import platform

    import torch
    import transformers
    import trl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
    }
