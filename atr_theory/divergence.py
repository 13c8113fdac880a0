r"""Per-sample KL estimators (Schulman 2020, "Approximating KL Divergence") and the full KL.

With ``w = pi(a) / pi_old(a)`` for ``a ~ pi_old`` (so ``E_{pi_old}[w] = 1``):

* ``k1 = -log w``              unbiased for ``KL(pi_old || pi)``, signed, high variance
* ``k2 = (log w)^2 / 2``        biased, low variance, non-negative
* ``k3 = w - 1 - log w``        unbiased, non-negative (``k1`` plus the control variate ``w - 1``)
* ``is_k3 = 1 - w + w log w``   ``= w * k3(1/w)``, unbiased for the reverse ``KL(pi || pi_old)``

Each function takes the log-ratio ``y = log w`` **or** the ratio ``w`` (``kl3(w)`` in the public API,
as in the paper's Eq. 6) and works on numpy arrays and torch tensors alike. The ``*_from_log_ratio``
forms are the numerically preferred ones: ``k3`` from ``y`` is ``expm1(y) - y`` with no
``log(0)``, and the Taylor series below a cutoff (numpy: ``|y| < 0.5``; torch: per dtype, ``_TORCH_SERIES``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.utils.checkpoint

__all__ = [
    "kl1",
    "kl2",
    "kl3",
    "is_kl3",
    "kl1_from_log_ratio",
    "kl2_from_log_ratio",
    "kl3_from_log_ratio",
    "is_kl3_from_log_ratio",
    "entropy_from_log_probs",
    "full_kl",
    "HeadScores",
    "head_kl_chunked",
    "head_kl_both_ways",
    "REFERENCE_KL_ESTIMATORS",
    "reference_kl",
]

# numpy: below |y| < 0.5 the estimators are summed as Taylor series (no cancellation in e^y - 1 - y)
_SERIES_CUTOFF = 0.5
_SERIES_TERMS = 24  # 0.5**24 / 24! ~ 1e-31: far below double precision


def _series(y: Any, coeff, terms: int = _SERIES_TERMS) -> Any:
    """sum_{n=2}^{terms} coeff(n) * y**n, evaluated by Horner's rule (numpy arrays and torch tensors alike)."""
    acc = coeff(terms) * y
    for n in range(terms - 1, 1, -1):
        acc = (acc + coeff(n)) * y
    return acc * y


def _numpy_with_series(y: Any, direct, coeff) -> np.ndarray:
    """``direct(y)``, replaced by ``sum_{n>=2} coeff(n) y^n`` where ``|y| < 0.5``."""
    y = np.asarray(y, dtype=float)
    small = np.abs(y) < _SERIES_CUTOFF
    out = direct(y)
    if np.any(small):
        out = np.where(small, _series(np.where(small, y, 0.0), coeff), out)
    return out


# torch: (cutoff, highest power N) of the series per dtype. The direct forms lose ~eps * (their terms' size / the
# result) to cancellation, the truncated series ~|y|^(N-1) (N - 1)/(N + 1)! relative. float64 (the simulator, the
# theory checks): |y| < 0.5 with powers to 17, as numpy (<= 4e-15 relative, against mpmath). float32 and narrower
# (the LLM loss's hot path, where each power is one more pass over the batch in eager mode): |y| < 0.04 with powers
# to 4, the same work as before (measured <= 1.9e-6 relative for k3, 4.4e-6 for IS-k3). The methods' mask decisions
# no longer evaluate these per token (methods.within_divergence_bound compares log w with exact bounds). Until this
# table both used |y| < 1e-3: in float64 1.6e-11 relative (truncation), in float32 9.3e-5 for k3 and 10% for IS-k3
# (cancellation just above the cut).
# float16 / bfloat16 are evaluated in float32 and rounded once at the end: in their own precision the cancellation
# above the cut cost up to 14% (k3) and 28% (IS-k3) in bfloat16, and IS-k3's y e^y overflowed float16 (inf at
# y = 8.9, where the value, 5.9e4, is representable). Now within one unit in the last place of the exactly
# rounded value (tests/test_ranges.py, against mpmath).
_TORCH_SERIES = {torch.float64: (0.5, 17)}
_TORCH_SERIES_NARROW = (0.04, 4)
_TORCH_HALF = (torch.float16, torch.bfloat16)


