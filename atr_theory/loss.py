r"""``policy_loss``: ratio -> method -> per-token objective -> aggregation -> metrics.

The one loss function of the package: the bandit simulator and the LLM trainer both call it.

Examples
--------
>>> import torch, atr_theory as at
>>> logp = torch.log(torch.tensor([[0.30, 0.20, 0.50]], requires_grad=False))
>>> old = torch.log(torch.tensor([[0.20, 0.20, 0.25]]))
>>> out = at.policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 3, dtype=torch.bool), method="atr")
>>> round(out.metrics["frac_masked"], 4)  # w = 2 lies outside [0.671, 1.422]; w = 1.5 too
0.6667
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .layers import (
    RATIO_LEVELS,
    RolloutCorrection,
    SequenceMask,
    high_entropy_mask,
    rollout_correction_weights,
    sequence_log_ratio,
    sequence_mask_keep,
)
from .loss_inputs import (
    LOGP_TOLERANCE,
    ValueCheck,
    check_layers,
    check_scalars,
    check_structure,
    check_topk_pair,
    finite_probe,
    refuse_bad_values,
    rule_generator,
)
from .loss_output import LossOutput, nearest_rank_quantiles, outside_by_advantage
from .methods import FORMS, MethodResult, ResolvedMethod, TokenBatch, resolve

__all__ = [
    "policy_loss",
    "LossOutput",
    "AGGREGATIONS",
    "aggregate",
    "check_aggregation",
    "nearest_rank_quantiles",
    "outside_by_advantage",
    "LOG_RATIO_CLAMP",
    "LOGP_TOLERANCE",
    "FORMS",
    "rule_generator",
]

LOG_RATIO_CLAMP = 60.0
"""log w is clamped to [-60, 60] before exponentiation (exp(60) ~ 1e26 is finite in float32 and far
outside any trust region; verl clamps at 20). The clamp has zero gradient beyond it."""

# Each aggregation takes a (B, T) per-token quantity that is already zero on padding, the boolean mask and
# max_length, and returns the scalar (a bool mask sums to an integer count: no float copy of it is made).
AGGREGATIONS = {
    # Liu et al. 2025 (Dr. GRPO): sum / (B * max_length); the paper's backbone
    "dr_grpo": lambda x, m, L: x.sum() / (x.shape[0] * L),
    # Yu et al. 2025 (DAPO): mean over all valid tokens of the batch
    "token_mean": lambda x, m, L: x.sum() / m.sum().clamp(min=1),
    # Shao et al. 2024 (GRPO): per-sequence mean, then mean over sequences
    "seq_mean_token_mean": lambda x, m, L: (x.sum(-1) / m.sum(-1).clamp(min=1)).mean(),
    # per-sequence sum, then mean over sequences
    "seq_mean_token_sum": lambda x, m, L: x.sum(-1).mean(),
    # sum over all valid tokens, no normalisation (verl 'token-sum')
    "token_sum": lambda x, m, L: x.sum(),
}


def check_aggregation(aggregation: str) -> str:
    """``aggregation`` if it names an entry of ``AGGREGATIONS``, else ValueError listing them."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; known: {', '.join(AGGREGATIONS)}")
    return aggregation


