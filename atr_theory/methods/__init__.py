r"""The registry of clipping methods: one small function per rule, one shared signature.

Every method receives a ``TokenBatch`` (log-ratios, advantages, mask, ... as torch tensors)
and its own parameters, and returns a ``MethodResult``: the per-token objective to *maximise*
and boolean tensors saying which tokens kept their gradient and which were clipped low / high.

The paper can be read two ways (``registry.READINGS``, ``docs/theory.md``), and every rule with a ratio range has
both: ``form="min"``, the Section 2 surrogate (the general clip inside PPO's min, ``min(w A, clip(w, l, u) A)``, the
default of every such rule: what its source trains, and what the paper's TRL experiments ran), and ``form="mask"``,
the Section 4 pure-clip objective (keep ``w A`` where the constraint holds, else the constant ``w_old A = A``).
The constraint in the mask form is the divergence itself (``k3 <= delta`` for atr), decided for kl1, kl2, kl3 and
is_kl3 as the interval of ``log w`` where it holds in exact arithmetic (``within_divergence_bound``: bounds
found from the Lambert-W / closed-form roots and corrected against the definition in mpmath, once per delta and
dtype). Tests check those decisions against mpmath's divergence at the bounds, and Thm 3.2's equivalence of the
constraint and the ratio range separately (``theorems``), rather than assume either.

One module per family of rules, discovered: importing this package imports every module in its folder whose name
does not start with ``_``, in name order, and each registers its rules with ``@register`` as it is imported. Adding a
rule is one function in a family module, or one new module in this folder; nothing else changes
(``docs/adding-a-rule.md``). Registration order is the order of ``METHODS`` and of the figures' method colours
(``sims._common.method_color``); ``tests/test_registry.py`` pins it. The modules starting with ``_`` are shared
pieces: ``_params`` (parameters several rules use) and ``_ratio`` (the ratio-range fast path's building blocks).
Each rule's formula as a textbook would write it, sharing no helper with the fast path: its ``reference_form``,
beside it in its module (``_reference`` holds what those share; ``docs/methods.md`` gathers them on one page).
"""

from __future__ import annotations

import importlib
import pkgutil

from ..registry import (  # noqa: F401  (re-exported: the registry is part of this package's API)
    FORMS,
    METHODS,
    READINGS,
    MethodResult,
    MethodSpec,
    Param,
    Relation,
    ResolvedMethod,
    TokenBatch,
    get_method,
    method_names,
    register,
    resolve,
    unclipped_result,
    unregister,
)
from ._params import COV_RATIO, DELTA, DUAL_CLIP_C, EPSILON, EPSILON_HIGH, EPSILON_LOW  # noqa: F401
from ._ratio import ratio_objective, within_divergence_bound

__all__ = [
    "FORMS",
    "METHODS",
    "READINGS",
    "MethodResult",
    "MethodSpec",
    "Param",
    "Relation",
    "ResolvedMethod",
    "TokenBatch",
    "family_modules",
    "get_method",
    "method_names",
    "ratio_objective",
    "register",
    "resolve",
    "unregister",
    "within_divergence_bound",
]


def family_modules() -> list[str]:
    """Names of the family modules in this folder (every module not starting with ``_``), in name order."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


for _family in family_modules():
    importlib.import_module(f"{__name__}.{_family}")
del _family
