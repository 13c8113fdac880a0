r"""Rules with no ratio clip at all: REINFORCE / GPG (the plain policy gradient ``A log pi``) and DRO (the policy
gradient with a quadratic penalty on ``log w``). Every token is kept."""

from __future__ import annotations

from ..registry import MethodResult, Param, TokenBatch, register, unclipped_result
from . import _reference as plain

__all__ = ["dro", "reinforce"]


def reinforce_reference(logp, old_logp, advantages, mask):
    """REINFORCE (Williams 1992) / GPG: ``A log pi``."""
    _, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    return adv * logp


@register(
    "reinforce",
    verl_loss_mode="gpg",
    reference_form=reinforce_reference,
    params={},
    default_form="none",
    forms=("none",),
    reference="Williams 1992 (REINFORCE); Chu et al. 2025 (GPG, arXiv 2504.02546); verl 'gpg' and bypass mode "
    "loss_type='reinforce'",
    aliases=("gpg",),
)
def reinforce(batch: TokenBatch) -> MethodResult:
    r"""The plain policy gradient: objective ``A log pi``, gradient ``A grad log pi``, no ratio and no clipping.

    With a rollout correction (``atr_theory.layers.RolloutCorrection``) it is verl's bypass-mode REINFORCE
    ``sg[rho] A log pi``; with a token k3 mask on top it has ATR's gradient (``docs/methods.md``)."""
    return unclipped_result(batch.advantages * batch.logp, batch)


# --8<-- [start:dro]  (docs/adding-a-rule.md shows the rule from here)
def dro_reference(logp, old_logp, advantages, mask, *, dro_beta):
    """DRO (Richemond et al. 2024): ``A log pi - beta / 2 (log pi - log pi_old)^2``."""
    _, adv = plain.ratio_and_advantages(logp, old_logp, advantages, mask)
    return adv * logp - 0.5 * dro_beta * (logp - old_logp) ** 2


@register(
    "dro",
    verl_loss_mode="dro",
    reference_form=dro_reference,
    params={
        "dro_beta": Param(
            0.1,
            gt=0,
            help="DRO: weight of the quadratic log-ratio penalty (verl dro_beta)",
            verl=(("policy_loss", "dro_beta"),),
        )
    },
    default_form="none",
    forms=("none",),
    reference="Richemond et al. 2024 (DRO, arXiv 2405.19107); verl 'dro'",
)
def dro(batch: TokenBatch, dro_beta: float) -> MethodResult:
    r"""Direct reward optimisation: ``A log pi - (beta / 2) (log w)^2``, the policy gradient with a quadratic
    penalty on the log-ratio instead of a clip (its gradient ``(A - beta log w) grad log pi``); every token is
    kept."""
    return unclipped_result(batch.advantages * batch.logp - 0.5 * dro_beta * batch.log_ratio.square(), batch)


# --8<-- [end:dro]
