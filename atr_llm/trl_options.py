"""TRL's GRPOConfig options that act on the loss, honoured by ATRGRPOTrainer: each one mapped onto a layer of
``atr_theory.policy_loss``, TRL's entropy bonus (static and adaptive), and TRL's metric names.

The rule itself (``loss_type`` cispo / sapo / vespo, ``epsilon``, ``epsilon_high``, ``delta``) is mapped in
``trl_rule``: a loss type that is a rule of its own is declared where that rule is registered (``MethodSpec.trl``,
an ``atr_theory.TRLPeer``: the fields TRL reads, the parameters they give, TRL's metrics and aggregation).
``tests/test_trl_options.py`` pins every option against TRL's own GRPOTrainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

import atr_theory as at
from atr_theory.layers import SequenceMask
from atr_theory.registry import rule_for_trl_loss_type


@dataclass(frozen=True)
class TRLLossType:
    """What one of TRL's ``loss_type`` values means here: an aggregation of ``atr_theory.AGGREGATIONS`` and whether
    TRL divides the token sum by the generation batch's token count (``num_items_in_batch``) instead."""

    aggregation: str
    by_generation_tokens: bool = False


# TRL 1.16's loss_type values that are only an aggregation (GRPOTrainer._compute_loss), for its PPO-clip family; a
# loss type that is a rule of its own (cispo, sapo, vespo) is declared with that rule (``MethodSpec.trl``)
TRL_CLIP_FAMILY_LOSS_TYPES = {
    "grpo": TRLLossType("seq_mean_token_mean"),
    "bnpo": TRLLossType("token_mean"),
    "dr_grpo": TRLLossType("dr_grpo"),
    "dapo": TRLLossType("token_mean", by_generation_tokens=True),
    "luspo": TRLLossType("seq_mean_token_sum"),
}


def trl_loss_types() -> dict[str, TRLLossType]:
    """Every TRL ``loss_type`` this package honours, with its aggregation: the PPO-clip family's, then each
    registered rule's ``TRLPeer`` (in registration order)."""
    peers = {
        spec.trl.loss_type: TRLLossType(spec.trl.aggregation, spec.trl.by_generation_tokens)
        for name in at.method_names(aliases=False)
        if (spec := at.METHODS[name]).trl is not None
    }
    return {**TRL_CLIP_FAMILY_LOSS_TYPES, **peers}


def trl_loss_type_rule(loss_type: str) -> str | None:
    """The registry rule TRL's ``loss_type`` is (its ``MethodSpec.trl``), None for the PPO-clip family (grpo, bnpo,
    dr_grpo, dapo, luspo), whose rule is the config's ``method``."""
    spec = rule_for_trl_loss_type(loss_type)
    return None if spec is None else spec.name

# method="trl": the registry rule TRL's GRPOTrainer applies for the config, its parameters read from TRL's fields
TRL_METHOD = "trl"


def trl_rule(args) -> tuple[str, dict[str, float]]:
    """The registry rule and parameters that TRL 1.16's GRPOTrainer applies for ``args`` (``method='trl'``).

    ``cispo``: TRL caps the detached weight at ``epsilon_high`` (no lower bound): the registry's cispo with
    ``epsilon_low = 1``, ``epsilon_high = cap - 1``. ``sapo``: ``sapo_temperature_pos / _neg``. ``vespo``: its four
    fields. The PPO-clip family (grpo, bnpo, dr_grpo, dapo, luspo): ``clip_higher(epsilon, epsilon_high or
    epsilon)``; with TRL's ``delta``, ``min(min(w, delta) A, clip(w) A)``, which is ``dual_clip_higher`` with
    ``c = delta`` when ``delta >= 1 + epsilon_high``, and with the upper bound ``delta`` and ``c = 1 + epsilon_high``
    below it (tests: TRL's own loss on the same batch)."""
    spec = rule_for_trl_loss_type(args.loss_type)
    if spec is not None:
        return spec.name, spec.trl.params(args)
    eps_low = args.epsilon
    eps_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    delta = getattr(args, "delta", None)
    if delta is None:
        return "clip_higher", {"epsilon_low": eps_low, "epsilon_high": eps_high}
    return two_sided_clip(eps_low, eps_high, delta)


def two_sided_clip(epsilon_low: float, epsilon_high: float, delta: float) -> tuple[str, dict[str, float]]:
    """TRL's ``delta`` (INTELLECT-2's two-sided clipping) on PPO's min with the range ``[1 - epsilon_low, 1 +
    epsilon_high]``: ``min(min(w, delta) A, clip(w) A)``, which is ``dual_clip_higher`` with ``c = delta`` when
    ``delta >= 1 + epsilon_high``, and with the upper bound ``delta`` and ``c = 1 + epsilon_high`` below it."""
    if delta <= 1.0:
        raise ValueError(
            f"delta={delta!r}: TRL's two-sided clip caps every ratio at delta, so delta <= 1 caps each token's ratio at or "
            "below 1 (no trust region around w = 1); expected delta > 1 (INTELLECT-2 uses delta > 1 + epsilon_high; "
            "the paper's divergence threshold is --divergence_delta)"
        )
    if delta >= 1.0 + epsilon_high:
        return "dual_clip_higher", {"epsilon_low": epsilon_low, "epsilon_high": epsilon_high, "dual_clip_c": delta}
    return "dual_clip_higher", {
        "epsilon_low": epsilon_low,
        "epsilon_high": delta - 1.0,
        "dual_clip_c": 1.0 + epsilon_high,
    }


def trl_delta_rules() -> tuple[str, ...]:
    """Rules whose min form is PPO's min with a finite ratio range (``MethodSpec.ratio_range``, at their defaults):
    TRL's ``delta`` composes with them as it does with TRL's own clip (``range_rule_with_trl_delta``)."""
    names = []
    for name in at.method_names(aliases=False):
        spec = at.METHODS[name]
        if spec.ratio_range is not None and math.isfinite(float(spec.ratio_range(**spec.defaults)[1])):
            names.append(name)
    return tuple(names)


def range_rule_with_trl_delta(rule: str, params: dict[str, float], delta: float) -> tuple[str, dict[str, float]]:
    """``rule`` (of ``trl_delta_rules``, in its min form, with ``params``) under TRL's ``delta``: TRL's two-sided clip
    on the rule's range, ``two_sided_clip(1 - l, u - 1, delta)``."""
    spec = at.get_method(rule)
    lower, upper = spec.ratio_range(**{**spec.defaults, **params})
    return two_sided_clip(1.0 - float(lower), float(upper) - 1.0, delta)


def trl_rule_fields() -> tuple[str, ...]:
    """The TRL fields that ``method='trl'`` reads (they are not stray parameters of the rule it maps to): the PPO-clip
    family's ``epsilon``, ``epsilon_high`` and ``delta``, and every field a rule's ``TRLPeer`` reads."""
    peers = [f for spec in at.METHODS.values() if spec.trl is not None for f in spec.trl.fields]
    return tuple(dict.fromkeys(("epsilon", "epsilon_high", "delta", *peers)))


def default_method(method: str | None, loss_type: str) -> str:
    """``method`` if given; unset: ``'trl'`` for a loss type that is a rule of its own (cispo, sapo, vespo: TRL's
    rule with TRL's parameters), else ``'atr'`` (the paper's rule)."""
    if method is not None:
        return method
    return TRL_METHOD if trl_loss_type_rule(loss_type) is not None else "atr"


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
    # a loss type that is a rule always trains TRL's rule with TRL's parameters (check_method_config)
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
