"""Hypothesis strategies for a rule's parameters, derived from the registry alone: each ``atr_theory.Param``'s
declared default and domain give the values drawn (from a tenth to five times the default, cut to the domain, open
bounds excluded), and the rule's declared relations filter the draws. A new rule's parameters need no entry here."""

from __future__ import annotations

from hypothesis import strategies as st

import atr_theory as at


def param_values(param: at.Param) -> st.SearchStrategy[float]:
    """Finite floats inside ``param``'s domain, around its default: ``[default / 10, 5 default]`` (``[-1, 1]`` for a
    default of 0), cut at the domain's bounds."""
    lo, hi = sorted((param.default / 10, param.default * 5)) if param.default else (-1.0, 1.0)
    exclude_min = exclude_max = False
    if param.gt is not None and lo <= param.gt:
        lo, exclude_min = param.gt, True
    if param.ge is not None and lo < param.ge:
        lo = param.ge
    if param.lt is not None and hi >= param.lt:
        hi, exclude_max = param.lt, True
    if param.le is not None and hi > param.le:
        hi = param.le
    return st.floats(lo, hi, exclude_min=exclude_min, exclude_max=exclude_max, allow_nan=False)


def rule_params(spec: at.MethodSpec) -> st.SearchStrategy[dict[str, float]]:
    """``{parameter: value}`` for every parameter of ``spec``, each from ``param_values``, satisfying its relations."""
    values = st.fixed_dictionaries({name: param_values(p) for name, p in spec.params.items()})
    return values.filter(lambda v: all(r.holds(v) for r in spec.relations))
