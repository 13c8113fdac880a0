"""How far the rollout engine's policy is from the training policy on the sampled tokens (train-rollout mismatch).

When another engine generates (vLLM in TRL, verl's rollout workers), the log-probabilities it reports for the tokens
it sampled, ``log mu(y_t)``, are not the training model's ``log pi_old(y_t)`` on the same tokens: other kernels, other
precision, another batch shape. With ``rho_t = pi_old(y_t) / mu(y_t)`` on a sequence's valid tokens ``t in T_i``,
``rollout_mismatch_metrics`` gives, under verl 0.9.1's names (``verl.trainer.ppo.rollout_corr_helper.
compute_offpolicy_metrics``, logged there as ``rollout_corr/<name>``):

* ``kl``: ``mean_t (log mu - log pi_old)``, the k1 estimate of KL(mu || pi_old) (Schulman 2020);
* ``k3_kl``: ``mean_t (rho - 1 - log rho)``, the k3 estimate of the same KL;
* ``chi2_token``: ``mean_t rho^2 - 1``, and ``chi2_seq``: ``mean_i (prod_t rho_t)^2 - 1``, the chi-squared divergence
  chi2(pi_old || mu) per token and per sequence (log-ratios clamped to +-20 first, as verl does);
* ``training_ppl`` / ``rollout_ppl``: ``mean_i exp(-mean_{t in T_i} log p)`` under each policy, their logs
  ``training_log_ppl`` / ``rollout_log_ppl``; ``log_ppl_diff = mean_i d_i`` with
  ``d_i = mean_t (log mu - log pi_old)``, its ``_abs_diff``, ``_max``, ``_min``; ``ppl_ratio = mean_i exp(d_i)``;

and, where verl has no name for it, the sequence log-ratio ``s_i = sum_{t in T_i} log rho_t`` (the sequence-level
importance weight's log): ``seq_log_ratio_mean`` and ``seq_log_ratio_max`` (max of ``|s_i|``).

Tokens the engine could not score (``NaN`` from vLLM) are left out, as TRL leaves them out of its own
``sampling/sampling_logp_difference``; a sequence with no valid token is left out of the per-sequence means (verl
0.9.1 counts it, with a log-perplexity of 0).
TRL itself logs only ``|log pi_old - log mu|`` and the importance ratio's range (``sampling/*``).
"""

from __future__ import annotations

import torch

__all__ = ["MISMATCH_PREFIX", "MISMATCH_NAMES", "SAFETY_BOUND", "rollout_mismatch_metrics"]

MISMATCH_PREFIX = "rollout_corr/"  # verl's prefix for the same metrics
SAFETY_BOUND = 20.0  # verl's clamp of a log-ratio before it is exponentiated for chi-squared
MISMATCH_NAMES = (
    "kl", "k3_kl", "chi2_token", "chi2_seq", "training_ppl", "training_log_ppl", "rollout_ppl", "rollout_log_ppl",
    "log_ppl_diff", "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio",
    "seq_log_ratio_mean", "seq_log_ratio_max",
)
"""The keys ``rollout_mismatch_metrics`` returns, in that order (without the prefix)."""


def rollout_mismatch_metrics(
    train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The train-rollout mismatch of one batch (module docstring): ``train_logp`` = log pi_old and ``rollout_logp`` =
    log mu of the sampled tokens, (B, T), ``mask`` (B, T) marks the valid tokens. Returns ``{}`` when no token is
    valid (no token the engine scored)."""
    if train_logp.shape != rollout_logp.shape or train_logp.shape != mask.shape:
        raise ValueError(
            f"train_logp, rollout_logp and mask must have one shape, got {tuple(train_logp.shape)}, "
            f"{tuple(rollout_logp.shape)} and {tuple(mask.shape)}"
        )
    train_logp, rollout_logp = train_logp.detach().double(), rollout_logp.detach().double()
    valid = mask.bool() & torch.isfinite(rollout_logp) & torch.isfinite(train_logp)
    if not valid.any():
        return {}
    zero = torch.zeros_like(train_logp)
    train_logp, rollout_logp = torch.where(valid, train_logp, zero), torch.where(valid, rollout_logp, zero)
    counts = valid.sum(-1)
    rows = counts > 0
    n = counts[rows].double()

    def token_mean(x: torch.Tensor) -> torch.Tensor:
        return x[valid].mean()

    log_rho = train_logp - rollout_logp  # log pi_old - log mu, 0 on invalid tokens
    rho = torch.exp(log_rho.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    seq_log_ratio = log_rho.sum(-1)[rows]
    train_seq, rollout_seq = train_logp.sum(-1)[rows] / n, rollout_logp.sum(-1)[rows] / n  # per-sequence means
    log_ppl_diff = rollout_seq - train_seq
    values = {
        "kl": token_mean(-log_rho),
        "k3_kl": token_mean(torch.exp(log_rho) - 1.0 - log_rho),
        "chi2_token": token_mean(rho.square()) - 1.0,
        "chi2_seq": torch.exp(2.0 * seq_log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).mean() - 1.0,
        "training_ppl": torch.exp(-train_seq).mean(),
        "training_log_ppl": (-train_seq).mean(),
        "rollout_ppl": torch.exp(-rollout_seq).mean(),
        "rollout_log_ppl": (-rollout_seq).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        "seq_log_ratio_mean": seq_log_ratio.mean(),
        "seq_log_ratio_max": seq_log_ratio.abs().max(),
    }
    return {name: float(values[name]) for name in MISMATCH_NAMES}
