"""verl's policy-loss config with one more field, ``atr_params``: this package's parameters in verl's own config.

    actor_rollout_ref.actor.policy_loss._target_=atr_llm.verl.config.PolicyLossConfig
    '+actor_rollout_ref.actor.policy_loss.atr_params={delta:0.05}'

verl builds ``actor.policy_loss`` from its ``_target_`` (``hydra.utils.instantiate``), so selecting this subclass
there gives the loss (``atr_llm.verl.plugin``) its parameters through the config verl passes to every loss call,
and verl's config dump (the run's printed and saved config) records them. ``atr_params`` takes what
``$ATR_GRPO_PARAMS`` takes: method parameters (``delta``, ``alpha``, ...) and the layer keys
``rollout_correction`` / ``sequence_mask``. Imports verl (load it where verl is installed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.workers.config import PolicyLossConfig as VerlPolicyLossConfig


@dataclass
class PolicyLossConfig(VerlPolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus ``atr_params``: parameters of ``atr_grpo_<method>`` losses (see module)."""

    atr_params: dict[str, Any] = field(default_factory=dict)
