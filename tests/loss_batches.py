"""The random batch the loss tests share: sampled tokens' log-probs under pi_old and pi, advantages, a full mask."""

import torch


def token_batch(seed: int, B: int = 3, T: int = 6, scale: float = 0.6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 4 - 0.05
    logp = (old + scale * torch.randn(B, T, generator=g)).clamp(max=0.0).requires_grad_(True)
    adv = torch.randn(B, generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    return logp, old, adv, mask
