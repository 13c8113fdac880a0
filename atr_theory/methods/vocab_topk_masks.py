r"""DPPO with a top-K divergence: the mask of DPPO (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement
Learning", arXiv 2602.04879) decided by the divergence between the old and new next-token distributions coarsened
to ``K + 2`` outcomes: the sampled token, the old policy's ``K`` most likely other tokens, and one bucket for the rest
of the vocabulary.

With ``p`` the old and ``p'`` the new probabilities of those outcomes (the rest bucket ``1 - p_s - sum_k p_k``):

* ``dppo_topk_tv``: ``TV = 1/2 sum_i |p'_i - p_i|``;
* ``dppo_topk_kl``: ``KL = sum_i p_i log(p_i / p'_i)``.

Coarsening never increases a divergence (data processing), so each lies between the binary one (``K = 0``: the
sampled token and the rest, ``dppo_tv`` / ``dppo_kl`` exactly) and the full-vocabulary one (``K = V - 1``: every
token its own outcome, the rest bucket empty): ``tests/test_vocab_topk_masks.py`` checks both ends on the same batch.
The decision is DPPO's (``divergence_masks.dppo_drop``): the bound ``delta_high`` where the sampled token's
probability rose, ``delta_low`` where it fell; ``form="min"`` drops a token only on the side its advantage pushes
towards, ``form="mask"`` on either side; the kept tokens' objective is ``sg[min(w, c)] A log pi``.

``K`` is the last dimension of the two (B, T, K) tensors the rule reads (``TokenBatch.old_topk_logp`` and
``topk_logp``; ``topk_other_tokens`` picks the tokens from the old policy, ``topk_logps`` gathers both policies'
log-probs there): a trainer stores the old policy's K ids and log-probs per position at generation (memory
``K x T``, not ``V x T``) and gathers the new policy's log-probs at those ids when it scores the batch.

The peer: TRL 1.6.0-1.8.0 shipped ``topk_tv`` / ``topk_kl`` in ``trl.experimental.dppo`` (``DPPOTrainer.
_compute_divergence_mask``, a rest bucket clamped at 1e-12; removed from TRL 1.9.0), over the set "the rollout's
top ``divergence_topk`` tokens, the sampled token replacing the last when it is not among them". That set is the
sampled token plus the old policy's ``divergence_topk - 1`` most likely other tokens: TRL's ``divergence_topk = K +
1`` is this rule's ``K`` (``tests/test_vocab_topk_masks.py`` runs TRL 1.8.0's own function on the same batch).
"""

from __future__ import annotations

import torch

from ..registry import MethodResult, PeerCode, TokenBatch, register
from .divergence_masks import DELTA_HIGH, DELTA_LOW, IS_CAP, dppo_drop, dppo_result

__all__ = ["DEFAULT_TOPK", "dppo_topk_kl", "dppo_topk_tv", "topk_kl", "topk_logps", "topk_other_tokens", "topk_tv"]

DEFAULT_TOPK = 20
"""The K a trainer stores when none is given (the trainer's ``dppo_topk``; TRL's ``divergence_topk`` default, 20,
counted the sampled token in, so TRL's default is this rule's K = 19), and the bandit's (at most ``V - 1``)."""


