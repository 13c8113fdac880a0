"""TRL's GRPOConfig options that act on the loss while it is computed, honoured by ATRGRPOTrainer: each one mapped
onto a layer of ``atr_theory.policy_loss``, TRL's entropy bonus (static and adaptive), and TRL's metric names.

Which rule a config trains (``loss_type`` cispo / sapo / vespo, ``epsilon``, ``epsilon_high``, ``delta``) is decided
once, when the config is built (``atr_llm.config.trainer_config``). ``tests/test_trl_options.py`` pins every option against
TRL's own GRPOTrainer.
"""

from __future__ import annotations

import math
from typing import Any

import torch

import atr_theory as at
from atr_theory.layers import SequenceMask
from atr_theory.registry import rule_for_trl_loss_type

from .config.trainer_config import TRL_METHOD


def trl_option_layers(args) -> dict[str, Any]:
    """The ``atr_theory.policy_loss`` keywords for TRL's ``importance_sampling_level`` (``ratio_level``) and
    ``off_policy_mask_threshold`` (DeepSeek-V3.2's off-policy sequence mask: ``SequenceMask("k1", "mean", delta,
    "negative")``). ``top_entropy_quantile`` needs the step's entropies: the trainer adds it."""
    layers: dict[str, Any] = {}
    level = getattr(args, "importance_sampling_level", "token")
    if level != "token":
        layers["ratio_level"] = level
    threshold = getattr(args, "off_policy_mask_threshold", None)
    if threshold is not None:
        layers["sequence_mask"] = SequenceMask("k1", "mean", float(threshold), "negative")
    return layers


def _masked_sequence_mean(flag: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) mean of ``flag`` over each sequence's valid tokens (NaN for an empty sequence, as TRL)."""
    m = mask.to(torch.float64)
    return (flag.to(torch.float64) * m).sum(-1) / m.sum(-1)