def _torch_with_series(y: torch.Tensor, direct, coeff) -> torch.Tensor:
    """``direct(y)``, replaced by ``sum_{n=2}^{N} coeff(n) y^n`` where ``|y|`` is below the dtype's cutoff
    (``_TORCH_SERIES``); gradients flow through both branches. Half-precision ``y``: in float32, rounded back."""
    if y.dtype in _TORCH_HALF:
        return _torch_with_series(y.float(), direct, coeff).to(y.dtype)
    cutoff, terms = _TORCH_SERIES.get(y.dtype, _TORCH_SERIES_NARROW)
    small = y.abs() < cutoff
    series = _series(torch.where(small, y, torch.zeros_like(y)), coeff, terms)
    return torch.where(small, series, direct(torch.where(small, torch.ones_like(y), y)))


def _is_torch(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def kl1_from_log_ratio(y: Any) -> Any:
    """``k1 = -y``."""
    return -y if _is_torch(y) else -np.asarray(y, dtype=float)


def kl2_from_log_ratio(y: Any) -> Any:
    """``k2 = y^2 / 2``."""
    return 0.5 * y * y if _is_torch(y) else 0.5 * np.square(np.asarray(y, dtype=float))


def kl3_from_log_ratio(y: Any) -> Any:
    r"""``k3 = e^y - 1 - y`` (paper Eq. 6 in ``y = log w``), computed without cancellation for small ``|y|``.

    numpy: the series ``sum_{n>=2} y^n / n!`` for ``|y| < 0.5`` (exact to the last digit); torch: ``expm1(y) - y``,
    and the series below a dtype-dependent cutoff (``_TORCH_SERIES``: <= 4e-15 relative in float64, <= 5e-6
    in float32, against mpmath: ``tests/test_ranges.py``); gradients flow through both branches.

    Examples
    --------
    >>> float(kl3_from_log_ratio(1e-8))  # y^2 / 2, exact to the last digit
    5.000000016666667e-17
    """
    if _is_torch(y):
        return _torch_with_series(y, lambda t: torch.expm1(t) - t, _kl3_coefficient)
    return _numpy_with_series(y, lambda t: np.expm1(t) - t, _kl3_coefficient)


def is_kl3_from_log_ratio(y: Any) -> Any:
    r"""``w log w - w + 1 = e^y (y - 1) + 1 = sum_{n>=2} (n-1) y^n / n!`` (IS-weighted KL3, paper Table 3).

    numpy: the series for ``|y| < 0.5``; torch: the series below the dtype's cutoff, as ``kl3_from_log_ratio``.
    """
    if _is_torch(y):
        # y e^y - expm1(y), the same value as e^y (y - 1) + 1, whose "+ 1" cancelled to ~eps / y^2 relative (10% in
        # float32 at |y| = 1e-3 before); this form loses ~4 eps / |y|
        return _torch_with_series(y, lambda t: t * torch.exp(t) - torch.expm1(t), _is_kl3_coefficient)
    return _numpy_with_series(y, lambda t: np.exp(t) * (t - 1.0) + 1.0, _is_kl3_coefficient)


def _kl3_coefficient(n: int) -> float:
    """``1 / n!``: ``e^y - 1 - y = sum_{n>=2} y^n / n!``."""
    return 1.0 / math.factorial(n)


def _is_kl3_coefficient(n: int) -> float:
    """``(n - 1) / n!``: ``e^y (y - 1) + 1 = sum_{n>=2} (n - 1) y^n / n!``."""
    return (n - 1) / math.factorial(n)


def _log(w: Any) -> Any:
    """``log w`` of a ratio: torch as given; numpy refuses a non-numeric ``w`` (TypeError), NaN and ``w <= 0``."""
    if _is_torch(w):
        return torch.log(w)
    w = np.asarray(w)
    if w.dtype.kind not in "biuf":
        raise TypeError(f"ratio w must be a real number or array of them, got dtype {w.dtype} ({w.flat[0].item()!r})")
    w = w.astype(float)
    bad = ~(w > 0)  # NaN too
    if np.any(bad):
        raise ValueError(f"ratio w must be a number > 0, got {float(w[bad].flat[0])!r}")
    return np.log(w)


def kl1(w: Any) -> Any:
    """``k1(w) = -log w`` (elementwise, numpy or torch)."""
    return kl1_from_log_ratio(_log(w))


def kl2(w: Any) -> Any:
    """``k2(w) = (log w)^2 / 2``."""
    return kl2_from_log_ratio(_log(w))


def kl3(w: Any) -> Any:
    r"""``k3(w) = w - 1 - log w`` (paper Eq. 6), elementwise on numpy arrays or torch tensors.

    Examples
    --------
    >>> round(float(kl3(1.4222167362759164)), 12)
    0.07
    """
    return kl3_from_log_ratio(_log(w))


def is_kl3(w: Any) -> Any:
    """``w k3(1/w) = 1 - w + w log w``: importance-weighted KL3, estimates ``KL(pi || pi_old)``."""
    return is_kl3_from_log_ratio(_log(w))


def entropy_from_log_probs(log_probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    r"""Shannon entropy ``H = -sum_a pi(a) log pi(a)`` of normalised log-probabilities along ``dim``.

    ``log_probs`` is a log-softmax output (torch). Entries with ``pi(a) = 0`` (``-inf``) contribute 0,
    never ``0 * -inf = NaN``.

    Examples
    --------
    >>> round(float(entropy_from_log_probs(torch.log(torch.tensor([0.5, 0.5, 0.0])))), 6)  # log 2
    0.693147
    """
    p_log_p = torch.where(torch.isneginf(log_probs), torch.zeros_like(log_probs), log_probs.exp() * log_probs)
    return -p_log_p.sum(dim)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 -> float32; float32/float64 unchanged."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def full_kl(old_full_logp: torch.Tensor, full_logp: torch.Tensor, *, chunk_size: int | None = None) -> torch.Tensor:
    r"""``KL(pi_old(.|s) || pi(.|s)) = sum_a pi_old(a) (log pi_old(a) - log pi(a))`` per position.

    Inputs are (..., V) log-probabilities (normalised log-softmax outputs, or raw logits: both are
    re-normalised with ``log_softmax`` here, which is idempotent on log-probs). Computed in log space:
    ``exp(old) * (old - new)`` is ``0 * finite = 0`` where ``pi_old`` underflows, never ``0 * -inf``.
    With ``chunk_size`` the leading positions are processed in chunks so the (chunk, V) temporaries
    bound the extra memory (the V = 151,936 case).

    Returns a tensor of shape ``(...)``; it is differentiable w.r.t. ``full_logp``.
    """
    if old_full_logp.shape != full_logp.shape:
        raise ValueError(
            f"old_full_logp and full_logp must have the same shape, got {tuple(old_full_logp.shape)} "
            f"and {tuple(full_logp.shape)}"
        )
    lead = full_logp.shape[:-1]
    v = full_logp.shape[-1]
    old2 = old_full_logp.reshape(-1, v)
    new2 = full_logp.reshape(-1, v)
    n = old2.shape[0]
    step = max(n if not chunk_size or chunk_size >= n else int(chunk_size), 1)
    parts = []
    for start in range(0, n, step):  # no position (n = 0): an empty result of shape (...)
        o = torch.log_softmax(_upcast(old2[start : start + step]), dim=-1)
        q = torch.log_softmax(_upcast(new2[start : start + step]), dim=-1)
        # where pi_old == 0 exactly, the term is 0 whatever log pi is (even -inf)
        diff = torch.where(torch.isneginf(o), torch.zeros_like(o), o - q)
        parts.append((o.exp() * diff).sum(-1))
    out = torch.cat(parts) if parts else full_logp.new_zeros(0)
    return out.reshape(lead)


class HeadScores(NamedTuple):
    """Per-position results of ``head_kl_chunked``, each (B, T)."""

    logp: torch.Tensor  # log pi(token), with gradient
    kl: torch.Tensor  # KL(pi_old || pi), with gradient
    entropy: torch.Tensor  # H(pi), no gradient


def _head_chunk(hidden, weight, bias, old_hidden, old_weight, old_bias, tokens, temperature):
    """One chunk of ``head_kl_chunked``: (c, V) values live only inside this call."""
    lsm = torch.log_softmax(_upcast(torch.nn.functional.linear(hidden, weight, bias)) / temperature, dim=-1)
    with torch.no_grad():
        old = torch.nn.functional.linear(old_hidden, old_weight, old_bias)
        old = torch.log_softmax(_upcast(old) / temperature, dim=-1)
        p_old = old.exp()
        ent_p = torch.where(torch.isneginf(lsm), torch.zeros_like(lsm), lsm.exp() * lsm)
        entropy = -ent_p.sum(-1)
    kl = (p_old * torch.where(torch.isneginf(old), torch.zeros_like(old), old - lsm)).sum(-1)
    logp = lsm.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return logp, kl, entropy


def _check_head_inputs(hidden, old_hidden, temperature, chunk_size) -> None:
    """What ``head_kl_chunked`` and ``head_kl_both_ways`` require of their inputs, each refused by name."""
    if hidden.shape != old_hidden.shape or hidden.ndim < 2:
        raise ValueError(
            f"hidden and old_hidden must have the same shape (..., H), got {tuple(hidden.shape)} "
            f"and {tuple(old_hidden.shape)}"
        )
    if isinstance(chunk_size, bool) or int(chunk_size) != chunk_size or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")


def head_kl_chunked(
    hidden: torch.Tensor,
    old_hidden: torch.Tensor,
    weight: torch.Tensor,
    tokens: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    old_weight: torch.Tensor | None = None,
    old_bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 64,
) -> HeadScores:
    r"""Sampled-token log-probs, ``KL(pi_old(.|s) || pi(.|s))`` and entropies from final hidden states and the
    LM head, never holding more than one chunk of vocabulary-sized values, in the forward or the backward.

    ``pi = softmax((hidden W^T + b) / temperature)``, ``pi_old`` the same with ``old_hidden`` (the policy's
    hidden states at generation time, (B, T, H): H values per position instead of V) and ``old_weight``
    (default: ``weight``, right when the head is frozen, as with LoRA on the decoder). Positions are
    processed ``chunk_size`` at a time; each chunk is wrapped in activation checkpointing, so its (c, V)
    logits are recomputed in the backward instead of stored (the chunked-loss technique of Liger-Kernel /
    unsloth_zoo's ``chunked_hidden_states_selective_log_softmax``). Extra memory: O(chunk_size x V),
    independent of B x T. Gradients flow to ``hidden``, ``weight`` and ``bias`` through ``logp`` and ``kl``;
    ``pi_old`` is a constant. Same values and gradients as ``full_kl`` on the full (B, T, V) log-softmax
    (tests).
    """
    _check_head_inputs(hidden, old_hidden, temperature, chunk_size)
    if tuple(tokens.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"tokens must have shape {tuple(hidden.shape[:-1])}, got {tuple(tokens.shape)}")
    old_weight = weight.detach() if old_weight is None else old_weight.detach()
    old_bias = (None if bias is None else bias.detach()) if old_bias is None else old_bias.detach()
    lead, size = hidden.shape[:-1], hidden.shape[-1]
    h, h_old = hidden.reshape(-1, size), old_hidden.detach().reshape(-1, size)
    tok = tokens.reshape(-1)
    parts = []
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    for start in range(0, h.shape[0], int(chunk_size)):
        sl = slice(start, start + int(chunk_size))
        args = (h[sl], weight, bias, h_old[sl], old_weight, old_bias, tok[sl], float(temperature))
        if grad:
            parts.append(torch.utils.checkpoint.checkpoint(_head_chunk, *args, use_reentrant=False))
        else:
            parts.append(_head_chunk(*args))
    logp, kl, entropy = (torch.cat([part[i] for part in parts]).reshape(lead) for i in range(3))
    return HeadScores(logp, kl, entropy)


def head_kl_both_ways(
    hidden: torch.Tensor,
    old_hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    old_weight: torch.Tensor | None = None,
    old_bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``(KL(pi_old(.|s) || pi(.|s)), KL(pi(.|s) || pi_old(.|s)))`` per position, (...), without gradient: the true
    divergences over the whole vocabulary, from final hidden states and the LM head as in ``head_kl_chunked``
    (``pi = softmax((hidden W^T + b) / temperature)``, ``pi_old`` from ``old_hidden`` and ``old_weight`` / ``old_bias``,
    default the current head), ``chunk_size`` positions at a time (each direction by ``full_kl``). A measurement, not
    a loss term: nothing here carries gradient."""
    _check_head_inputs(hidden, old_hidden, temperature, chunk_size)
    old_weight = weight if old_weight is None else old_weight
    old_bias = bias if old_bias is None else old_bias
    lead, size = hidden.shape[:-1], hidden.shape[-1]
    h, h_old = hidden.detach().reshape(-1, size), old_hidden.detach().reshape(-1, size)
    forward, reverse = [], []
    with torch.no_grad():
        for start in range(0, h.shape[0], int(chunk_size)):
            sl = slice(start, start + int(chunk_size))
            new = _upcast(torch.nn.functional.linear(h[sl], weight, bias)) / temperature
            old = _upcast(torch.nn.functional.linear(h_old[sl], old_weight, old_bias)) / temperature
            forward.append(full_kl(old, new))
            reverse.append(full_kl(new, old))
    empty = _upcast(hidden.new_zeros(0))
    return tuple((torch.cat(x) if x else empty).reshape(lead) for x in (forward, reverse))


def bernoulli_kl_and_slope(x: Any, weight: Any, weight_other: Any) -> tuple[Any, Any]:
    r"""``KL(Ber(p) || Ber(p e^x))`` and its slope in ``x``, where ``x`` is the log-ratio of the outcome of
    probability ``weight`` (= p) and ``weight_other`` = 1 - p (numpy or torch).

    The other outcome's log-ratio is ``x' = log((1 - p e^x) / q) = log1p(-(p / q) expm1(x))``; since
    ``p (e^x - 1) + q (e^x' - 1) = 0`` the KL ``-p x - q x'`` equals ``p k3(x) + q k3(x')``, two non-negative terms
    (no cancellation), and its slope is ``p expm1(x - x')``. The map is symmetric: called with ``(x', q, p)`` it is the
    same KL as a function of ``x'`` (TRGPPO's upper root is solved that way)."""
    xp = torch if isinstance(x, torch.Tensor) else np
    x_other = xp.log1p(-(weight / weight_other) * xp.expm1(x))
    kl = weight * kl3_from_log_ratio(x) + weight_other * kl3_from_log_ratio(x_other)
    return kl, weight * xp.expm1(x - x_other)


def bernoulli_kl_of_log_ratio(y: Any, p_old: Any) -> np.ndarray:
    r"""Binary KL ``KL(Ber(p) || Ber(p w))`` with ``w = e^y`` (TRGPPO, Wang et al. 2019, Eq. 8): the smallest
    full-distribution KL(pi_old || pi) compatible with the sampled action's ratio being ``w``. Defined for
    ``w < 1/p``.

    Evaluated as ``p k3(y) + q k3(y')`` (``bernoulli_kl_and_slope``, ``y'`` the other outcome's log-ratio):
    the textbook form ``-p y + q [log1p(-p) - log1p(-p e^y)]`` subtracts terms ~``p |y|`` to get ~``p y^2 / 2q`` and
    lost ~``eps / |y|`` relative: TRGPPO's roots were off by up to 3e-11 in ``log l`` at delta = 1e-12
    (``tests/test_ranges.py``, against mpmath). At ``p = 1`` it is ``-y``.
    """
    y = np.asarray(y, dtype=float)
    p = np.asarray(p_old, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kl, _ = bernoulli_kl_and_slope(y, p, 1.0 - p)
    return np.where(p < 1.0, kl, -y)


REFERENCE_KL_ESTIMATORS = (
    "trl_k3",
    "kl",
    "k1",
    "abs",
    "mse",
    "k2",
    "low_var_kl",
    "k3",
    "kl+",
    "k1+",
    "abs+",
    "mse+",
    "k2+",
    "low_var_kl+",
    "k3+",
)
"""The per-token estimators of the KL to a reference policy that ``reference_kl`` computes: ``trl_k3`` (TRL 1.16's
GRPO penalty, the default) and verl 0.9.1's ``kl_penalty`` names. verl's ``full`` is not among them: verl 0.9.1's
``kl_penalty`` raises NotImplementedError for it."""


def reference_kl(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "trl_k3") -> torch.Tensor:
    r"""Per-token estimate of ``KL(pi || pi_ref)`` from the sampled tokens' log-probabilities (Schulman 2020,
    "Approximating KL divergence"; ``d = log pi_ref - log pi`` per token):

    * ``trl_k3``: ``e^d - d - 1``, unclamped (TRL 1.16's GRPO ``per_token_kl``; the default of ``atr_llm``'s trainer);
    * verl 0.9.1's ``kl_penalty`` (``verl.trainer.ppo.core_algos.kl_penalty``), the same values and gradients:
      ``kl`` / ``k1``: ``-d``; ``abs``: ``|d|``; ``mse`` / ``k2``: ``d^2 / 2``; ``low_var_kl`` / ``k3``:
      ``clamp(e^{d'} - d' - 1, -10, 10)`` with ``d' = clamp(d, -20, 20)``; a name ending in ``+``: that estimator's
      value with ``k2``'s gradient (straight through: ``k2 - sg[k2] + sg[value]``; ``mse+`` and ``k2+`` are ``k2``).

    ``tests/test_verl_oracle.py`` holds each verl name to verl's own function on the same batch.

    Examples
    --------
    >>> import torch
    >>> logp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    >>> round(float(reference_kl(logp, ref, "k1")), 6), round(float(reference_kl(logp, ref, "trl_k3")), 6)
    (0.693147, 0.193147)
    """
    if estimator not in REFERENCE_KL_ESTIMATORS:
        raise ValueError(f"unknown reference KL estimator {estimator!r}; known: {', '.join(REFERENCE_KL_ESTIMATORS)}")
    if estimator == "trl_k3":
        d = ref_logp - logp
        return torch.exp(d) - d - 1
    base = estimator.removesuffix("+")
    if base in ("kl", "k1"):
        value = logp - ref_logp
    elif base == "abs":
        value = (logp - ref_logp).abs()
    elif base in ("mse", "k2"):
        value = 0.5 * (logp - ref_logp).square()
    else:  # low_var_kl / k3, clamped as verl clamps it
        d = torch.clamp(ref_logp - logp, min=-20, max=20)
        value = torch.clamp(torch.exp(d) - d - 1, min=-10, max=10)
    if not estimator.endswith("+") or base in ("mse", "k2"):
        return value
    k2 = 0.5 * (logp - ref_logp).square()
    return k2 - k2.detach() + value.detach()

