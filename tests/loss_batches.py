"""The one random batch builder of the loss tests: the sampled tokens' log-probs under pi_old and pi, advantages and
a mask, in the shapes ``atr_theory.policy_loss`` takes. Each test module names the few keywords it needs."""

from __future__ import annotations

import torch


def loss_batch(
    seed: int,
    B: int = 3,
    T: int = 6,
    *,
    old_spread: float = 3.0,
    old_offset: float = 0.01,
    scale: float = 0.4,
    clamp: bool = True,
    per_token: bool = False,
    min_length: int | None = 1,
    dtype: torch.dtype | None = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logp, old, adv, mask)`` drawn from ``seed``, in this order: ``old ~ -U(0, 1) * old_spread - old_offset``,
    ``logp = old + scale * N(0, 1)`` (clamped at 0 when ``clamp``: a log-probability), advantages ``N(0, 1)`` of shape
    (B, T) when ``per_token`` else (B,), then the valid lengths ``U{min_length..T}`` (``None``: every token valid);
    ``dtype=None``: torch's default."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=dtype) * old_spread - old_offset
    logp = old + scale * torch.randn(B, T, generator=g, dtype=dtype)
    if clamp:
        logp = logp.clamp(max=0.0)
    adv = torch.randn((B, T) if per_token else (B,), generator=g, dtype=dtype)
    if min_length is None:
        mask = torch.ones(B, T, dtype=torch.bool)
    else:
        lengths = torch.randint(min_length, T + 1, (B,), generator=g)
        mask = torch.arange(T)[None, :] < lengths[:, None]
    return logp, old, adv, mask


def token_batch(seed: int, B: int = 3, T: int = 6, scale: float = 0.6):
    """The loss tests' common batch, in torch's default dtype: every token valid, ``logp`` a leaf that requires grad."""
    logp, old, adv, mask = loss_batch(
        seed, B, T, old_spread=4.0, old_offset=0.05, scale=scale, min_length=None, dtype=None
    )
    return logp.requires_grad_(True), old, adv, mask


def log_prob_pair(log_ratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp, old)``, both <= 0, with ``logp - old == log_ratio`` exactly at every position (one of the two is 0
    there, the other +-log_ratio): how a test of given ratios passes them to ``policy_loss``, which refuses a
    log-probability above 0."""
    return log_ratio.clamp(max=0.0), (-log_ratio).clamp(max=0.0)