def _trl_clip_flags(out: at.LossOutput, adv: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens TRL 1.16 counts as clipped low / high for its PPO-clip family: those the registry's ``clip_higher``
    (min form, TRL's ``epsilon`` / ``epsilon_high``) clips, evaluated on the ratio TRL compares, ``min(w, delta)``
    (TRL reports the range's clipping, not the cap's: with ``delta < 1 + epsilon_high`` nothing counts as high)."""
    eps_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    delta = getattr(args, "delta", None)
    y = out.log_ratio if delta is None else torch.clamp(out.log_ratio, max=math.log(delta))
    batch = at.TokenBatch(y, adv.expand_as(y), out.mask, y, torch.zeros_like(y), "min")
    result = at.get_method("clip_higher").fn(batch, epsilon_low=args.epsilon, epsilon_high=eps_high)
    return result.clipped_low, result.clipped_high


def trl_metrics(out: at.LossOutput, advantages: torch.Tensor, token_log_ratio: torch.Tensor, args) -> dict[str, float]:
    """TRL 1.16's loss metrics under TRL's names: ``clip_ratio/{low_mean, high_mean, region_mean, low_min,
    high_max}`` (the PPO-clip family), ``cispo_clip_ratio``, ``vespo/phi_seq_mean``. With ``method='trl'`` each is
    TRL's own definition (its clip flags read the ratio after TRL's ``delta`` cap); with a registry method the
    ``clip_ratio`` names carry that rule's own flags (what it clipped low / high). At the sequence level TRL averages
    over sequences, else over tokens; one process's values (the trainer averages them over processes)."""
    m = out.mask
    adv = advantages.detach()
    adv = adv.unsqueeze(-1) if adv.ndim == 1 else adv
    level = getattr(args, "importance_sampling_level", "token")

    def mean(flag: torch.Tensor) -> float:
        if level == "sequence":
            return float(_masked_sequence_mean(flag, m).nanmean())
        return float((flag & m).sum()) / max(int(m.sum()), 1)

    spec = rule_for_trl_loss_type(args.loss_type)
    if spec is None:
        low, high = out.result.clipped_low, out.result.clipped_high
        if args.method == TRL_METHOD:  # TRL's flags: Clip-Higher's at TRL's epsilons, on the ratio capped at delta
            low, high = _trl_clip_flags(out, adv, args)
        return {
            "clip_ratio/low_mean": mean(low),
            "clip_ratio/high_mean": mean(high),
            "clip_ratio/region_mean": mean(low | high),
            "clip_ratio/low_min": float(_masked_sequence_mean(low, m).nan_to_num(math.inf).min()),
            "clip_ratio/high_max": float(_masked_sequence_mean(high, m).nan_to_num(-math.inf).max()),
        }
    # a loss type that is a rule always trains TRL's rule with TRL's parameters (atr_llm.config.trainer_config.resolve_method)
    return spec.trl.metrics(out, adv, token_log_ratio, spec.trl.params(args), mean)


class EntropyBonus:
    """TRL's entropy bonus: ``loss - coef * H`` with ``H`` the mean entropy of the tokens the policy loss acts on,
    divided by the accumulation steps (not by a loss type's normaliser). Adaptive (Skywork-OR1; TRL
    ``use_adaptive_entropy``): after each optimizer step ``coef`` moves by ``entropy_coef_delta`` (up when the
    window's token-weighted entropy is ``<= entropy_target``, else down, within ``[entropy_coef_min, _max]``), and
    the bonus applies only while the last window's entropy is ``<= entropy_target``."""

    def __init__(self, args):
        self.coef = float(args.entropy_coef)
        self.adaptive = bool(args.use_adaptive_entropy)
        self.target = float(args.entropy_target)
        self.step, self.low, self.high = args.entropy_coef_delta, args.entropy_coef_min, args.entropy_coef_max
        self.last_window_entropy = math.inf  # no bonus before the first measurement (as TRL)
        self._window: torch.Tensor | None = None

    @classmethod
    def from_args(cls, args) -> EntropyBonus | None:
        enabled = getattr(args, "entropy_coef", 0.0) != 0.0 or getattr(args, "use_adaptive_entropy", False)
        return cls(args) if enabled else None

    def term(self, entropies: torch.Tensor, mask: torch.Tensor, accumulation: float, accelerator, mode: str):
        """The bonus to subtract from this micro-batch's loss; updates the adaptive coefficient at a step's end."""
        m = mask.to(entropies.dtype)
        total, count = (entropies * m).sum(), m.sum()
        mean_entropy = total / count.clamp(min=1.0) / accumulation
        applied = self.coef if not self.adaptive or self.last_window_entropy <= self.target else 0.0
        if self.adaptive and mode == "train":
            stats = torch.stack([total, count]).detach()
            self._window = stats if self._window is None else self._window + stats
            if accelerator.sync_gradients:
                window = accelerator.reduce(self._window, reduction="sum")
                entropy = (window[0] / window[1].clamp(min=1.0)).item()
                if entropy <= self.target:
                    self.coef = min(self.coef + self.step, self.high)
                else:
                    self.coef = max(self.coef - self.step, self.low)
                self.last_window_entropy, self._window = entropy, None
        return applied * mean_entropy


class EntropyBonusField:
    """A trainer attribute of TRL's entropy controller (``entropy_coef``, ``_last_world_entropy``) that reads and
    writes ``field`` of the trainer's ``EntropyBonus``; TRL's ``__init__`` sets it before the bonus exists, when it
    is kept on the instance until then."""

    def __init__(self, field: str, default: float):
        self.field, self.default = field, default

    def __set_name__(self, owner, name: str) -> None:
        self.before_bonus = f"_{name}_before_bonus"

    def __get__(self, trainer, owner=None):
        if trainer is None:
            return self
        bonus = trainer.__dict__.get("_entropy_bonus")
        return getattr(bonus, self.field) if bonus is not None else trainer.__dict__.get(self.before_bonus, self.default)

    def __set__(self, trainer, value) -> None:
        bonus = trainer.__dict__.get("_entropy_bonus")
        if bonus is not None:
            setattr(bonus, self.field, float(value))
        else:
            trainer.__dict__[self.before_bonus] = value
