"""Parameters shared by several rules: declared here once; each rule may change the default (``Param.with_default``)."""

from __future__ import annotations

from ..registry import Param

DELTA = Param(0.07, gt=0, help="divergence threshold delta: keep w while the divergence <= delta (paper Eq. 5)")
EPSILON = Param(0.2, ge=0, lt=1, help="PPO clip range: keep w in [1 - epsilon, 1 + epsilon]")
EPSILON_LOW = Param(0.2, ge=0, lt=1, help="lower clip range: keep w >= 1 - epsilon_low")
EPSILON_HIGH = Param(0.28, ge=0, help="upper clip range: keep w <= 1 + epsilon_high")
DUAL_CLIP_C = Param(3.0, gt=1, help="dual clip: for A < 0 the loss is at most -c A")
COV_RATIO = Param(2e-4, gt=0, le=1, help="fraction of valid tokens selected by the covariance rule")