def aggregate(
    objective: torch.Tensor, mask: torch.Tensor, aggregation: str, max_length: int | None = None
) -> torch.Tensor:
    """Aggregate a (B, T) per-token quantity over valid tokens (see ``AGGREGATIONS``)."""
    m = mask.to(objective.dtype)
    L = objective.shape[-1] if max_length is None else max_length
    return AGGREGATIONS[check_aggregation(aggregation)](objective * m, mask.bool(), L)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    method: str | ResolvedMethod = "atr",
    form: str | None = None,
    aggregation: str = "dr_grpo",
    max_length: int | None = None,
    old_full_logp: torch.Tensor | None = None,
    full_logp: torch.Tensor | None = None,
    *,
    generator: torch.Generator | None = None,
    token_weights: torch.Tensor | None = None,
    kl_chunk_size: int | None = None,
    position_kl: torch.Tensor | None = None,
    old_topk_logp: torch.Tensor | None = None,
    topk_logp: torch.Tensor | None = None,
    validate: bool = True,
    ratio_level: str = "token",
    sequence_mask: SequenceMask | None = None,
    behaviour_logp: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    top_entropy_quantile: float = 1.0,
    rollout_correction: RolloutCorrection | None = None,
    **params: float,
) -> LossOutput:
    r"""Clipped policy-gradient loss of ``method`` (see ``atr_theory.METHODS``).

    The paper's Eq. 2 with the rule's per-token objective \(o_t\): the loss is \(-\operatorname{aggregate}_t\, o_t\),
    where a rule of the unified framework (Eq. 5) has \(o_t = w_t A_t\) where its constraint holds and the constant
    \(o_t = A_t\) elsewhere (the token is frozen), \(w_t = \pi_\theta(y_t) / \pi_{\text{old}}(y_t)\).

    Parameters
    ----------
    logp, old_logp : torch.Tensor
        (B, T) log-probabilities of the sampled tokens under pi_theta and under pi_old (a constant); values on
        masked-out positions are ignored.
    advantages : torch.Tensor
        (B,) or (B, T). ``mask``: (B, T) bool or 0/1, the tokens that count.
    method : str or ResolvedMethod
        A registered name with its parameters as ``**params`` (``delta``, ``epsilon``, ...), or a choice resolved once
        by ``atr_theory.resolve`` (then ``form`` and ``**params`` stay empty).
    form : str, optional
        ``"min"`` (the rule's clip inside PPO's min: the paper's Section 2 surrogate) or ``"mask"`` (pure clip: its
        Section 4 objective); None: the method's default.
    aggregation, max_length : str, int
        ``dr_grpo`` (sum / (B max_length), ``max_length`` an integer >= T, default T), ``token_mean``,
        ``seq_mean_token_mean``, ``seq_mean_token_sum`` or ``token_sum`` (``AGGREGATIONS``).
    old_full_logp, full_logp : torch.Tensor, optional
        (B, T, V), for a method that needs the full distributions (entries may be -inf); ``position_kl`` ((B, T)
        ``KL(pi_old || pi)`` per position, e.g. ``atr_theory.head_kl_chunked``'s) replaces them; ``kl_chunk_size``:
        positions per chunk of the full KLs.
    old_topk_logp, topk_logp : torch.Tensor, optional
        (B, T, K), for a method that reads the top-K (``dppo_topk_*``): both policies' log-probs of the K tokens pi_old
        found most likely (``atr_theory.topk_logps``), constants.
    generator : torch.Generator, optional
        For a rule that draws at random (clip_cov), and only there (``rule_generator``).
    token_weights : torch.Tensor, optional
        (B, T) constant multiplier of the per-token objective, >= 0 (e.g. TRL's vLLM importance-sampling correction).
    validate : bool
        Check the values this call reads on valid positions (``atr_theory.loss_inputs`` lists them) with one host
        read on a clean batch, else a ValueError naming the argument, the kind and the position. ``False``: no host
        read (``torch.compile(fullgraph=True)`` works for every method but ``clip_cov``); a NaN gives a NaN loss.
    ratio_level : str
        ``"token"`` or ``"sequence"`` (every token sees ``exp(mean_t log w_t)``: TRL's ``importance_sampling_level``).
    sequence_mask, rollout_correction, behaviour_logp : optional
        Layers (``atr_theory.layers``): a ``SequenceMask`` drops the sequences or tokens it rejects (DeepSeek-V3.2,
        verl's ``rollout_rs``); a ``RolloutCorrection`` multiplies by the detached weight ``pi_old / pi_behaviour``
        (or ``sg[pi] / pi_old`` without ``behaviour_logp``: verl's bypass mode); ``behaviour_logp`` is the (B, T)
        log-prob of the policy that sampled (default ``old_logp``).
    entropies, top_entropy_quantile : torch.Tensor, float
        Only the fraction ``top_entropy_quantile`` in [0, 1] of highest-entropy valid tokens keeps its loss
        (``atr_theory.layers.high_entropy_mask``; 1 = all).
    **params : float
        The method's parameters.

    Returns
    -------
    LossOutput
        ``loss`` (scalar, to minimise), ``per_token`` ((B, T) objective, 0 on padding) and ``metrics`` (floats,
        computed on first access).
    """
    choice = _resolved_choice(method, form, params)
    optional = {
        "token_weights": token_weights,
        "behaviour_logp": behaviour_logp,
        "position_kl": position_kl,
        "entropies": entropies,
        "old_full_logp": old_full_logp,
        "full_logp": full_logp,
        "old_topk_logp": old_topk_logp,
        "topk_logp": topk_logp,
    }
    shape = check_structure(logp, old_logp, advantages, mask, optional)
    scalars = (aggregation, max_length, kl_chunk_size, generator, top_entropy_quantile, validate, ratio_level)
    _check_call(choice, optional, shape[1], mask, *scalars, sequence_mask, rollout_correction)
    p = _prepare(logp, old_logp, advantages, mask, token_weights, behaviour_logp, position_kl, validate)
    reads_behaviour = sequence_mask is not None or rollout_correction is not None
    log_ratio = _log_ratio(p, choice, optional, validate, reads_behaviour, top_entropy_quantile)
    rule_log_ratio = (
        log_ratio if ratio_level == "token" else sequence_log_ratio(torch.where(p.mask, log_ratio, p.zero), p.mask)
    )
    batch = _token_batch(choice, p, rule_log_ratio, generator, optional, kl_chunk_size)
    result = choice.spec.fn(batch, **choice.params)  # the one evaluation of the rule in this call
    objective, dropped = _apply_layers(
        result.objective, p, sequence_mask, entropies, top_entropy_quantile, rollout_correction
    )
    per_token = objective if p.all_valid else torch.where(p.mask, objective, p.zero)
    max_len = shape[1] if max_length is None else int(max_length)
    return LossOutput(
        loss=-AGGREGATIONS[aggregation](per_token, p.mask, max_len),
        per_token=per_token,
        result=result,
        log_ratio=rule_log_ratio.detach(),
        mask=p.mask,
        dropped=dropped,
        advantages=p.advantages.detach(),
        mask_form_kept=_mask_form_kept(choice, result),
    )


