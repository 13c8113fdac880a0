"""The inputs of ``atr_theory.policy_loss``, checked: the tensors' types, shapes, devices and dtypes (metadata only),
the scalars' domains, and the values on valid positions (finite; log-probs <= ``LOGP_TOLERANCE``; token weights
>= 0), the last by one fused reduction on a clean batch and a detailed scan, naming the argument and the position,
on the error path only. ``rule_generator`` passes a generator only to a rule that draws from it.

What ``policy_loss(..., validate=True)`` reads, and so checks: ``logp``, ``old_logp``, ``advantages`` and
``token_weights`` always; ``behaviour_logp`` with a sequence mask or a rollout correction; ``position_kl``, or else
``old_full_logp`` / ``full_logp``, for a method that needs the full distributions; the top-K pair for a method that
reads it; ``entropies`` with ``top_entropy_quantile < 1``. A refusal names the argument, the kind (NaN, +inf, -inf,
a log-prob above 0, a negative weight) and the first such position ``(b, t)`` (``(b,)`` for (B,) advantages,
``(b, t, v)`` for the full distributions, ``(b, t, k)`` for the top-K). The full distributions and the top-K may
hold -inf (a vocabulary entry of probability 0), not NaN or +inf, and not every entry of a valid position; the
others may not (a sampled token's log-prob is finite; a NaN entropy would drop every token). A float64 value that
overflows the loss's dtype is refused as the cast's inf. ``validate=False`` reads no value on the host: padding is
still ignored and log w still clamped, but NaN on a valid token gives a NaN loss.

The scalars are checked either way: ``max_length`` and ``kl_chunk_size`` are integers (a float only when finite and
integral, ``512.0`` as a config may write it; a bool, ``2.5``, inf and NaN are refused), ``generator`` is None or a
``torch.Generator`` that the rule draws from, ``top_entropy_quantile`` a real number in [0, 1] (not a bool), and a
layer's thresholds lie in their domains (``check_layers``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import torch

from .layers import check_top_entropy_quantile
from .methods import ResolvedMethod, get_method

__all__ = [
    "LOGP_TOLERANCE",
    "ValueCheck",
    "check_layers",
    "check_scalars",
    "check_structure",
    "check_tensor",
    "check_topk_pair",
    "finite_probe",
    "is_integer",
    "refuse_bad_values",
    "rule_generator",
]


def check_tensor(name: str, t: Any, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    return t


LOGP_TOLERANCE = 1e-3
"""How far above 0 a log-probability may be and still read as rounding: ``policy_loss`` (``validate=True``) refuses
a log-prob above it on a valid position (a probability above ``e^0.001``: logits or probabilities passed as
log-probs, not float rounding, which a float32 log-softmax keeps at or below 0)."""

_WHY = {
    "logp": "a sampled token's log-prob must be finite (its probability is > 0)",
    "weight": "a token weight must be finite",
    "finite": "values on valid tokens must be finite",
    "full": "a full distribution may hold -inf (probability 0) but not NaN or +inf",
    "topk": "a top-K log-prob may be -inf (probability 0) but not NaN or +inf",
}
"""Why each kind of tensor argument is refused, by its ``ValueCheck.kind``: ``logp`` (log-probs of the sampled
tokens: -inf refused too, and so is a value above ``LOGP_TOLERANCE``), ``weight`` (finite and >= 0),
``finite`` (NaN and +-inf refused), ``full`` ((B, T, V) distributions: -inf allowed, not
everywhere in a row) and ``topk`` ((B, T, K) log-probs of K tokens: -inf allowed); the log-prob kinds (``logp``, ``full``, ``topk``)
are <= ``LOGP_TOLERANCE`` too."""

_LOG_PROB_KINDS = ("logp", "full", "topk")


class ValueCheck(NamedTuple):
    """One tensor argument whose values ``policy_loss`` checks on valid positions, and the ``dtype`` the loss casts
    it to (None: read as given; a finite float64 value can overflow float32)."""

    name: str
    tensor: torch.Tensor
    kind: str
    dtype: torch.dtype | None = None


def refuse_bad_values(check: ValueCheck, mask: torch.Tensor) -> None:
    """ValueError naming the argument, the kind (NaN, +inf, -inf, a log-prob above ``LOGP_TOLERANCE``, a negative
    weight) and the first valid position holding a refused value, as given, then as cast to the loss's dtype; a
    (B,) tensor's position ``(b,)`` is valid where sequence ``b`` has a valid token, a (B, T, V) one's ``(b, t, v)``
    where ``mask[b, t]``. Reads values on the host: for the error path only."""
    t = check.tensor.detach()
    valid = mask.any(-1) if t.ndim == 1 else (mask.unsqueeze(-1) if t.ndim == 3 else mask)
    cast = [] if check.dtype in (None, t.dtype) else [(t.to(check.dtype), f"{check.name} cast to {check.dtype}")]
    for values, name in [(t, check.name), *cast]:
        bad = torch.isnan(values) | torch.isposinf(values)
        if check.kind not in ("full", "topk"):
            bad = bad | torch.isneginf(values)
        bad = bad & valid
        if bool(bad.any()):
            idx = tuple(int(i) for i in torch.nonzero(bad)[0])
            v = float(values[idx])
            kind = "NaN" if math.isnan(v) else ("+inf" if v > 0 else "-inf")
            raise ValueError(f"{name} has {kind} at valid position {idx}; {_WHY[check.kind]}")
        if check.kind == "full":
            empty = torch.isneginf(values).all(-1) & mask
            if bool(empty.any()):
                idx = tuple(int(i) for i in torch.nonzero(empty)[0])
                raise ValueError(
                    f"{name} has -inf at every entry of valid position {idx}; a distribution needs an entry of "
                    "probability > 0"
                )
        if check.kind in _LOG_PROB_KINDS:
            above = (values > LOGP_TOLERANCE) & valid
            if bool(above.any()):
                idx = tuple(int(i) for i in torch.nonzero(above)[0])
                raise ValueError(
                    f"{name} holds {float(values[idx])!r} at valid position {idx}: a log-probability is <= 0 (its "
                    f"probability <= 1; up to {LOGP_TOLERANCE} above 0 is read as rounding). Pass log-probs, not "
                    "logits or probabilities"
                )
        if check.kind == "weight":
            negative = (values < 0) & valid
            if bool(negative.any()):
                idx = tuple(int(i) for i in torch.nonzero(negative)[0])
                raise ValueError(
                    f"{name} holds {float(values[idx])!r} at valid position {idx}: a token weight is >= 0 (a "
                    "negative one would turn the token's objective around)"
                )


def finite_probe(check: ValueCheck, mask: torch.Tensor, all_valid: bool) -> torch.Tensor:
    """A 0-d tensor that is finite when ``check``'s tensor holds no refused value on a valid position (the converse
    need not hold: a sum can overflow; the error path then finds nothing and the call goes on). No host read."""
    t = check.tensor.detach()
    t = t if check.dtype is None else t.to(check.dtype)
    nan = torch.full((), math.nan, dtype=t.dtype, device=t.device)
    if check.kind == "topk":  # -inf (probability 0) is allowed anywhere: the whole tensor's max (one fast pass;
        # a row-wise max is 20x slower at K = 20) keeps NaN and +inf, -inf goes to 0. Padding is read too: a NaN or
        # +inf there sends the call down the error path, which reads valid positions only, finds nothing and goes on
        if not t.numel():
            return t.new_zeros(())
        top = t.amax()
        return torch.where(top > LOGP_TOLERANCE, nan, top.clamp_min(0.0))
    if check.kind == "full":  # per position: NaN or +inf anywhere in the row, or -inf everywhere, is not finite
        t = t.amax(-1)
    valid = t if all_valid else torch.where(mask, t, 0.0)
    probe = valid.sum()
    if check.kind in _LOG_PROB_KINDS:
        probe = probe + torch.where(valid.amax() > LOGP_TOLERANCE, nan, 0.0)
    elif check.kind == "weight":
        probe = probe + torch.where(valid.amin() < 0, nan, 0.0)
    return probe


def check_topk_pair(old_topk_logp: Any, topk_logp: Any, method: str) -> None:
    """A rule that reads the top-K gets both tensors, of one shape (``check_structure`` checked each)."""
    if old_topk_logp is None or topk_logp is None:
        missing = " and ".join(n for n, t in (("old_topk_logp", old_topk_logp), ("topk_logp", topk_logp)) if t is None)
        raise ValueError(
            f"method {method!r} reads the top-K: pass {missing} (B, T, K), both policies' log-probs of the old "
            "policy's K most likely tokens other than the sampled one (atr_theory.topk_logps gathers them)"
        )
    if old_topk_logp.shape != topk_logp.shape:
        raise ValueError(
            f"old_topk_logp and topk_logp must have one shape (B, T, K), got {tuple(old_topk_logp.shape)} and "
            f"{tuple(topk_logp.shape)}"
        )


def rule_generator(method: str | ResolvedMethod, generator: torch.Generator | None) -> torch.Generator | None:
    """``generator`` where ``method`` draws at random (``MethodSpec.stochastic``: clip_cov), else None: a caller
    that holds one generator for several rules (a simulation, the trainer) passes it through this, since
    ``policy_loss`` refuses a generator the rule never draws from."""
    spec = method.spec if isinstance(method, ResolvedMethod) else get_method(method)
    return generator if spec.stochastic else None


def is_integer(value: Any) -> bool:
    """An integer (Python's or numpy's) or an integral finite float such as ``512.0`` (a config may write one);
    never a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return isinstance(value, numbers.Integral) or float(value).is_integer()  # False for inf and NaN


