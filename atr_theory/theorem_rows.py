"""The rows of the theorem report (``atr_theory.theorems.evaluate``): each check's errors per batch of instances,
their summary (absolute, relative and global errors), and the worst instance as a counterexample.

``check(cfg, theta, theta_old, advantages)`` returns a ``theorems.Check`` (its ``exact`` value and the errors of the
paper's and the corrected prediction); ``thm`` is a ``theorems.Theorem`` (id, name, statement, conditions, corrected
statement, tolerance, pairing)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def _tolist(x):
    return [[float(v) for v in row] for row in x.reshape(-1, x.shape[-1]).tolist()]


def _counterexample(cfg, th, tho, A, idx, extra):
    K, S, d, _ = cfg
    return {
        "K": K,
        "S": S,
        "delta": d,
        **extra,
        "theta": _tolist(th[idx]),
        "theta_old": _tolist(tho[idx]),
        "advantages": _tolist(A[idx]),
    }


def summarise_errors(errs):
    """errs: list of (abs_err, scale, cfg, th, tho, A, extra) per batch -> global numbers + per-instance rel error."""
    abs_all = torch.cat([e[0] for e in errs])
    scale_all = torch.cat([e[1] for e in errs])
    valid = scale_all > 1e-3 * scale_all.max()
    rel = torch.where(valid, abs_all / scale_all.clamp_min(1e-300), torch.zeros_like(abs_all))
    return {
        "instances": int(abs_all.numel()),
        "max_abs_error": float(abs_all.max()),
        "max_rel_error": float(rel.max()),
        "global_rel_error": float(abs_all.max() / scale_all.max()),
    }, rel


def worst_error(errs, rel, prefer_small_k=True, threshold=1e-8):
    """The worst instance, preferring the smallest K among instances that fail by more than threshold."""
    offset, best = 0, None
    for abs_e, _scale, cfg, th, tho, A, extra in errs:
        r = rel[offset : offset + abs_e.numel()]
        offset += abs_e.numel()
        if r.numel() == 0:
            continue
        i = int(r.argmax())
        key = (cfg[0] if prefer_small_k and float(r[i]) > threshold else 10**9, -float(r[i]))
        if best is None or key < best[0]:
            best = (key, _counterexample(cfg, th, tho, A, i, {**extra, "rel_error": float(r[i])}))
    return best[1] if best else None


def error_rows(check: Callable, instances, extra_of) -> tuple[list, list]:
    """Errors of the paper's and the corrected prediction per batch, with what a counterexample needs."""
    errs, cerrs = [], []
    for cfg, th, tho, A in instances:
        c, extra = check(cfg, th, tho, A), extra_of(cfg)
        scale = c.exact.abs().reshape(th.shape[0], -1).amax(-1)
        errs.append((c.abs_error(), scale, cfg, th, tho, A, extra))
        cerrs.append((c.corrected_abs_error(), scale, cfg, th, tho, A, extra))
    return errs, cerrs


def exact_statement_row(thm, errs, cerrs) -> dict:
    """Report row of a statement that must hold to ``thm.tolerance`` (relative) on every instance."""
    s, rel = summarise_errors(errs)
    cs, _ = summarise_errors(cerrs)
    holds = s["max_rel_error"] < thm.tolerance
    return {
        "id": thm.id,
        "name": thm.name,
        "statement": thm.statement,
        "pairing": thm.pairing,
        "holds_as_stated": holds,
        **s,
        "sign_agreement": None,
        "counterexample": None if holds else worst_error(errs, rel),
        "conditions": thm.conditions,
        "corrected_statement": None if holds else thm.corrected,
        "corrected_holds": None if holds else cs["max_rel_error"] < thm.tolerance,
        "corrected_max_abs_error": None if holds else cs["max_abs_error"],
        "corrected_max_rel_error": None if holds else cs["max_rel_error"],
    }
