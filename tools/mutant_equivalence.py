"""Evidence for the mutants of ``atr_theory.ranges`` judged equivalent (figures/tools/mutation/mutation_survivors.md).

A surviving mutant of a root finder (another start point, another stopping rule) is equivalent only if it returns
the same roots to within their float64 conditioning. This script applies each such mutation to the *current*
source of ``atr_theory.ranges`` (a textual replacement, as mutmut makes it), runs original and mutant over a dense
grid and prints the largest difference; where they differ by more than 1e-15 it also prints both errors against
an 80-digit bisection of the definition (``tests/test_ranges.py``'s oracle).

    python -m tools.mutant_equivalence          # ~1 min on one core
"""

from __future__ import annotations

import argparse
import inspect
import types

import mpmath as mp
import numpy as np
import torch

import atr_theory.ranges as ranges
from tests.mp_reference import binary_kl_log_roots_80_digits

TORCH_MUTANTS = {  # label -> (original text, mutated text); mutmut numbering of the commit named
    "trgppo_kl_log_range_torch 58 of be5a04d = 82 of 8bfc2f7 (lower start / p -> * p)": (
        "(qlogq - delta) / ps - 1.0, max_iter",
        "(qlogq - delta) * ps - 1.0, max_iter",
    ),
}
"""The stopping-rule mutants 98 (be5a04d) and 118 (ee4f142) and the upper-start mutant 107 were of the solver's
textbook-KL form, rewritten since (p k3(y) + q k3(y')): their lines, measured then, are kept at the end of
figures/mutant_equivalence.txt."""
SERIES_MUTANTS = {  # label -> (original text, mutated text) in kl3_clip_log_range's series start
    "kl3_clip_log_range 58 of be5a04d (lower series start p^2/3 -> 3 p^2)": (
        "log_series_lo = np.log1p(-(p - p**2 / 3 + 11 * p**3 / 72))",
        "log_series_lo = np.log1p(-(p - p**2 * 3 + 11 * p**3 / 72))",
    ),
    "kl3_clip_log_range 61 of 6a5054c (lower series start - p^2/3 -> + p^2/3)": (
        "log_series_lo = np.log1p(-(p - p**2 / 3 + 11 * p**3 / 72))",
        "log_series_lo = np.log1p(-(p + p**2 / 3 + 11 * p**3 / 72))",
    ),
    "kl3_clip_log_range 75 of ee4f142 (upper series start p^2/3 -> 3 p^2)": (
        "log_series_hi = np.log1p(p + p**2 / 3 + 11 * p**3 / 72)",
        "log_series_hi = np.log1p(p + p**2 * 3 + 11 * p**3 / 72)",
    ),
    "kl3_clip_log_range 71 of ee4f142 (upper series start + p^2/3 -> - p^2/3)": (
        "log_series_hi = np.log1p(p + p**2 / 3 + 11 * p**3 / 72)",
        "log_series_hi = np.log1p(p - p**2 / 3 + 11 * p**3 / 72)",
    ),
    "kl3_clip_log_range 74 of 8bfc2f7 (upper series start + 11 p^3/72 -> - 11 p^3/72)": (
        "log_series_hi = np.log1p(p + p**2 / 3 + 11 * p**3 / 72)",
        "log_series_hi = np.log1p(p + p**2 / 3 - 11 * p**3 / 72)",
    ),
    "kl3_clip_log_range 77 of 8bfc2f7 (upper series start p^2/3 -> 2 p/3)": (
        "log_series_hi = np.log1p(p + p**2 / 3 + 11 * p**3 / 72)",
        "log_series_hi = np.log1p(p + p * 2 / 3 + 11 * p**3 / 72)",
    ),
    "kl3_clip_log_range 21 of 8bfc2f7 (series variable p = sqrt(2 (1 + e z)) -> sqrt(3 (1 + e z)))": (
        "p = np.sqrt(2.0 * -np.expm1(-d))",
        "p = np.sqrt(3.0 * -np.expm1(-d))",
    ),
}

_LOWER_START = "w_l = np.real(np.exp(1.0 + lambertw(np.minimum(z, -1e-300), -1)))"
_LO0 = "lo0 = np.where(small | ~np.isfinite(np.log(w_l)), -s, np.log(w_l))"
IS_KL3_MUTANTS = {  # label -> (original text, mutated text) in is_kl3_clip_range's Newton start points
    "is_kl3_clip_range 42 of 0aee899 (lower start lambertw(-1))": (
        _LOWER_START,
        "w_l = np.real(np.exp(1.0 + lambertw(-1)))",
    ),
    "is_kl3_clip_range 48 (lower start min(z, +1e-300))": (_LOWER_START, _LOWER_START.replace("-1e-300", "+1e-300")),
    "is_kl3_clip_range 49 (lower start min(z, -1))": (_LOWER_START, _LOWER_START.replace("-1e-300", "-1.0")),
    "is_kl3_clip_range 53 (series start for delta <= 1e-3)": (
        "small = d < 1e-3\n    s = np.sqrt",
        "small = d <= 1e-3\n    s = np.sqrt",
    ),
    "is_kl3_clip_range 54 (series start for delta < 1.001)": (
        "small = d < 1e-3\n    s = np.sqrt",
        "small = d < 1.001\n    s = np.sqrt",
    ),
    "is_kl3_clip_range 58 (series start sqrt(3 delta))": ("s = np.sqrt(2.0 * d)", "s = np.sqrt(3.0 * d)"),
    "is_kl3_clip_range 60 (upper start always log w_u)": (
        "hi0 = np.where(small, s, np.log(w_u))",
        "hi0 = np.where(None, s, np.log(w_u))",
    ),
    "is_kl3_clip_range 68 (lower start always log w_l)": (_LO0, "lo0 = np.where(None, -s, np.log(w_l))"),
    "is_kl3_clip_range 74 (lower series start only where small and log w_l infinite)": (
        _LO0,
        _LO0.replace("small | ~np.isfinite", "small & ~np.isfinite"),
    ),
    "is_kl3_clip_range 75 (lower series start where log w_l is finite)": (
        _LO0,
        _LO0.replace("~np.isfinite", "np.isfinite"),
    ),
    "is_kl3_clip_range 102 (lower start -1 for every delta)": (
        "y_lo = _newton(f, fp, np.where(d < 1.0, lo0, -1.0))",
        "y_lo = _newton(f, fp, np.where(None, lo0, -1.0))",
    ),
}
"""Full mutmut run of this numbering (0aee899); 33 (``lambertw(z, 0)`` -> ``lambertw(z)``: 0 is scipy's default
branch) and 104 (the dummy start for delta >= 1 -> None: that root is discarded) need no measurement."""


