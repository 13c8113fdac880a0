"""Parameters shared by several rules: declared here once; each rule may change the default (``Param.with_default``).
Each names the verl config fields it is read from (``Param.verl``) and whether its trainer field is TRL's own
(``Param.trl_field``)."""

from __future__ import annotations

from ..registry import Param

DELTA = Param(0.07, gt=0, help="divergence threshold delta: keep w while the divergence <= delta (paper Eq. 5)")
EPSILON = Param(
    0.2,
    ge=0,
    lt=1,
    help="PPO clip range: keep w in [1 - epsilon, 1 + epsilon]",
    verl=(("actor", "clip_ratio_low"), ("actor", "clip_ratio_high")),
    trl_field=True,
)
EPSILON_LOW = Param(
    0.2, ge=0, lt=1, help="lower clip range: keep w >= 1 - epsilon_low", verl=(("actor", "clip_ratio_low"),)
)
EPSILON_HIGH = Param(
    0.28,
    ge=0,
    help="upper clip range: keep w <= 1 + epsilon_high",
    verl=(("actor", "clip_ratio_high"),),
    trl_field=True,
)
DUAL_CLIP_C = Param(3.0, gt=1, help="dual clip: for A < 0 the loss is at most -c A", verl=(("actor", "clip_ratio_c"),))
COV_RATIO = Param(2e-4, gt=0, le=1, help="fraction of valid tokens selected by the covariance rule")
