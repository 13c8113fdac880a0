"""What a rule reads besides the sampled tokens, for the tests that call every registered rule: a rule that needs the
full distributions gets two (B, T, V) log-softmaxes, a rule that reads the top-K gets both policies' log-probs of K
other tokens (``MethodSpec.needs_full_distributions`` / ``needs_topk``); any other rule gets nothing."""

from __future__ import annotations

import torch

import atr_theory as at


def _log_softmax(B: int, T: int, n: int, seed: int, scale: float, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(B, T, n, generator=g) * scale, -1).to(dtype)


def rule_inputs(
    name: str, B: int, T: int, dtype: torch.dtype = torch.float32, *, V: int = 6, K: int = 3, scale: float = 1.0
) -> dict[str, torch.Tensor]:
    """The extra ``policy_loss`` arguments rule ``name`` reads, for a (B, T) batch: random distributions (``scale``
    sets how peaked); the top-K ones are K of K + 1 outcomes, so each position leaves mass for the sampled token and
    the rest."""
    spec = at.get_method(name)
    if spec.needs_full_distributions:
        return dict(
            old_full_logp=_log_softmax(B, T, V, 1, scale, dtype), full_logp=_log_softmax(B, T, V, 2, scale, dtype)
        )
    if spec.needs_topk:
        return dict(
            old_topk_logp=_log_softmax(B, T, K + 1, 1, scale, dtype)[..., :K],
            topk_logp=_log_softmax(B, T, K + 1, 2, scale, dtype)[..., :K],
        )
    return {}