def _resolved_choice(method: str | ResolvedMethod, form: str | None, params: dict[str, Any]) -> ResolvedMethod:
    """``method`` resolved with ``form`` and ``params`` (``atr_theory.resolve``), or as given when already resolved
    (then ``form`` and ``params`` must be empty)."""
    if not isinstance(method, ResolvedMethod):
        return resolve(method, form, **params)
    if form is not None or params:  # validated once by the caller (the trainer, at config time)
        raise ValueError(
            f"method is an already resolved choice ({method.name!r}, form {method.form!r}); pass its form and "
            f"parameters to resolve(), not here (got form={form!r}, parameters {sorted(params)})"
        )
    return method


def _check_call(
    choice: ResolvedMethod,
    optional: dict[str, Any],
    length: int,
    mask: torch.Tensor,
    aggregation: str,
    max_length: Any,
    kl_chunk_size: Any,
    generator: Any,
    top_entropy_quantile: Any,
    validate: Any,
    ratio_level: Any,
    sequence_mask: Any,
    rollout_correction: Any,
) -> None:
    """ValueError for a bad scalar argument of ``policy_loss`` (``length``: the batch's T), a layer it cannot apply
    (``check_layers``), or a mask holding other values than 0 and 1 (read only when validating)."""
    check_aggregation(aggregation)
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {ratio_level!r}")
    check_scalars(max_length, aggregation, length, kl_chunk_size, generator, top_entropy_quantile)
    if not isinstance(validate, bool):
        raise ValueError(f"validate must be True or False, got {validate!r}")
    if choice.spec.needs_topk:
        check_topk_pair(optional["old_topk_logp"], optional["topk_logp"], choice.name)
    check_layers(choice, optional, kl_chunk_size, generator, sequence_mask, rollout_correction, top_entropy_quantile)
    if validate and mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        bad = mask[(mask != 0) & (mask != 1)][0].item()
        raise ValueError(f"mask must be boolean or hold only 0 and 1, got the value {bad!r}")


@dataclass
class _Prepared:
    """``policy_loss``'s tensors in the loss's dtype (float32 or wider), constants detached, and every padding
    position replaced by 0 unless the batch has none (``all_valid``, known only when validating)."""

    mask: torch.Tensor  # (B, T) bool
    dtype: torch.dtype
    all_valid: bool
    zero: torch.Tensor
    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor  # (B, T)
    weights: torch.Tensor | None
    behaviour: torch.Tensor | None
    position_kl: torch.Tensor | None  # not detached: truly_ppo differentiates through it
    log_ratio: torch.Tensor  # logp - old_logp, not yet clamped
    given: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # logp, old_logp, advantages as given (errors name them)