def mutated(function: str, original: str, mutant: str):
    """``function`` of a copy of ``atr_theory.ranges`` whose source has ``original`` replaced by ``mutant``."""
    source = inspect.getsource(ranges)
    if source.count(original) != 1:
        raise ValueError(f"{original!r} occurs {source.count(original)} times in atr_theory/ranges.py, expected once")
    module = types.ModuleType("ranges_mutant")
    module.__dict__.update(ranges.__dict__)
    exec(compile(source.replace(original, mutant), "ranges_mutant", "exec"), module.__dict__)
    return getattr(module, function)


def compare_trgppo() -> None:
    p = torch.cat(
        [torch.logspace(-300, 0, 3001, dtype=torch.float64), 1 - torch.logspace(-16, -1, 301, dtype=torch.float64)]
    )
    deltas = [1e-8, 1e-4, 0.01, 0.07, 0.2, 1.0, 5.0, 50.0]
    for label, (original, mutant) in TORCH_MUTANTS.items():
        fn = mutated("trgppo_kl_log_range_torch", original, mutant)
        worst = (0.0, None)
        for d in deltas:
            for k, (a, b) in enumerate(zip(ranges.trgppo_kl_log_range_torch(p, d), fn(p, d))):
                finite = torch.isfinite(a) & torch.isfinite(b)
                diff = torch.where(finite, (a - b).abs() / a.abs().clamp_min(1.0), 0.0)  # |dy| / max(1, |y|)
                i = int(diff.argmax())
                if float(diff[i]) > worst[0]:
                    worst = (float(diff[i]), (d, i, k, float(a[i]), float(b[i])))
        line = f"{label}: max |dy| / max(1, |y|) = {worst[0]:.2e}"
        if worst[0] > 1e-15:
            d, i, k, a, b = worst[1]
            truth = binary_kl_log_roots_80_digits(float(p[i]), d)[k]
            err = [float(abs(mp.mpf(v) - truth)) for v in (a, b)]
            line += (
                f" at delta = {d}, p_old = {float(p[i])!r} ({'upper' if k else 'lower'} root); error vs mpmath:"
                f" original {err[0]:.2e}, mutant {err[1]:.2e}"
            )
        print(line, flush=True)


def compare_kl3_series() -> None:
    d = np.logspace(-300, -3, 20001)
    lo0, hi0 = ranges.kl3_clip_log_range(d)
    for label, (original, mutant) in SERIES_MUTANTS.items():
        lo1, hi1 = mutated("kl3_clip_log_range", original, mutant)(d)
        ulp = [np.abs(a - b) / np.maximum(np.abs(a), 1e-300) / np.finfo(float).eps for a, b in ((lo0, lo1), (hi0, hi1))]
        print(
            f"{label}: {d.size} deltas in (1e-300, 1e-3): lower roots at most {ulp[0].max():.2f} ulp apart, upper "
            f"roots at most {ulp[1].max():.2f} ulp apart",
            flush=True,
        )


def compare_is_kl3() -> None:
    import warnings

    d = np.concatenate([np.logspace(-300, 6, 20001), [1e-3, 1.0, np.nextafter(1.0, 0), 0.999, 1.001]])
    lo0, hi0 = ranges.is_kl3_clip_range(d)
    for label, (original, mutant) in IS_KL3_MUTANTS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a mutant's start may warn; only its roots are compared
            lo1, hi1 = mutated("is_kl3_clip_range", original, mutant)(d)
        ulp = [np.abs(a - b) / np.maximum(np.abs(a), 1e-300) / np.finfo(float).eps for a, b in ((lo0, lo1), (hi0, hi1))]
        ulp = [np.where(np.isnan(u), np.inf, u) for u in ulp]
        print(
            f"{label}: {d.size} deltas in (1e-300, 1e6): l at most {ulp[0].max():.2f} ulp apart, u at most"
            f" {ulp[1].max():.2f} ulp apart (worst at delta = {d[int(np.argmax(np.maximum(*ulp)))]:.3g})",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    """``python -m tools.mutant_equivalence``: takes no argument (an unknown one is refused, never ignored)."""
    from atr_llm.command_line import Parser

    Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    torch.set_num_threads(1)
    compare_is_kl3()
    compare_kl3_series()
    compare_trgppo()


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
