"""The CPU table's statistics: rows from results, paired differences over seeds with t intervals, Holm's adjustment,
paired-t power, the 2 x 2 factorial of Eq. 5's form and the ratio range, curve tails, and where curves part."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from .protocol import ABLATION_DELTAS, BENCHMARKS, CURVE_KEYS, DELTA_ABLATION


def table_rows(results: list[dict], k: int) -> list[dict]:
    """One row per run x seed x benchmark: final and best Mean@k / Pass@k and the last logged training values."""
    rows = []
    for r in results:
        by_step = {int(s): v for s, v in r["evals"].items()}
        last = r["curves"][-1] if r["curves"] else {}
        for benchmark in BENCHMARKS:
            evals = {s: v[benchmark] for s, v in by_step.items()}
            rows.append(_table_row(r, benchmark, evals, last, k))
    return rows


def _table_row(r: dict, benchmark: str, evals: dict[int, dict], last: dict, k: int) -> dict:
    final_step = max(evals)
    best_step = max(evals, key=lambda s: (evals[s][f"mean@{k}"], s))
    return {
        "method": r["run"],
        "seed": r["seed"],
        "benchmark": benchmark,
        "sft_model": r.get("sft_model"),
        "sft_machine": r.get("sft_machine"),
        "invocation": r.get("invocation"),
        f"mean_at_{k}": round(evals[final_step][f"mean@{k}"], 3),
        f"pass_at_{k}": round(evals[final_step][f"pass@{k}"], 3),
        f"best_mean_at_{k}": round(evals[best_step][f"mean@{k}"], 3),
        f"best_pass_at_{k}": round(max(v[f"pass@{k}"] for v in evals.values()), 3),
        "best_step": best_step,
        "final_step": final_step,
        "problems": evals[final_step]["problems"],
        "train_reward_last": last.get("reward"),
        "entropy_last": last.get("entropy"),
        "length_last": last.get("completions/mean_length"),
        "frac_masked_mean": mean_of_present([c.get("clip/frac_masked") for c in r["curves"]]),
        **acted_columns(r.get("acted")),
    }


def acted_columns(acted: dict | None) -> dict:
    """A run's ``acted`` summary (``protocol.acted_summary``: over every logged row, also those that log no reward)
    as table columns ``acted_<name>``; {} for runs written before it was recorded."""
    if not acted:
        return {}
    return {
        "acted_" + key.removeprefix("clip/").replace("/", "_"): value
        for key, value in acted.items()
        if key != "logged_steps"
    }


def mean_of_present(xs: Iterable[float | None]) -> float | None:
    """Mean of the values that are not None (None if there are none)."""
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def paired_difference(rows: list[dict], run: str, reference: str, key: str) -> dict | None:
    """Mean over pairs of ``key``(run) - ``key``(reference) on the same seed started from the same SFT model
    (``sft_model``; same data order) and its 95% Student-t interval; ``significant`` when the interval excludes 0.
    None with < 2 pairs: rows of one seed that started from different SFT models are never paired.
    The contrast {run: +1, reference: -1} of ``paired_contrast``."""
    if run == reference:
        return None
    return paired_contrast(rows, {run: 1.0, reference: -1.0}, key)


def contrast_values(rows: list[dict], weights: dict[str, float], key: str) -> list[float]:
    """The per-start values c = sum over runs of weight * ``key``(run) of ``paired_contrast``, one per start (seed
    and SFT model, ``pairing_key``) that every run of ``weights`` has with ``key`` logged, in the starts' order.
    Rows of one benchmark only."""
    benchmarks = {r.get("benchmark") for r in rows}
    if len(benchmarks) > 1:
        raise ValueError(f"paired statistics need the rows of one benchmark, got {sorted(map(str, benchmarks))}")
    by = {(r["method"], pairing_key(r)): r[key] for r in rows if r.get(key) is not None}  # a value not logged: no pair
    shared = set.intersection(*({s for name, s in by if name == run} for run in weights)) if weights else set()
    return [sum(w * by[(run, start)] for run, w in weights.items()) for start in sorted(shared, key=str)]


def paired_contrast(rows: list[dict], weights: dict[str, float], key: str) -> dict | None:
    """A within-seed contrast of runs: on every start (seed and SFT model, ``pairing_key``) that all runs of
    ``weights`` share, c = sum over runs of weight * ``key``(run); the mean of c over starts with its 95% Student-t
    interval (n - 1 degrees of freedom), two-sided p, ``significant`` when the interval excludes 0, the sd of c and
    the difference detectable with 80% power (``detectable_difference``). Rows of one benchmark only. None with
    < 2 shared starts; a start where some run lacks ``key`` (None: e.g. a curve that did not log it) is left out.
    A difference of two runs is {run: +1, reference: -1}; an interaction of a 2 x 2 design
    (a1b1 - a1b0 - a0b1 + a0b0) is the one-sample t test of a repeated-measures ANOVA's interaction (t^2 = F)."""
    from scipy import stats

    d = contrast_values(rows, weights, key)
    if len(d) < 2:
        return None
    n, mean, sd = len(d), statistics.fmean(d), statistics.stdev(d)
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    if sd > 0:
        p = float(2 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
    else:  # every start gives the same contrast: certain if it is not 0
        p = 0.0 if mean != 0 else 1.0
    return {
        "mean": mean,
        "low": mean - half,
        "high": mean + half,
        "n": n,
        "p": p,
        "significant": bool(half < abs(mean)),
        "sd": sd,
        "detectable_80": detectable_difference(sd, n),
    }


def paired_t_power(difference: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t test at level ``alpha`` with ``n`` pairs whose differences have standard
    deviation ``sd``, when the true mean difference is ``difference``: with df = n - 1, the noncentrality
    nc = difference sqrt(n) / sd and the critical value c = t_{1 - alpha/2, df},
    power = P(T' > c) + P(T' < -c) for T' ~ noncentral t(df, nc) (e.g. Cohen 1988, ch. 2)."""
    from scipy import stats

    if n < 2 or not sd > 0:
        raise ValueError(f"paired_t_power needs n >= 2 pairs and sd > 0, got n = {n}, sd = {sd}")
    df, nc = n - 1, difference * math.sqrt(n) / sd
    c = float(stats.t.ppf(1 - alpha / 2, df))
    # P(T' < -c) written as P(T'' > c) for T'' ~ noncentral t(df, -nc): the same number, and scipy 1.17's
    # nct.cdf returns NaN for it at df = 1 and nc ~ 8 where nct.sf does not
    return float(stats.nct.sf(c, df, nc) + stats.nct.sf(c, df, -nc))


def detectable_difference(sd: float, n: int, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest true mean difference that a two-sided paired t test (level ``alpha``, ``n`` pairs, standard
    deviation ``sd`` of the differences) detects with probability ``power``: the root in d >= 0 of
    ``paired_t_power`` (d) = ``power``. With the observed ``sd`` plugged in it says how large a difference a
    "not significant" line of the table still leaves open (0 when every pair differs by the same amount)."""
    from scipy.optimize import brentq

    if not 0 < alpha < power < 1:
        raise ValueError(f"detectable_difference needs 0 < alpha < power < 1, got alpha = {alpha}, power = {power}")
    if n < 2:
        raise ValueError(f"detectable_difference needs n >= 2 pairs, got {n}")
    if sd == 0:
        return 0.0
    high = sd
    while paired_t_power(high, sd, n, alpha) < power:  # power rises with the difference: bracket the root
        high *= 2
    return float(brentq(lambda d: paired_t_power(d, sd, n, alpha) - power, 0.0, high, xtol=1e-12 * sd))


def seeds_needed(sd: float, difference: float, power: float = 0.8, alpha: float = 0.05) -> int:
    """The fewest seeds (pairs, >= 2) with which a two-sided paired t test at level ``alpha`` detects a true mean
    difference ``difference`` with probability >= ``power`` when the paired differences have standard deviation
    ``sd``: the smallest n with ``paired_t_power`` (difference, sd, n) >= ``power`` (power rises with n)."""
    if not (sd > 0 and difference != 0):
        raise ValueError(
            f"seeds_needed needs sd > 0 and a nonzero difference, got sd = {sd}, difference = {difference}"
        )
    n = 2
    while paired_t_power(abs(difference), sd, n, alpha) < power:
        n += 1
    return n


def paired_equivalence(differences: list[float], margin: float, alpha: float = 0.05) -> dict:
    """Schuirmann's two one-sided tests (TOST, 1987) that the mean of paired ``differences`` lies inside
    (-margin, +margin): with se = sd / sqrt(n) and n - 1 degrees of freedom, ``t_lower = (mean + margin) / se``
    tests H0: mean <= -margin (rejected for large t), ``t_upper = (mean - margin) / se`` tests H0: mean >= margin
    (rejected for small t); ``p`` is the larger one-sided p-value, and ``equivalent`` (p < alpha) is the same as the
    (1 - 2 alpha) t-interval ``low90`` .. ``high90`` lying inside the margins."""
    from scipy import stats

    n = len(differences)
    if n < 2 or not margin > 0:
        raise ValueError(f"paired_equivalence needs n >= 2 differences and margin > 0, got n = {n}, margin = {margin}")
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    se, df = sd / math.sqrt(n), n - 1
    if se > 0:
        p_lower = float(stats.t.sf((mean + margin) / se, df))
        p_upper = float(stats.t.cdf((mean - margin) / se, df))
    else:  # every pair differs by the same amount: inside the margins or not, with certainty
        p_lower = p_upper = 0.0 if -margin < mean < margin else 1.0
    half = float(stats.t.ppf(1 - alpha, df)) * se
    p = max(p_lower, p_upper)
    return {
        "mean": mean, "margin": margin, "n": n, "sd": sd, "p_lower": p_lower, "p_upper": p_upper, "p": p,
        "low90": mean - half, "high90": mean + half, "equivalent": bool(p < alpha),
    }  # fmt: skip


def equivalence_power(sd: float, n: int, margin: float, difference: float = 0.0, alpha: float = 0.05) -> float:
    """Exact power of ``paired_equivalence`` with ``n`` pairs whose differences are N(``difference``, ``sd``^2):
    with c = t_{1-alpha, n-1}, both one-sided tests reject when ``|mean| + c S / sqrt(n) < margin`` holding the sign
    inside, i.e. ``-margin + c S/sqrt(n) < mean < margin - c S/sqrt(n)``; the mean is N(difference, sd^2 / n)
    independent of S, and U = (n - 1) S^2 / sd^2 ~ chi2(n - 1), so
    power = int_0^{u*} [Phi(z(margin - c s(u)/sqrt(n))) - Phi(z(-margin + c s(u)/sqrt(n)))] chi2_pdf(u) du,
    z(x) = (x - difference) sqrt(n) / sd, up to u* where the interval closes (Owen 1965's integral, by quadrature)."""
    from scipy import integrate, stats

    if n < 2 or not (sd > 0 and margin > 0):
        raise ValueError(
            f"equivalence_power needs n >= 2, sd > 0 and margin > 0, got n = {n}, sd = {sd}, margin = {margin}"
        )
    df = n - 1
    c = float(stats.t.ppf(1 - alpha, df))
    root_n = math.sqrt(n)

    def inside(u: float) -> float:
        room = margin - c * sd * math.sqrt(u / df) / root_n  # margin - c S / sqrt(n) at S = sd sqrt(u / df)
        if room <= 0:
            return 0.0
        z = lambda x: (x - difference) * root_n / sd  # noqa: E731
        return float(stats.norm.cdf(z(room)) - stats.norm.cdf(z(-room))) * float(stats.chi2.pdf(u, df))

    u_star = df * (margin * root_n / (c * sd)) ** 2
    value, _ = integrate.quad(inside, 0.0, u_star, limit=200, epsabs=1e-12, epsrel=1e-10)
    return float(value)


def pooled_sd(differences: list[dict]) -> tuple[float, int] | None:
    """Pooled standard deviation of paired differences, each of ``paired_difference`` (its ``sd`` over ``n``
    pairs): sqrt(sum (n_i - 1) sd_i^2 / sum (n_i - 1)), with its degrees of freedom sum (n_i - 1); one noise level
    for a table whose lines each rest on few seeds. None without differences."""
    df = sum(d["n"] - 1 for d in differences)
    if df == 0:
        return None
    return math.sqrt(sum((d["n"] - 1) * d["sd"] ** 2 for d in differences) / df), df


REFERENCES = ("clip", "atr")  # the table's reference rules: each line's paired difference against each of them


def holm_adjusted(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (Holm 1979, "A simple sequentially rejective multiple test
    procedure"), in their order: with the p-values sorted ascending p_(1) <= ... <= p_(m),
    adjusted p_(i) = max over j <= i of min(1, (m - j + 1) p_(j)). Rejecting where adjusted p < alpha keeps the
    family-wise error rate at alpha over the m tests. Equal to statsmodels' ``multipletests(method="holm")``
    (``tests/studies/test_cpu_table_statistics.py``), which is not called here: it runs ``gc.collect()`` on every call (20-40 ms in a
    process holding torch), and writing a table calls this many times."""
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def paired_against_references(
    rows: list[dict], runs: list[str], key: str, references: tuple[str, ...] = REFERENCES
) -> dict[str, dict[str, dict | None]]:
    """For each table line of ``runs`` (``_units``; rows of one benchmark) and each of ``references``, the
    ``unit_minus_reference`` difference, with ``p_holm``: its p-value adjusted by Holm over every difference
    of this table (``holm_adjusted``), so ``p_holm < 0.05`` is significant for the table as a family."""
    table = {
        name: {ref: unit_minus_reference(unit, rows, ref, key) for ref in references}
        for name, unit in _units(rows, runs, start_labels(rows)).items()
    }
    tested = [d for by_ref in table.values() for d in by_ref.values() if d is not None]
    for d, p_holm in zip(tested, holm_adjusted([d["p"] for d in tested])):
        d["p_holm"] = p_holm
    return table


def unit_minus_reference(unit: list[dict], rows: list[dict], reference: str, key: str) -> dict | None:
    """``paired_difference`` of one table line's rows (``unit``: one run, one start) against every row of
    ``reference`` in ``rows``; pairs form only where the reference ran the same seed from the same SFT model."""
    return paired_difference(unit + [r for r in rows if r["method"] == reference], unit[0]["method"], reference, key)


def between_rule_noise(rows: list[dict], runs: list[str], k: int) -> dict | None:
    """How noisy a comparison of two GRPO rules is in this table (rows of one benchmark): the ``pooled_sd`` of
    every paired Mean@k difference between ``runs`` (the SFT line left out: GRPO against its starting model is
    another spread) and the seeds ``seeds_needed`` for 80% power at 2, 5 and 10 points. None without any
    difference of nonzero spread."""
    paired = paired_against_references(rows, [r for r in runs if r != "sft"], f"mean_at_{k}")
    pooled = pooled_sd([d for by_ref in paired.values() for d in by_ref.values() if d is not None and d["sd"] > 0])
    if pooled is None:
        return None
    sd, df = pooled
    return {"sd": sd, "df": df, "seeds_needed_80": {str(x): seeds_needed(sd, x) for x in (2, 5, 10)}}


def start_labels(rows: list[dict]) -> dict[str, str]:
    """SFT model id -> the letter of its *start* ("A", "B", ...), or "" for every id when the rows have one start.

    A start is the set of SFT models trained on one kind of machine: models with the same recorded
    ``sft_machine`` (``machine_kind``) are one start, whichever invocation wrote their rows. Rows without a
    recorded machine (written before it was recorded) are grouped by invocation instead (the seeds of one machine),
    and groups that share a model id are joined. Letters follow the earliest invocation of each start. Rows without
    a recorded model (``sft_model`` None) count as one model."""
    parent: dict = {}

    def root(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    first_seen: dict = {}
    for r in sorted(rows, key=lambda r: str(r.get("invocation") or "")):
        first_seen.setdefault(r.get("sft_model"), str(r.get("invocation") or ""))
        # an invocation stamps the results it reads back too, which may have been trained elsewhere: it groups only
        # the rows whose machine was not recorded
        by = ("machine", r["sft_machine"]) if r.get("sft_machine") else ("invocation", r.get("invocation"))
        parent[root(r.get("sft_model"))] = root(by)
    groups: dict = {}
    for model in first_seen:
        groups.setdefault(root(model), []).append(model)
    if len(groups) == 1:
        return {model: "" for model in first_seen}
    ordered = sorted(groups.values(), key=lambda ids: min(first_seen[m] for m in ids))
    return {model: chr(ord("A") + i) for i, ids in enumerate(ordered) for model in ids}


def pairing_key(row: dict) -> tuple:
    """What a row is paired on: its seed and the SFT model it started from."""
    return row["seed"], row.get("sft_model")


def _of_start(rows: list[dict], labels: dict[str, str], letter: str) -> list[dict]:
    """The rows that started from an SFT model of start ``letter`` (``start_labels``)."""
    return [r for r in rows if labels[r.get("sft_model")] == letter]


def display_name(row: dict, labels: dict[str, str]) -> str:
    """``method`` when the table has one start, else ``method [letter]`` (``start_labels``)."""
    letter = labels.get(row.get("sft_model"), "")
    return f"{row['method']} [{letter}]" if letter else row["method"]


def _by_benchmark_and_start(rows: list[dict]):
    """(benchmark, start letter, the rows of that benchmark and start) for every benchmark of ``BENCHMARKS`` and
    start of ``rows`` (``start_labels``), in that order: what is paired within."""
    labels = start_labels(rows)
    for benchmark in BENCHMARKS:
        for letter in sorted(set(labels.values())):
            yield benchmark, letter, [r for r in _of_start(rows, labels, letter) if r["benchmark"] == benchmark]


def delta_ablation(rows: list[dict], k: int) -> list[dict]:
    """The ATR delta ablation (the paper's Fig. 4 at this scale): per benchmark and start, one point per delta
    (``atr`` is delta 0.07) with Mean@k over seeds and its paired difference to delta 0.07 on the same SFT models
    (``paired_difference``); only starts where atr and at least one other delta ran."""
    key = f"mean_at_{k}"
    points = []
    for benchmark, letter, mine in _by_benchmark_and_start(rows):
        ran = [run for run in ABLATION_DELTAS if any(r["method"] == run for r in mine)]
        if "atr" not in ran or len(ran) < 2:
            continue
        for run in sorted(ran, key=ABLATION_DELTAS.get):
            scores = [r[key] for r in mine if r["method"] == run]
            d = paired_difference(mine, run, "atr", key)
            points.append(
                {
                    "benchmark": benchmark,
                    "start": letter,
                    "delta": ABLATION_DELTAS[run],
                    "run": run,
                    "seeds": len(scores),
                    key: statistics.fmean(scores),
                    f"sd_{key}": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                    "minus_delta0.07": None if d is None else d["mean"],
                    "ci_low": None if d is None else d["low"],
                    "ci_high": None if d is None else d["high"],
                }
            )
    return points


def delta_optimum(rows: list[dict], k: int) -> list[dict]:
    """Is ATR's delta 0.07 the best of the deltas that ran (the paper's Fig. 4: an interior optimum near 0.07)?
    Per benchmark and start where atr and at least two other deltas of ``DELTA_ABLATION`` ran on shared seeds:
    for each other delta, the paired difference d = Mean@k(0.07) - Mean@k(delta) (``paired_difference``) with
    its one-sided p for d > 0 (from the paired t: p/2 when d > 0, else 1 - p/2) and the two-sided p Holm-adjusted
    over these comparisons (``holm_adjusted``); ``iut_p``, the intersection-union p of "0.07 is above every
    other delta" = the largest of the one-sided p (Berger 1982, Technometrics 24: the claim needs every comparison,
    so no multiplicity correction, and it holds at level alpha when iut_p < alpha); and, when deltas below and above
    0.07 both ran, ``peak``: the paired contrast 0.07 - (smallest + largest delta) / 2 (``paired_contrast``).
    ``best_delta``: the delta with the highest mean over seeds (descriptive)."""
    key = f"mean_at_{k}"
    deltas, at_atr = ABLATION_DELTAS, ABLATION_DELTAS["atr"]
    out = []
    for benchmark, letter, mine in _by_benchmark_and_start(rows):
        against = {run: paired_difference(mine, "atr", run, key) for run in DELTA_ABLATION}
        against = {run: d for run, d in sorted(against.items(), key=lambda kv: deltas[kv[0]]) if d is not None}
        if len(against) < 2:
            continue
        comparisons = [
            {
                "delta": deltas[run],
                "run": run,
                "n": d["n"],
                "minus_delta": d["mean"],
                "low": d["low"],
                "high": d["high"],
                "p": d["p"],
                "p_one_sided": d["p"] / 2 if d["mean"] > 0 else 1 - d["p"] / 2,
            }
            for run, d in against.items()
        ]
        for c, p_holm in zip(comparisons, holm_adjusted([c["p"] for c in comparisons])):
            c["p_holm"] = p_holm
        below = [run for run in against if deltas[run] < at_atr]
        above = [run for run in against if deltas[run] > at_atr]
        peak = paired_contrast(mine, {"atr": 1.0, below[0]: -0.5, above[-1]: -0.5}, key) if below and above else None
        means = {deltas[run]: mean_of_present(r[key] for r in mine if r["method"] == run) for run in ["atr", *against]}
        out.append(
            {
                "benchmark": benchmark,
                "start": letter,
                "comparisons": comparisons,
                "iut_p": max(c["p_one_sided"] for c in comparisons),
                "peak": None
                if peak is None
                else {"low_delta": deltas[below[0]], "high_delta": deltas[above[-1]], **peak},
                "best_delta": max(means, key=means.get),
            }
        )
    return out


FORMS_2X2_EFFECTS: dict[str, dict[str, float]] = {
    "range": {"atr": 0.5, "atr-min": 0.5, "clip": -0.5, "clip-mask": -0.5},
    "form": {"atr": 0.5, "clip-mask": 0.5, "atr-min": -0.5, "clip": -0.5},
    "interaction": {"atr": 1.0, "atr-min": -1.0, "clip-mask": -1.0, "clip": 1.0},
}
"""Eq. 5's two forms crossed with two ratio ranges (clip's [0.8, 1.2], atr's [0.671, 1.422] at delta = 0.07):
``range``: atr's range minus clip's, averaged over the two forms; ``form``: the mask form minus PPO's min form,
averaged over the two ranges; ``interaction``: the form's effect at atr's range minus that at clip's
((atr - atr-min) - (clip-mask - clip)). Contrast weights over the four runs, for ``paired_contrast``."""


def forms_factorial(rows: list[dict], k: int) -> dict[str, dict[str, dict]] | None:
    """Per benchmark, the ``FORMS_2X2_EFFECTS`` of Mean@k as ``paired_contrast`` s over the seeds (and SFT
    models) on which all four of clip, clip-mask, atr, atr-min ran, each with ``p_holm``: Holm over the three
    (``holm_adjusted``). None unless some benchmark has >= 2 such seeds."""
    key = f"mean_at_{k}"
    out = {}
    for benchmark in BENCHMARKS:
        mine = [r for r in rows if r["benchmark"] == benchmark]
        effects = {name: paired_contrast(mine, weights, key) for name, weights in FORMS_2X2_EFFECTS.items()}
        if any(e is None for e in effects.values()):
            continue
        for e, p_holm in zip(effects.values(), holm_adjusted([e["p"] for e in effects.values()])):
            e["p_holm"] = p_holm
        out[benchmark] = effects
    return out or None


TAIL_STEPS = 100


TAIL_KEYS = {
    "reward": "reward",
    "entropy": "entropy",
    "length": "completions/mean_length",
    # the largest token ratio w = pi / pi_old of a loss call, averaged over the step's calls: how far the rule let
    # ratios go in fact, whatever its nominal bound (kl1 has none above; sapo none at all)
    "ratio_max": "clip/ratio_max",
}
"""Where a run ends, in its training curves: name -> logged key, averaged over the last ``TAIL_STEPS`` steps."""


def curve_tails(rows: list[dict], curve_sets: list[dict], last_steps: int = TAIL_STEPS) -> list[dict]:
    """One row per GRPO run, seed and SFT model of ``curve_sets`` (``{"run", "seed", "sft_model", "curves"}``) that
    has a table row in ``rows``: for each of ``TAIL_KEYS`` (``<name>_tail``) the mean over its logged points with
    step > final step - ``last_steps`` (less noisy than the last point alone), with the table row's seed, SFT model,
    machine and invocation, so that ``paired_against_references`` pairs and groups it as the table does."""
    identity = {(r["method"], *pairing_key(r)): r for r in rows}
    tails = []
    for c in sorted(curve_sets, key=lambda c: (c["run"], c["seed"], str(c.get("sft_model")))):
        row = identity.get((c["run"], c["seed"], c.get("sft_model")))
        if row is None or not c["curves"]:
            continue
        end = max(point["step"] for point in c["curves"])
        tail = [point for point in c["curves"] if point["step"] > end - last_steps]
        tails.append(
            {key: row.get(key) for key in ("method", "seed", "sft_model", "sft_machine", "invocation")}
            | {"final_step": end, "points": len(tail)}
            | {
                f"{name}_tail": mean_of_present(point.get(logged) for point in tail)
                for name, logged in TAIL_KEYS.items()
            }
        )
    return tails


def curve_tail_differences(tails: list[dict], runs: list[str]) -> dict[str, dict]:
    """Per paired quantity ("reward", "entropy"): ``paired_against_references`` of its ``<name>_tail`` over the
    ``curve_tails`` rows (Holm over that quantity's differences)."""
    return {name: paired_against_references(tails, runs, f"{name}_tail") for name in ("reward", "entropy")}


ASSOCIATED_TAILS = ("ratio_max", "entropy", "reward")
"""The curve tails ``outcome_association`` relates to the final Mean@k."""


def outcome_association(
    rows: list[dict], tails: list[dict], k: int, names: tuple[str, ...] = ASSOCIATED_TAILS
) -> dict[str, dict[str, dict | None]]:
    """Per benchmark and per curve quantity ``name`` of ``names``: how a GRPO run's final Mean@k moves with where its
    training curve ends (``<name>_tail`` of ``curve_tails``), within starts. Over the runs of every rule that have
    both, x = the tail and y = ``mean_at_<k>``, each minus the mean of its start (seed and SFT model; starts with one
    run are left out): the least-squares slope b = sum(x y) / sum(x^2), its 95% t interval and two-sided p with
    n - g - 1 degrees of freedom (n runs, g starts), and Pearson's r of the centred values -- the slope, standard
    error and p of an OLS of y on x with one indicator per start (a fixed-effects regression). None where fewer than
    three degrees of freedom remain or x does not vary. A run whose (x, y) equals another run's on the same start
    counts once (``copies`` says how many were dropped on the starts kept): the same tail to the last bit and the same Mean@k is the
    same training run under two names (the dual clip where its floor never acted, ``where_curves_part``), one
    observation, not two.

    Exploratory: the rules were not assigned a ratio, runs of one start share its SFT model, and a quantity chosen
    after looking at the table has no multiple-testing protection; it says which curve quantity tracks the outcome
    across rules, not what causes it."""
    from scipy import stats

    tail_of = {(t["method"], *pairing_key(t)): t for t in tails}
    out: dict[str, dict[str, dict | None]] = {}
    for benchmark in sorted({r["benchmark"] for r in rows}):
        out[benchmark] = {}
        for name in names:
            groups: dict[tuple, list[tuple[float, float]]] = {}
            copies_in: dict[tuple, int] = {}
            for r in rows:
                t = tail_of.get((r["method"], *pairing_key(r)))
                if r["benchmark"] != benchmark or t is None:
                    continue
                x, y = t.get(f"{name}_tail"), r.get(f"mean_at_{k}")
                if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
                    pairs = groups.setdefault(pairing_key(r), [])
                    if (x, y) in pairs:
                        copies_in[pairing_key(r)] = copies_in.get(pairing_key(r), 0) + 1
                    else:
                        pairs.append((x, y))
            centred = []
            for pairs in (g for g in groups.values() if len(g) > 1):
                mx, my = statistics.fmean(p[0] for p in pairs), statistics.fmean(p[1] for p in pairs)
                centred += [(x - mx, y - my) for x, y in pairs]
            starts = sum(len(g) > 1 for g in groups.values())
            copies = sum(n for start, n in copies_in.items() if len(groups[start]) > 1)  # of the starts kept
            df = len(centred) - starts - 1
            sxx = sum(x * x for x, _ in centred)
            if df < 3 or sxx == 0:
                out[benchmark][name] = None
                continue
            sxy, syy = sum(x * y for x, y in centred), sum(y * y for _, y in centred)
            slope = sxy / sxx
            se = math.sqrt(max(syy - slope * sxy, 0.0) / df / sxx)
            half = stats.t.ppf(0.975, df) * se
            p = 2 * stats.t.sf(abs(slope / se), df) if se > 0 else 0.0
            out[benchmark][name] = {
                "n": len(centred),
                "copies": copies,
                "starts": starts,
                "df": df,
                "slope": slope,
                "low": slope - half,
                "high": slope + half,
                "p": p,
                "r": sxy / math.sqrt(sxx * syy) if syy > 0 else 0.0,
            }
    return out


def _same_value(a, b) -> bool:
    """Equal, or both NaN (a logged NaN is the same value twice)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def where_curves_part(curve_sets: list[dict], runs: list[str], reference: str = "clip") -> dict[str, list[dict]]:
    """Per run of ``runs`` other than ``reference``, one entry per start (seed and SFT model) it shares with
    ``reference``: ``{"seed", "sft_model", "parts_at"}``, where ``parts_at`` is the first logged step at which any
    value of ``CURVE_KEYS`` differs from ``reference``'s, or None when every logged point is equal bit for bit
    (the same steps, every value). Training on one machine kind is deterministic (a rerun reproduces its curves), and
    two rules that give the same loss and gradient on every batch make the same updates, so None says the rule never
    changed an update on that start: e.g. the dual clip's floor c A (Ye et al. 2020) where no ratio of an A < 0
    token passed c. Runs without a shared start are left out."""
    by = {(c["run"], c["seed"], c.get("sft_model")): c["curves"] for c in curve_sets}
    parted: dict[str, list[dict]] = {}
    for run in runs:
        if run == reference:
            continue
        for run_, seed, model in sorted((k for k in by if k[0] == run and (reference, k[1], k[2]) in by), key=str):
            mine = {p["step"]: p for p in by[run_, seed, model]}
            theirs = {p["step"]: p for p in by[reference, seed, model]}
            steps = sorted(set(mine) | set(theirs))
            differ = [
                t
                for t in steps
                if t not in mine
                or t not in theirs
                or any(not _same_value(mine[t].get(k), theirs[t].get(k)) for k in CURVE_KEYS)
            ]
            parted.setdefault(run, []).append({"seed": seed, "sft_model": model, "parts_at": min(differ, default=None)})
    return parted


def grpo_minus_own_sft(rows: list[dict], k: int) -> dict[str, dict]:
    """Per benchmark: each GRPO row's final Mean@k minus that of the SFT model it started from (same seed, same
    ``sft_model``), how many runs raise / lower / keep it, and every change by run (``display_name``) and seed.
    A GRPO row whose SFT model has no ``sft`` row in ``rows`` is left out (``unmatched`` counts them)."""
    key = f"mean_at_{k}"
    labels = start_labels(rows)
    out = {}
    for benchmark in BENCHMARKS:
        mine = [r for r in rows if r["benchmark"] == benchmark]
        sft = {pairing_key(r): r[key] for r in mine if r["method"] == "sft"}
        grpo = [r for r in mine if r["method"] != "sft"]
        changes = [
            {"run": display_name(r, labels), "seed": r["seed"], "change": r[key] - sft[pairing_key(r)]}
            for r in grpo
            if pairing_key(r) in sft
        ]
        out[benchmark] = {
            "runs": len(changes),
            "raised": sum(c["change"] > 0 for c in changes),
            "lowered": sum(c["change"] < 0 for c in changes),
            "unchanged": sum(c["change"] == 0 for c in changes),
            "unmatched": len(grpo) - len(changes),
            "mean_change": mean_of_present(c["change"] for c in changes),
            "changes": sorted(changes, key=lambda c: c["change"]),
        }
    return out


def _units(rows: list[dict], runs: list[str], labels: dict[str, str]) -> dict[str, list[dict]]:
    """The rows of each of ``runs`` and start, by ``display_name``, in the order of ``runs`` then of starts."""
    units: dict[str, list[dict]] = {}
    for run in runs:
        mine = [r for r in rows if r["method"] == run]
        for r in sorted(mine, key=lambda r: labels[r.get("sft_model")]):
            units.setdefault(display_name(r, labels), []).append(r)
    return units


def comparison_validity(
    rows: list[dict], k: int, reference: str = "clip", control: str = "shuffled"
) -> dict[str, dict]:
    """Per benchmark, whether a rule comparison counts there: ``reference`` (clip) must beat its own SFT model and
    the no-signal ``control`` (``CONTROLS``: shuffled rewards) on final Mean@k, each a ``paired_difference`` whose
    95% interval lies above 0. ``beats_control`` is None where the control did not run (then ``counts`` is False:
    it was not shown). Empty when ``reference`` did not run."""
    key = f"mean_at_{k}"
    out: dict[str, dict] = {}
    if not any(r["method"] == reference for r in rows):
        return out
    for benchmark in BENCHMARKS:
        mine = [r for r in rows if r["benchmark"] == benchmark]
        vs_sft = paired_difference(mine, reference, "sft", key)
        ran_control = any(r["method"] == control for r in mine)
        vs_control = paired_difference(mine, reference, control, key) if ran_control else None
        beats_sft = vs_sft is not None and vs_sft["low"] > 0
        beats_control = (vs_control is not None and vs_control["low"] > 0) if ran_control else None
        out[benchmark] = {
            "reference": reference,
            "control": control,
            "reference_minus_sft": vs_sft,
            "reference_minus_control": vs_control,
            "beats_sft": beats_sft,
            "beats_control": beats_control,
            "counts": bool(beats_sft and beats_control),
        }
    return out
