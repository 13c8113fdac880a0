"""atr_theory: the verified core of atr-grpo (numpy, scipy, sympy, torch only).

Examples
--------
>>> import atr_theory as at
>>> l, u = at.kl3_clip_range(0.07)
>>> round(l, 3), round(u, 3)
(0.671, 1.422)
"""

from . import layers, ranges, token_bounds  # noqa: F401  (submodules: at.ranges, at.token_bounds)
from .divergence import (
    HeadScores,
    entropy_from_log_probs,
    full_kl,
    head_kl_both_ways,
    head_kl_chunked,
    is_kl3,
    kl1,
    kl2,
    kl3,
    kl3_from_log_ratio,
)
from .layers import RolloutCorrection, SequenceMask
from .loss import AGGREGATIONS, LossOutput, aggregate, check_aggregation, policy_loss
from .methods import (
    FORM_DEFAULT_CHANGED,
    FORMER_MASK_DEFAULTS,
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
    ratio_objective,
    register,
    resolve,
    unregister,
)
from .ranges import (
    dcpo_clip_range,
    is_kl3_clip_range,
    kl1_clip_range,
    kl2_clip_range,
    kl3_clip_log_range,
    kl3_clip_range,
    kl3_delta_from_bound,
    trgppo_clip_range,
    trgppo_kl_range,
)

__version__ = "0.1.0"

__all__ = [
    "AGGREGATIONS",
    "FORM_DEFAULT_CHANGED",
    "FORMER_MASK_DEFAULTS",
    "FORMS",
    "READINGS",
    "METHODS",
    "LossOutput",
    "MethodResult",
    "RolloutCorrection",
    "SequenceMask",
    "MethodSpec",
    "TokenBatch",
    "aggregate",
    "check_aggregation",
    "entropy_from_log_probs",
    "kl3_from_log_ratio",
    "Param",
    "Relation",
    "ResolvedMethod",
    "resolve",
    "unregister",
    "dcpo_clip_range",
    "full_kl",
    "head_kl_both_ways",
    "head_kl_chunked",
    "HeadScores",
    "get_method",
    "is_kl3",
    "is_kl3_clip_range",
    "kl1",
    "kl1_clip_range",
    "kl2",
    "kl2_clip_range",
    "kl3",
    "kl3_clip_log_range",
    "kl3_clip_range",
    "kl3_delta_from_bound",
    "method_names",
    "policy_loss",
    "ratio_objective",
    "register",
    "trgppo_clip_range",
    "trgppo_kl_range",
]