def topk_other_tokens(old_full_logp: torch.Tensor, tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The old policy's ``k`` most likely tokens other than the sampled one at each position: ``(ids, logp)``, both
    (B, T, k), from its (B, T, V) log-probs (or logits: the order is the same, but then ``logp`` holds logits) and the
    sampled ``tokens`` (B, T). The ``k + 1`` most likely tokens, less the sampled one where it is among them, else
    less the last; ``0 <= k <= V - 1`` (``k = V - 1``: every other token)."""
    V = old_full_logp.shape[-1]
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= V - 1:
        raise ValueError(f"k must be an integer in [0, V - 1] = [0, {V - 1}], got {k!r}")
    values, ids = old_full_logp.topk(k + 1, dim=-1)
    is_sampled = ids == tokens.unsqueeze(-1)
    drop = torch.where(is_sampled.any(-1), is_sampled.to(torch.int8).argmax(-1), k)
    keep = torch.arange(k + 1, device=ids.device) != drop.unsqueeze(-1)
    shape = (*ids.shape[:-1], k)
    return ids[keep].reshape(shape), values[keep].reshape(shape)


def topk_logps(
    old_full_logp: torch.Tensor, full_logp: torch.Tensor, tokens: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(old_topk_logp, topk_logp)``, each (B, T, k): both policies' log-probs of the old policy's ``k`` most likely
    tokens other than the sampled ``tokens`` (``topk_other_tokens``), from their (B, T, V) log-probs: what
    ``policy_loss`` takes for a rule that reads the top-K."""
    ids, old = topk_other_tokens(old_full_logp, tokens, k)
    return old, full_logp.gather(-1, ids)


REST_FLOOR = 1e-12
"""The rest bucket's probability is taken as at least this in the KL (TRL's clamp): ``1 - p_s - sum_k p_k`` carries a
rounding error of about ``K`` ulps, which could otherwise make an empty bucket (``K = V - 1``) look like an outcome the
new policy gives probability 0 (an infinite KL). The KL's error from it is at most about ``e log(e / REST_FLOOR)``,
``e`` that rounding error (about 1e-5 for K = 20 in float32), far below any bound."""


def _buckets(logp, old_logp, topk_logp, old_topk_logp, floor: float = 0.0):
    """The coarsened distributions' probabilities: sampled ``(p_s, p'_s)``, top-K ``(P, P')`` (B, T, K) and the rest
    ``(r, r')`` (``1 - p_s - sum P`` with ``1 - p_s`` as ``-expm1``, exact for ``p_s`` near 1; at least ``floor``)."""
    p_s, new_s = torch.exp(old_logp), torch.exp(logp)
    P, new_P = torch.exp(old_topk_logp), torch.exp(topk_logp)
    rest = (-torch.expm1(old_logp) - P.sum(-1)).clamp_min(floor)
    new_rest = (-torch.expm1(logp) - new_P.sum(-1)).clamp_min(floor)
    return (p_s, new_s), (P, new_P), (rest, new_rest)


def topk_tv(
    logp: torch.Tensor, old_logp: torch.Tensor, topk_logp: torch.Tensor, old_topk_logp: torch.Tensor
) -> torch.Tensor:
    r"""(B, T) ``TV = 1/2 (|p'_s - p_s| + sum_k |p'_k - p_k| + |r' - r|)`` between the old and new distributions over
    {sampled token, the K others, the rest}; ``logp`` / ``old_logp`` (B, T) are the sampled token's log-probs,
    ``topk_logp`` / ``old_topk_logp`` (B, T, K) the others'."""
    (p_s, new_s), (P, new_P), (rest, new_rest) = _buckets(logp, old_logp, topk_logp, old_topk_logp)
    return 0.5 * ((new_s - p_s).abs() + (new_P - P).abs().sum(-1) + (new_rest - rest).abs())


def topk_kl(
    logp: torch.Tensor, old_logp: torch.Tensor, topk_logp: torch.Tensor, old_topk_logp: torch.Tensor
) -> torch.Tensor:
    r"""(B, T) ``KL = p_s log(p_s / p'_s) + sum_k p_k log(p_k / p'_k) + r log(r / r')`` (old || new) over {sampled
    token, the K others, the rest}; an outcome of old probability 0 adds 0, one the new policy gives 0 (old > 0)
    makes it ``+inf``; the rest bucket's probabilities are at least ``REST_FLOOR``."""
    (p_s, _), (P, _), (rest, new_rest) = _buckets(logp, old_logp, topk_logp, old_topk_logp, REST_FLOOR)
    # 0 x (-inf) and (-inf) - (-inf) are NaN where the old probability is 0: those outcomes add 0
    others = (P * (old_topk_logp - topk_logp)).nan_to_num_(nan=0.0, posinf=torch.inf).sum(-1)
    return p_s * (old_logp - logp) + others + torch.xlogy(rest, rest) - torch.xlogy(rest, new_rest)


def _topk(batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four inputs of ``topk_tv`` / ``topk_kl`` from a batch: the sampled token's new log-prob is ``old_logp +
    log_ratio`` (the ratio the rule sees, as the binary rules read it), the others' are the batch's top-K."""
    return batch.old_logp + batch.log_ratio.detach(), batch.old_logp, batch.topk_logp, batch.old_topk_logp


_PARAMS = {"delta_low": DELTA_LOW, "delta_high": DELTA_HIGH, "is_cap": IS_CAP}
_TRL_FIELDS = (("epsilon", "delta_low"), ("epsilon_high", "delta_high"), ("clip_ratio_c", "is_cap"))


def _trl_peer(kind: str) -> PeerCode:
    """TRL 1.8.0's experimental DPPO trainer, whose ``divergence_topk`` counts the sampled token in (K + 1)."""
    return PeerCode(
        "TRL 1.6.0-1.8.0 (trl.experimental.dppo)",
        f"divergence_type={kind}, divergence_topk=K+1",
        _TRL_FIELDS,
        "`trl/experimental/dppo/dppo_trainer.py` of 1.8.0 L1304-1319 (`_compute_divergence_mask`), its outcome set "
        "from L393 (the sampled token in place of the last of the top `divergence_topk`)",
        "tests/test_vocab_topk_masks.py::test_the_rules_keep_the_tokens_trls_dppo_trainer_keeps",
    )

_REFERENCE = (
    "Qi et al. 2026 (DPPO, arXiv 2602.04879), top-K divergence; TRL 1.6.0-1.8.0 trl.experimental.dppo divergence_type "
    "'{}' (its divergence_topk = K + 1)"
)


@register(
    "dppo_topk_tv",
    params=_PARAMS,
    default_form="min",
    forms=("min", "mask"),
    needs_topk=True,
    peers=(_trl_peer("topk_tv"),),
    reference=_REFERENCE.format("topk_tv"),
)
def dppo_topk_tv(batch: TokenBatch, delta_low: float, delta_high: float, is_cap: float) -> MethodResult:
    r"""DPPO-TopK-TV: keep a token while the total variation between the old and new distributions over {sampled
    token, the old policy's K most likely other tokens, the rest} (``topk_tv``) is at most ``delta_high``
    (probability rose) or ``delta_low`` (fell); ``K = 0`` is ``dppo_tv``."""
    with torch.no_grad():
        decision = dppo_drop(batch, topk_tv(*_topk(batch)), delta_low, delta_high)
    return dppo_result(batch, decision, is_cap)


@register(
    "dppo_topk_kl",
    params=_PARAMS,
    default_form="min",
    forms=("min", "mask"),
    needs_topk=True,
    peers=(_trl_peer("topk_kl"),),
    reference=_REFERENCE.format("topk_kl"),
)
def dppo_topk_kl(batch: TokenBatch, delta_low: float, delta_high: float, is_cap: float) -> MethodResult:
    r"""DPPO-TopK-KL: keep a token while ``KL(pi_old || pi)`` over {sampled token, the old policy's K most likely other
    tokens, the rest} (``topk_kl``) is at most ``delta_high`` (probability rose) or ``delta_low`` (fell); ``K = 0``
    is ``dppo_kl``, ``K = V - 1`` the full KL."""
    with torch.no_grad():
        decision = dppo_drop(batch, topk_kl(*_topk(batch)), delta_low, delta_high)
    return dppo_result(batch, decision, is_cap)