def _prepare(logp, old_logp, advantages, mask, token_weights, behaviour_logp, position_kl, validate) -> _Prepared:
    """``_Prepared`` of ``policy_loss``'s tensors. Without validation nothing may read a value on the host, so the
    padding is always replaced; with it, a batch without padding skips that work."""
    m = mask.bool() if mask.dtype != torch.bool else mask
    dtype = torch.promote_types(logp.dtype, torch.float32)
    adv = advantages.detach().to(dtype)
    if adv.ndim == 1:
        adv = adv.unsqueeze(-1).expand(m.shape)
    all_valid = validate and int(torch.count_nonzero(m)) == m.numel()  # count_nonzero: ~5x faster than all() here
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    weights = None if token_weights is None else token_weights.detach().to(dtype)
    behaviour = None if behaviour_logp is None else behaviour_logp.detach().to(dtype)
    if position_kl is not None:
        position_kl = position_kl.to(dtype) if all_valid else torch.where(m, position_kl.to(dtype), zero)
    if all_valid:
        lp, olp = logp.to(dtype), old_logp.detach().to(dtype)
    else:  # padding may hold anything (NaN, -inf): replace it before it can reach a value or a gradient
        lp = torch.where(m, logp.to(dtype), zero)
        olp = torch.where(m, old_logp.detach().to(dtype), zero)
        adv = torch.where(m, adv, zero)
        weights = None if weights is None else torch.where(m, weights, zero)
    given = (logp, old_logp, advantages)
    return _Prepared(m, dtype, all_valid, zero, lp, olp, adv, weights, behaviour, position_kl, lp - olp, given)


def _read_optional(
    choice: ResolvedMethod,
    optional: dict[str, Any],
    dtype: torch.dtype,
    reads_behaviour: bool,
    top_entropy_quantile: float,
) -> list[ValueCheck]:
    """The optional tensors other than ``token_weights`` this call reads, as ``ValueCheck``s: ``behaviour_logp`` where a layer reads it,
    ``position_kl`` or the full distributions for a method that needs them, the top-K for one that reads it, the
    entropies for ``top_entropy_quantile < 1``."""
    checks = []
    if optional["behaviour_logp"] is not None and reads_behaviour:
        checks.append(ValueCheck("behaviour_logp", optional["behaviour_logp"], "logp", dtype))
    if choice.spec.needs_full_distributions and optional["position_kl"] is not None:  # read instead of the full ones
        checks.append(ValueCheck("position_kl", optional["position_kl"], "finite", dtype))
    elif choice.spec.needs_full_distributions:  # full_kl upcasts them itself: checked as given
        checks += [
            ValueCheck(n, optional[n], "full") for n in ("old_full_logp", "full_logp") if optional[n] is not None
        ]
    if choice.spec.needs_topk:
        checks += [ValueCheck(n, optional[n], "topk", dtype) for n in ("old_topk_logp", "topk_logp")]
    if top_entropy_quantile < 1.0:
        checks.append(ValueCheck("entropies", optional["entropies"], "finite"))
    return checks


