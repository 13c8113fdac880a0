"""atr_theory: the verified core of atr-grpo (numpy, scipy, sympy, torch only).

Examples
--------
>>> import atr_theory as at
>>> l, u = at.kl3_clip_range(0.07)
>>> round(l, 3), round(u, 3)
(0.671, 1.422)
"""

from . import layers, methods, ranges, token_bounds  # noqa: F401  (submodules: at.methods, at.ranges, ...)
from .divergence import (
    REFERENCE_KL_ESTIMATORS,
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
    reference_kl,
)
from .layers import RolloutCorrection, SequenceMask
from .loss import (
    AGGREGATIONS,
    LOGP_TOLERANCE,
    LossOutput,
    aggregate,
    check_aggregation,
    outside_by_advantage,
    policy_loss,
    rule_generator,
)
from .methods import *  # noqa: F403  (the registry's public names, listed once: methods.__all__)
from .methods.vocab_topk_masks import topk_logps, topk_other_tokens
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
    *methods.__all__,
    "AGGREGATIONS",
    "LOGP_TOLERANCE",
    "REFERENCE_KL_ESTIMATORS",
    "reference_kl",
    "LossOutput",
    "RolloutCorrection",
    "SequenceMask",
    "aggregate",
    "check_aggregation",
    "entropy_from_log_probs",
    "kl3_from_log_ratio",
    "dcpo_clip_range",
    "full_kl",
    "head_kl_both_ways",
    "head_kl_chunked",
    "HeadScores",
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
    "outside_by_advantage",
    "policy_loss",
    "rule_generator",
    "topk_logps",
    "topk_other_tokens",
    "trgppo_clip_range",
    "trgppo_kl_range",
]
