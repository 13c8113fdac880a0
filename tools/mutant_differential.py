"""Differential judge of mutmut's surviving mutants of the root finders in ``atr_theory.ranges``.

A mutant of a root finder that survives the tests is either a gap in the tests or equivalent: another Newton start
point that the iteration polishes away, a loop bound never reached, a dtype argument that changes nothing. This
script tells the two apart by measurement: it calls each named mutant through mutmut's own trampoline (the
``MUTANT_UNDER_TEST`` variable, exactly as mutmut's test runs switch it on) on dense grids over each function's whole
domain and prints, per mutant, the largest difference to the original in units in the last place, and whether it
raised or warned where the original does not. A mutant whose outputs are identical (or within 1 ulp: the same root
to rounding) is listed as equivalent in ``figures/tools/mutation/mutation_survivors.md`` with this line; any larger difference is
a test gap, and gets a test. The probes run eagerly: a mutant that acts only under ``torch.compile`` (the solvers'
``tracing`` flag: trgppo_kl_log_range_torch 14, 69, 100) reads "identical" here, and only the compile tests, which
mutmut cannot run, see it (``tests/test_compile.py``'s float64 TRGPPO case kills those three).

    python -m mutmut run ...      # writes mutants/ (``make mutation``)
    python -m tools.mutant_differential --mutants-dir mutants atr_theory.ranges.x_kl3_clip_log_range__mutmut_21
    python -m tools.mutant_differential --mutants-dir mutants --from-file names.txt --out results.txt
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

DELTAS = np.concatenate(
    [np.logspace(-300, 6, 3061), [1e-3, np.nextafter(1e-3, 0), 1.0, np.nextafter(1.0, 0), 0.999, 1.001, 708.4, 745.2]]
)
"""delta over the whole domain: 1e-300 .. 1e6 (10 points per decade) and the switch points of the start rules."""
SCALAR_DELTAS = [1e-300, 1e-12, 1e-3, 0.07, 1.0, 5.0, 800.0]
"""Scalar calls: the output type (a Python float for a scalar delta) is part of the contract."""
P_OLD = torch.cat(
    [torch.logspace(-300, 0, 1001, dtype=torch.float64), 1 - torch.logspace(-16, -1, 151, dtype=torch.float64)]
)
TRGPPO_DELTAS = [1e-8, 1e-4, 0.01, 0.07, 0.2, 1.0, 5.0, 50.0]


class Ratio(np.ndarray):
    """A ratio bound ``w = e^y``: its ulp difference is divided by ``max(1, |y|)``, because ``e^y`` of a root ``y``
    exact to its last bit is exact only to ``|y|`` ulp (61 ulp of ``l = 6.8e-15`` at delta = 31.6 are 2 ulp of
    ``log l``)."""


def _ratios(pair: tuple) -> list:
    return [np.asarray(x, dtype=float).view(Ratio) for x in pair]


class Raised(str):
    """What a call raised (type and message): part of the output a mutant must reproduce."""


def _outcome(function, *args):
    """``function(*args)``, or what it raised: the bad-input probes, whose error type and message are the contract."""
    try:
        return function(*args)
    except Exception as exc:
        return Raised(f"{type(exc).__name__}: {exc}")


BAD_DELTAS = [0.0, -1.0, float("nan"), float("-inf"), "0.1", True, np.array([0.1, -1.0]), torch.tensor(0.1)]


def _bad_delta_probe(*functions) -> list:
    return [_outcome(f, d) for f in functions for d in BAD_DELTAS]


def _kl3_probe(r) -> list:
    arrays = [r.kl3_clip_log_range(DELTAS), _ratios(r.kl3_clip_range(DELTAS))]
    scalars = [r.kl3_clip_log_range(d) for d in SCALAR_DELTAS] + [r.kl3_clip_range(d) for d in SCALAR_DELTAS]
    return arrays + scalars + _bad_delta_probe(r.kl3_clip_log_range, r.kl3_clip_range)


def _is_kl3_probe(r) -> list:
    scalars = [r.is_kl3_clip_range(d) for d in SCALAR_DELTAS]
    return [_ratios(r.is_kl3_clip_range(DELTAS))] + scalars + _bad_delta_probe(r.is_kl3_clip_range)


def _kl12_probe(r) -> list:
    arrays = [_ratios(r.kl2_clip_range(DELTAS)), _ratios(r.kl1_clip_range(DELTAS))]
    return arrays + [r.kl2_clip_range(d) for d in SCALAR_DELTAS] + _bad_delta_probe(r.kl1_clip_range, r.kl2_clip_range)


def _trgppo_probe(r) -> list:
    out = []
    for dtype in (torch.float64, torch.float32):
        p = P_OLD.to(dtype)
        p = p[p > 0]  # float32 flushes the smallest p_old to 0, which is not a probability the solver takes
        out += [r.trgppo_kl_log_range_torch(p, d) for d in TRGPPO_DELTAS]
    out += [r.trgppo_kl_log_range(P_OLD.numpy(), 0.07)]
    bad_p = [torch.tensor([0.5, x], dtype=torch.float64) for x in (0.0, -0.1, 1.5, float("nan"), float("inf"))]
    out += [_outcome(r.trgppo_kl_log_range_torch, p, 0.07) for p in bad_p]
    return out + [_outcome(r.trgppo_kl_log_range_torch, P_OLD[:3], d) for d in BAD_DELTAS]


def _loss_batch(dtype: torch.dtype, padded: bool, per_token_adv: bool, seed: int = 0) -> dict:
    """A (4, 7) batch whose log-ratios include the clamp (+-60) exactly and beyond it, NaN / inf garbage on padded
    positions (which must change nothing), and full distributions (V = 5) for the methods that need them."""
    g = torch.Generator().manual_seed(seed)
    B, T, V = 4, 7, 5
    old = -(torch.rand(B, T, generator=g, dtype=torch.float64) * 4 + 0.05)
    y = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4
    y[0, 0], y[0, 1], y[1, 0], y[1, 1] = 60.0, 64.0, -60.0, -75.0  # at the clamp and beyond (LOG_RATIO_CLAMP = 60)
    y[2, 0] = 0.0
    adv = torch.randn(B, T, generator=g, dtype=torch.float64) if per_token_adv else torch.randn(B, generator=g)
    weights = torch.rand(B, T, generator=g, dtype=torch.float64) + 0.5  # float64: cast to the loss's dtype
    mask = torch.ones(B, T, dtype=torch.bool)
    logp = old + y
    if padded:
        mask[1, 5:] = mask[3, 2:] = False
        logp = torch.where(mask, logp, torch.tensor(float("nan"), dtype=torch.float64))
        old = torch.where(mask, old, torch.tensor(float("-inf"), dtype=torch.float64))
        if per_token_adv:
            adv = torch.where(mask, adv, torch.tensor(float("inf"), dtype=torch.float64))
        weights = torch.where(mask, weights, torch.tensor(float("nan"), dtype=torch.float64))
    old_full = torch.log_softmax(torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2, -1)
    full = torch.log_softmax(old_full + 0.3 * torch.randn(B, T, V, generator=g, dtype=torch.float64), -1)
    cast = {"logp": logp.to(dtype), "old_logp": old.to(dtype), "old_full_logp": old_full.to(dtype)}
    return dict(cast, advantages=adv.to(dtype), mask=mask, token_weights=weights, full_logp=full.to(dtype))


def _policy_loss_probe(r) -> list:
    """Every method x form x aggregation through ``policy_loss`` in float32 / float64 / bfloat16, padded or not, with
    validation on and off: loss, per-token objective, mask, log-ratio and the gradients (logp and full_logp)."""
    import atr_theory as at
    from atr_theory.methods import METHODS

    out = []
    for i, (name, spec) in enumerate(sorted(METHODS.items())):
        for form in spec.forms:
            for j, aggregation in enumerate(at.AGGREGATIONS):
                for dtype, padded, validate in [
                    (torch.float64, True, True),
                    (torch.float64, False, True),
                    (torch.float32, True, True),
                    (torch.float32, True, False),
                    (torch.bfloat16, False, True),
                ]:
                    batch = _loss_batch(dtype, padded, per_token_adv=(i + j) % 2 == 1, seed=i)
                    full = spec.needs_full_distributions
                    leaves = [batch["logp"]] + ([batch["full_logp"]] if full else [])
                    leaves = [t.clone().requires_grad_(True) for t in leaves]
                    kwargs = dict(batch, logp=leaves[0], method=name, form=form, aggregation=aggregation)
                    kwargs.update(validate=validate, generator=torch.Generator().manual_seed(3))
                    kwargs.update(max_length=8 if aggregation == "dr_grpo" else None)
                    if full:
                        kwargs["full_logp"] = leaves[1]
                    else:
                        del kwargs["full_logp"], kwargs["old_full_logp"]
                    if spec.needs_topk:  # two of the V = 5 outcomes as the others
                        kwargs.update(old_topk_logp=batch["old_full_logp"][..., :2], topk_logp=batch["full_logp"][..., :2])

                    def call(kw=kwargs, leaves=leaves):
                        result = at.policy_loss(**kw)
                        grads = torch.autograd.grad(result.loss, leaves, allow_unused=True)
                        tensors = [result.loss, result.per_token, result.mask, result.log_ratio]
                        return tensors + [torch.zeros(0) if g is None else g for g in grads]

                    out.append(_outcome(call))
    return out


BAD_VALUES = [0, -1, float("nan"), float("inf"), "0.1", True, 1e9]


def _bad_loss_input_probe(r) -> list:
    """Bad arguments of ``policy_loss`` and bad values of every method parameter: the error type and message."""
    import atr_theory as at
    from atr_theory.methods import METHODS

    base = _loss_batch(torch.float64, True, False)
    del base["full_logp"], base["old_full_logp"], base["token_weights"]
    bad_args = [
        dict(mask=torch.full((4, 7), 0.5)),
        dict(logp=torch.zeros(4, 7, dtype=torch.long)),
        dict(max_length=6),
        dict(max_length=9, aggregation="token_mean"),
        dict(aggregation="mean"),
        dict(method="nope"),
        dict(method="sapo", form="mask"),
        dict(method="tr_ppo"),
        dict(advantages=torch.zeros(5)),
        dict(logp=torch.zeros(0, 7), old_logp=torch.zeros(0, 7), mask=torch.ones(0, 7), advantages=torch.zeros(0)),
        dict(token_weights=torch.full((4, 7), float("nan"))),
        dict(method="clip_cov", cov_lb=5.0, cov_ub=1.0),
    ]
    bad_args += [{"method": n, k: v} for n, spec in sorted(METHODS.items()) for k in spec.params for v in BAD_VALUES]
    return [_outcome(lambda kw=kw: at.policy_loss(**{**base, **kw}).loss) for kw in bad_args]


def _loss_probes(r) -> list:
    return _policy_loss_probe(r) + _bad_loss_input_probe(r)


PROBES: dict[str, Callable] = {  # mangled function -> what exercises it (every public caller, every input form)
    "x_kl3_clip_log_range": _kl3_probe,
    "x_kl3_clip_range": _kl3_probe,
    "x__as_output": lambda r: _kl3_probe(r) + _is_kl3_probe(r),
    "x__exp_pair": lambda r: _kl3_probe(r) + _kl12_probe(r),
    "x__newton": lambda r: _kl3_probe(r) + _is_kl3_probe(r),
    "x_is_kl3_clip_range": _is_kl3_probe,
    "x_kl2_clip_range": _kl12_probe,
    "x_trgppo_kl_log_range_torch": _trgppo_probe,
    "x__newton_nonpositive_torch": _trgppo_probe,
    "x__bernoulli_kl_and_slope": lambda r: (
        _trgppo_probe(r) + [r.bernoulli_kl_of_log_ratio(np.linspace(-30, 30, 601)[:, None], P_OLD.numpy()[None, ::7])]
    ),
    "x_policy_loss": _loss_probes,
    "x__check_structure": _loss_probes,
    "x__check_tensor": _loss_probes,
    "x__check_logp": _loss_probes,
    "x_resolve": _bad_loss_input_probe,
    "xǁParamǁcheck": _bad_loss_input_probe,
}


def _flatten(value) -> list:
    """Arrays and floats of a (nested) output, with their types, in order."""
    if isinstance(value, Raised):
        return [("raised", str(value), np.zeros(0))]
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _flatten(v)]
    if isinstance(value, torch.Tensor):
        return [("tensor", str(value.dtype), value.detach().cpu().double().numpy())]
    if isinstance(value, Ratio):
        return [("ratio", str(value.dtype), np.asarray(value))]
    if isinstance(value, np.ndarray):
        return [("ndarray", str(value.dtype), value.astype(float))]
    return [(type(value).__name__, "", np.asarray(value, dtype=float))]


def ulp_difference(a: np.ndarray, b: np.ndarray, ratio: bool = False) -> tuple[float, int]:
    """Largest ``|a - b|`` in units of ``spacing(max(|a|, |b|))`` (divided by ``max(1, |log a|)`` for a ratio) and
    its flat index; inf where one is NaN / inf and the other is not."""
    if a.shape != b.shape:
        return float("inf"), -1
    a, b = a.ravel(), b.ravel()
    same_special = (np.isnan(a) & np.isnan(b)) | ((a == b) & ~np.isfinite(a))
    finite = np.isfinite(a) & np.isfinite(b)
    with np.errstate(all="ignore"):
        diff = np.where(finite, np.abs(a - b) / np.spacing(np.maximum(np.abs(a), np.abs(b))), 0.0)
        if ratio:
            diff = diff / np.maximum(1.0, np.abs(np.log(np.where(finite & (a > 0), a, 1.0))))
    diff = np.where(same_special | finite, diff, np.inf)
    i = int(np.argmax(diff)) if diff.size else -1
    return (float(diff[i]), i) if diff.size else (0.0, -1)


def _run(probe: Callable, ranges, mutant: str) -> tuple[list | None, str, int]:
    os.environ["MUTANT_UNDER_TEST"] = mutant
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = _flatten(probe(ranges))
            error = ""
        except Exception as exc:  # a mutant may raise anything
            out, error = None, f"{type(exc).__name__}: {str(exc)[:80]}"
    return out, error, len(caught)


def judge(name: str, ranges) -> str:
    """One line: ``name: identical`` / ``at most N ulp apart`` / what differs."""
    module, _, mangled = name.rpartition(".")
    function = mangled.split("__mutmut_")[0]
    if function not in PROBES:
        return f"{name}: no probe for {function}"
    probe = PROBES[function]
    orig, orig_error, orig_warnings = _run(probe, ranges, "")
    mut, mut_error, mut_warnings = _run(probe, ranges, name)
    if orig_error:
        return f"{name}: the original raised {orig_error}"
    if mut_error:
        return f"{name}: DIFFERS -- raises {mut_error}"
    kinds = [(k, d) for k, d, _ in orig], [(k, d) for k, d, _ in mut]
    if kinds[0] != kinds[1]:
        j = next((j for j, (a, b) in enumerate(zip(*kinds)) if a != b), min(map(len, kinds)))
        first = [k[j] if j < len(k) else "nothing" for k in kinds]
        return f"{name}: DIFFERS -- output {j} is {first[1]} instead of {first[0]}"
    diffs = [ulp_difference(a, b, kind == "ratio") for (kind, _, a), (_, _, b) in zip(orig, mut)]
    k = int(np.argmax([d for d, _ in diffs]))
    worst, i = diffs[k]
    warned = f"; {mut_warnings} warnings (original {orig_warnings})" if mut_warnings != orig_warnings else ""
    verdict = "identical" if worst == 0 else f"at most {worst:.3g} ulp apart"
    if worst > 0:
        a, b = orig[k][2].ravel()[i], mut[k][2].ravel()[i]
        verdict += f" (output {k}, element {i}: {a!r} vs {b!r})"
    if worst > 2 or warned:
        verdict = "DIFFERS -- " + verdict
    return f"{name}: {verdict}{warned}"


def main(argv=None) -> None:
    from atr_llm.cli_types import ReadDir, ReadFile, Text, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", type=Text(), nargs="*", help="mutant names as mutmut prints them")
    ap.add_argument(
        "--mutants-dir",
        type=ReadDir(holding="atr_theory/__init__.py", what="mutmut's mutants folder (make mutation writes one)"),
        default="mutants",  # a text: argparse checks it with the type too
        help="mutmut's mutants/ directory (its mutated copy of atr_theory is imported)",
    )
    ap.add_argument("--from-file", type=ReadFile(), help="a file of mutant names, one per line")
    ap.add_argument("--out", type=WriteFile(), help="also write the lines here")
    args = ap.parse_args(argv)
    names = list(args.names) + (Path(args.from_file).read_text().split() if args.from_file else [])
    mutants_dir = str(Path(args.mutants_dir).resolve())
    package = Path(mutants_dir) / "atr_theory"  # the mutated copy, imported in place of the installed package
    spec = importlib.util.spec_from_file_location(
        "atr_theory", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    sys.modules["atr_theory"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["atr_theory"])
    import atr_theory.ranges as ranges

    if not ranges.__file__.startswith(mutants_dir):
        raise SystemExit(f"imported {ranges.__file__}, not the mutated copy under {mutants_dir}")
    torch.set_num_threads(1)
    lines = []
    for name in names:
        lines.append(judge(name, ranges))
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