def _log_ratio(
    p: _Prepared,
    choice: ResolvedMethod,
    optional: dict[str, Any],
    validate: bool,
    reads_behaviour: bool,
    top_entropy_quantile: float,
) -> torch.Tensor:
    """log w on every position, clamped to ``+-LOG_RATIO_CLAMP``; with ``validate``, after checking every value the
    call reads (``_checked_log_ratio``)."""
    if not validate:
        return torch.clamp(p.log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    logp, old_logp, advantages = p.given
    always = [
        ValueCheck("logp", logp, "logp"),
        ValueCheck("old_logp", old_logp, "logp", p.dtype),
        ValueCheck("advantages", advantages, "finite", p.dtype),
    ]
    if optional["token_weights"] is not None:
        always.append(ValueCheck("token_weights", optional["token_weights"], "weight", p.dtype))
    read_here = _read_optional(choice, optional, p.dtype, reads_behaviour, top_entropy_quantile)
    return _checked_log_ratio(p, always, read_here)


def _token_batch(
    choice: ResolvedMethod,
    p: _Prepared,
    rule_log_ratio: torch.Tensor,
    generator: torch.Generator | None,
    optional: dict[str, Any],
    kl_chunk_size: int | None,
) -> TokenBatch:
    """The ``TokenBatch`` a rule reads: the prepared tensors, the top-K detached in the loss's dtype."""
    old_topk, topk = optional["old_topk_logp"], optional["topk_logp"]
    if choice.spec.needs_topk:
        old_topk, topk = old_topk.detach().to(p.dtype), topk.detach().to(p.dtype)
    return TokenBatch(
        rule_log_ratio,
        p.advantages,
        p.mask,
        p.logp,
        p.old_logp,
        choice.form,
        generator,
        optional["old_full_logp"],
        optional["full_logp"],
        kl_chunk_size,
        p.position_kl,
        old_topk,
        topk,
    )


def _checked_log_ratio(p: _Prepared, always: list[ValueCheck], extra: list[ValueCheck]) -> torch.Tensor:
    """``p.log_ratio``, clamped to ``+-LOG_RATIO_CLAMP`` only where it goes beyond, after checking every value the
    loss reads on valid positions (``always``: the log-probs, advantages and weights, probed here through ``p``;
    ``extra``: the optional tensors, probed by ``finite_probe``): one fused reduction decides (NaN and +-inf propagate into min / max and sums;
    log-probs above ``LOGP_TOLERANCE`` and negative weights are turned into NaN), so a clean batch pays one host
    read; the detailed scan (``refuse_bad_values``, naming the argument and the position) runs on the error path
    only."""
    y_min, y_max = torch.aminmax(p.log_ratio.detach())
    check = y_min + y_max + p.advantages.sum()
    top_logp = torch.maximum(p.logp.detach().amax(), p.old_logp.amax())  # padding holds 0 here
    check = check + torch.where(top_logp > LOGP_TOLERANCE, math.nan, 0.0)
    if p.weights is not None:
        check = check + p.weights.sum() + torch.where(p.weights.amin() < 0, math.nan, 0.0)
    for c in extra:
        check = check + finite_probe(c, p.mask, p.all_valid)
    if not bool(torch.isfinite(check)):
        for c in always + extra:
            refuse_bad_values(c, p.mask)  # raises naming the argument and the position
        if not bool(torch.isfinite(y_min + y_max)):
            raise ValueError("log-ratio logp - old_logp overflows; log-probs must be finite and <= 0")
    if float(y_min) < -LOG_RATIO_CLAMP or float(y_max) > LOG_RATIO_CLAMP:
        return torch.clamp(p.log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return p.log_ratio


def _apply_layers(
    objective: torch.Tensor,
    p: _Prepared,
    sequence_mask: SequenceMask | None,
    entropies: torch.Tensor | None,
    top_entropy_quantile: float,
    rollout_correction: RolloutCorrection | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The rule's per-token ``objective`` after the layers (``atr_theory.layers``), in this order: the sequence
    mask and the entropy mask set a dropped token's objective to 0, the rollout correction multiplies by its
    detached weight (and drops where it masks), ``token_weights`` multiply last. Returns the objective and
    ``{layer: the tokens it dropped}``."""
    dropped: dict[str, torch.Tensor] = {}
    if sequence_mask is not None:
        reference = p.old_logp if p.behaviour is None else p.behaviour
        dropped["sequence_mask"] = ~sequence_mask_keep(p.logp.detach() - reference, p.advantages, p.mask, sequence_mask)
    if top_entropy_quantile < 1.0:
        dropped["entropy_mask"] = ~high_entropy_mask(entropies, p.mask, float(top_entropy_quantile))
    for drop in dropped.values():
        objective = torch.where(drop, p.zero, objective)
    if rollout_correction is not None:
        if p.behaviour is None:  # bypass: old_logp is the behaviour policy, the proximal one is pi itself
            log_rho = p.logp.detach() - p.old_logp
        else:
            log_rho = p.old_logp - p.behaviour
        rho = rollout_correction_weights(log_rho, p.mask, rollout_correction)
        if rollout_correction.mode == "mask":
            dropped["rollout_correction"] = (rho == 0) & p.mask
        objective = objective * rho
    if p.weights is not None:
        objective = objective * p.weights
    return objective, dropped


def _mask_form_kept(choice: ResolvedMethod, result: MethodResult) -> Callable[[], torch.Tensor] | None:
    """What ``LossOutput.mask_form_kept`` reads: the kept tokens of a mask-form run, the rule's own
    ``MethodResult.mask_form_kept`` for a rule with a mask form run in another form (no second evaluation), else
    None."""
    if choice.form == "mask":
        return lambda: result.kept
    if "mask" in choice.spec.forms:
        return result.mask_form_kept
    return None