def check_scalars(
    max_length: Any, aggregation: str, T: int, kl_chunk_size: Any, generator: Any, top_entropy_quantile: Any
) -> None:
    """The domain of ``policy_loss``'s scalar arguments, each refused by name with its value (either ``validate``)."""
    if max_length is not None:
        if not is_integer(max_length) or max_length < T:
            raise ValueError(f"max_length must be an integer >= T = {T}, got {max_length!r}")
        if aggregation != "dr_grpo":
            raise ValueError(f"max_length is used by aggregation 'dr_grpo' only, not by {aggregation!r}; leave it None")
    if kl_chunk_size is not None and (not is_integer(kl_chunk_size) or kl_chunk_size < 1):
        raise ValueError(f"kl_chunk_size must be None or an integer >= 1, got {kl_chunk_size!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        kind = type(generator)
        kind = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        raise ValueError(f"generator must be None or a torch.Generator, got {kind}")
    check_top_entropy_quantile(top_entropy_quantile)


def check_structure(
    logp: Any,
    old_logp: Any,
    advantages: Any,
    mask: Any,
    optional: dict[str, Any],
) -> tuple[int, int]:
    """Types, shapes, dtypes and devices of ``policy_loss``'s tensors (``optional``: those that may be None, by
    name): metadata only, no value is read (so no host synchronisation). Returns ``(B, T)``."""
    check_tensor("logp", logp)
    if logp.ndim != 2:
        raise ValueError(f"logp must have shape (B, T), got {tuple(logp.shape)}")
    shape = tuple(logp.shape)
    if 0 in shape:
        raise ValueError(f"logp is empty (shape {shape}): a batch needs at least one sequence and one position")
    check_tensor("old_logp", old_logp, shape)
    check_tensor("mask", mask, shape)
    check_tensor("advantages", advantages)
    if tuple(advantages.shape) not in ((shape[0],), shape):
        raise ValueError(f"advantages must have shape ({shape[0]},) or {shape}, got {tuple(advantages.shape)}")
    given = {"logp": logp, "old_logp": old_logp, "mask": mask, "advantages": advantages}
    for name, t in optional.items():
        if t is None:
            continue
        if name in ("old_full_logp", "full_logp", "old_topk_logp", "topk_logp"):
            check_tensor(name, t)
            last = "V" if name.endswith("full_logp") else "K"
            if t.ndim != 3 or tuple(t.shape[:2]) != shape:
                raise ValueError(f"{name} must have shape (B, T, {last}) with (B, T) = {shape}, got {tuple(t.shape)}")
        else:
            check_tensor(name, t, shape)
        given[name] = t
    for name, t in given.items():
        if t.device != logp.device:
            raise ValueError(f"{name} is on {t.device}, logp on {logp.device}: put every tensor on one device")
        if name != "mask" and not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if logp.device.type == "meta":  # shapes without values: nothing to check or compute with
        raise ValueError("logp is on the meta device (a shape without values): expected tensors holding their values")
    return shape


def check_layers(
    choice: ResolvedMethod,
    optional: dict[str, Any],
    kl_chunk_size: Any,
    generator: Any,
    sequence_mask: Any,
    rollout_correction: Any,
    top_entropy_quantile: float,
) -> None:
    """ValueError for a layer of ``policy_loss`` of the wrong type or without what it reads, and for an argument given
    to a call that never reads it (``optional``: its optional tensors by name), naming what would read it: an
    argument nothing reads is refused, not dropped."""
    from .layers import RolloutCorrection, SequenceMask

    if sequence_mask is not None and not isinstance(sequence_mask, SequenceMask):
        raise ValueError(f"sequence_mask must be a SequenceMask, got {type(sequence_mask).__name__}")
    if rollout_correction is not None and not isinstance(rollout_correction, RolloutCorrection):
        raise ValueError(f"rollout_correction must be a RolloutCorrection, got {type(rollout_correction).__name__}")
    if top_entropy_quantile < 1.0 and optional["entropies"] is None:
        raise ValueError("top_entropy_quantile < 1 needs the per-token entropies (entropies=, shape (B, T))")
    full, topk = choice.spec.needs_full_distributions, choice.spec.needs_topk
    position_kl = optional["position_kl"]
    behaviour_logp, entropies = optional["behaviour_logp"], optional["entropies"]
    old_full_logp, full_logp = optional["old_full_logp"], optional["full_logp"]
    old_topk_logp, topk_logp = optional["old_topk_logp"], optional["topk_logp"]
    for name, given, reader, read_by in (
        (
            "behaviour_logp",
            behaviour_logp,
            sequence_mask is not None or rollout_correction is not None,
            "sequence_mask or rollout_correction",
        ),
        ("entropies", entropies, top_entropy_quantile < 1.0, "top_entropy_quantile < 1"),
        ("position_kl", position_kl, full, "a method that needs the full distributions"),
        (
            "old_full_logp",
            old_full_logp,
            full and position_kl is None,
            "a method that needs the full distributions, without position_kl",
        ),
        (
            "full_logp",
            full_logp,
            full and position_kl is None,
            "a method that needs the full distributions, without position_kl",
        ),
        (
            "kl_chunk_size",
            kl_chunk_size,
            full and position_kl is None,
            "a method that needs the full distributions, without position_kl",
        ),
        ("old_topk_logp", old_topk_logp, topk, "a method that reads the top-K"),
        ("topk_logp", topk_logp, topk, "a method that reads the top-K"),
        (
            "generator",
            generator,
            choice.spec.stochastic,
            "a method that draws at random, such as clip_cov (atr_theory.rule_generator passes it only there)",
        ),
    ):
        if given is not None and not reader:
            raise ValueError(
                f"{name} is given, but nothing in this call reads it: {name} is read by {read_by}, not by "
                f"{choice.name!r} here"
            )
