"""The soft trust regions' proposing code, copied as a test-only oracle of ``atr_theory.methods.weighted_trust_regions``
(none of it is on PyPI: pull requests not merged, or the authors' own forks of verl). Each block is copied unchanged
between its markers from the file and commit named there; this file is not part of the installed package.

* PSPO: github.com/huggingface/trl pull request #4548 at 9d490c313e6dbaf5bf1f6c0ca36e40f89d3e2f1f,
  ``trl/trainer/grpo_trainer.py`` lines 2361-2366 (the body of the ``trust_region_method == "pspo"`` branch of
  ``GRPOTrainer._compute_loss``, line 2360). Licence: Apache License 2.0, copyright The HuggingFace Team.
* CFPO: github.com/huggingface/trl pull request #5027 at afa266b563c97e180b96d0f767a53eaba3af9ffd,
  ``trl/trainer/grpo_trainer.py`` lines 2048-2055 (the body of the ``loss_type == "cfpo"`` branch, line 2047; the file
  does not import at that commit: its aggregation line lacks a quote); and github.com/OpenRLHF/OpenRLHF pull request #1184 at 8eb43dac6acbcea89b34a8131313e780428b1b8b,
  ``openrlhf/models/loss.py`` lines 75-187 (``PolicyLoss``). Licence: Apache License 2.0, copyright OpenRLHF.
* UP-GRPO: github.com/verl-project/verl pull request #7022 at 0257b18e41c969efe13fd03f35c3477eccd4c1e9,
  ``verl/trainer/ppo/core_algos.py`` lines 1372-1469 (``compute_policy_loss_up``). Licence: Apache License 2.0,
  copyright Bytedance Ltd. and/or its affiliates.
* CE-GPPO: github.com/Kwai-Klear/CE-GPPO at 10558fe017ac776773fd7f29753d8353a11c0813 (the file last changed in
  169f3b3c27b55b9e8a36073d090f4746ba9ec8f6), ``verl/trainer/ppo/core_algos.py`` lines 531-620
  (``compute_gppo_loss_general_beta``); GPPO: the same file at defde2047bb5079d6ca941cf74e0d4473ad591b2, lines
  444-521 (``compute_gppo_loss``: at the repository's head it reads an undefined ``only_higher`` and raises
  NameError). Licence: Apache License 2.0 (a fork of verl).
* BAPO: github.com/WooooDyy/BAPO at 7287044444d5d578529ea464b45f090a36e8da3a (the file last changed in
  3b8389c5a81e715a6fbaa2bb0fa688fe54ace9cf), ``recipe/bapo/policy_loss.py`` lines 21-187
  (``_compute_effective_advantage``, ``_append_metric``, ``compute_policy_loss_bapo``). Licence: Apache License 2.0
  (a verl recipe).
* ASPO: github.com/wizard-III/Archer2.0 at b08d963d5d65909ef1f24dba2f382006d0be33e1 (the file last changed in
  0a9492a3550a22e8ff0945f03634f6f9a73461d6), ``verl/trainer/ppo/core_algos.py`` lines 537-583
  (``compute_policy_loss_archer``). Licence: Apache License 2.0 (a fork of verl).
* FIPO: github.com/huggingface/trl pull request #5434 at 20463989e8d9fef8dbba7230c7fb11bdd7f6387f,
  ``trl/trainer/grpo_trainer.py`` lines 2534-2616 (``GRPOTrainer.get_fipo_loss_components``), line 2678 (the
  log-ratio), lines 2717-2740 (the ``fipo`` branch of ``_compute_loss``) and 2785-2788 (its aggregation), the
  oracle of ``atr_theory.methods.weighting_by_future_kl``. Licence: Apache License 2.0, copyright The HuggingFace Team.

Around them, stand-ins for what the copied code reads and does not compute itself: verl's ``verl_F.masked_mean``
and OpenRLHF's ``masked_mean`` (their formulas), verl's ``agg_loss`` as the token sum of the per-token loss (the
aggregation is compared on its own elsewhere), verl's ``register_policy_loss`` and config classes, TRL's ``self``.
"""
# ruff: noqa
# fmt: off

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Optional

import torch
import torch.nn as nn


def _masked_mean(values, mask, axis=None):  # verl.utils.torch_functional.masked_mean
    return (values * mask).sum(axis=axis) / (mask.sum(axis=axis) + 1e-8)


verl_F = SimpleNamespace(masked_mean=_masked_mean)


def agg_loss(loss_mat, loss_mask, loss_agg_mode, **global_batch_info):  # stand-in: the token sum
    return (loss_mat * loss_mask).sum()


def register_policy_loss(name):  # verl's registry decorator: the function itself
    return lambda fn: fn


class ActorConfig(SimpleNamespace):  # verl's actor config: the fields the loss reads
    global_batch_info: dict = {}

    def get(self, key, default=None):
        return getattr(self, key, default)


class AlgoConfig:
    pass


Dict = dict  # typing.Dict, as BAPO's file imports it


def masked_mean(tensor, mask, dim=None):  # openrlhf.models.utils.masked_mean
    if mask is None:
        return tensor.mean(axis=dim)
    return (tensor * mask).sum(axis=dim) / mask.sum(axis=dim)


class _TRLPSPOBranch:
    def __init__(self, smoothing_alpha):
        self.smoothing_alpha = smoothing_alpha

    def per_token_loss(self, coef_1, advantages):
        # --- TRL PR #4548 trl/trainer/grpo_trainer.py, lines 2361-2366 (one indentation level less) ---
        # smooth the ratio (equiv. to smoothing prob when smoothing toward behaviour policy)
        coef_2 = (1.0 - self.smoothing_alpha) * coef_1 + self.smoothing_alpha
        per_token_loss1 = None
        per_token_loss2 = None
        # always use smoothing for loss (no min)
        per_token_loss = -(coef_2 * advantages)
        # --- end of the copy ---
        return per_token_loss


class _TRLCFPOBranch:
    def __init__(self, epsilon_high):
        self.epsilon_high = epsilon_high

    def per_token_loss(self, coef_1, advantages):
        # --- TRL PR #5027 trl/trainer/grpo_trainer.py, lines 2048-2055 (one indentation level less) ---
        """
        Clipping Free Policy Optimization for Large Language Models
        # L = -advantage * ratio + |advantage| * (ratio - 1)^2 / (2 * epsilon)
        https://arxiv.org/abs/2601.22801
        """
        per_token_loss = - (
                            advantages * coef_1 - torch.abs(advantages) * torch.pow(coef_1 - 1, 2) / (2 * self.epsilon_high)
                           )
        # --- end of the copy ---
        return per_token_loss


# --- OpenRLHF PR #1184 openrlhf/models/loss.py, lines 75-187 ---
class PolicyLoss(nn.Module):
    """
    Policy Loss for PPO
    """

    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        dual_clip: float = None,
        token_level_loss: bool = True,
        policy_loss_type: str = "ppo",
        enable_vllm_is_correction: bool = False,
        vllm_is_truncated_threshold: list = None,
        vllm_is_correction_type: str = "tis",
    ) -> None:
        super().__init__()
        self.clip_eps_low = clip_eps_low
        self.clip_eps_high = clip_eps_high
        self.token_level_loss = token_level_loss
        self.dual_clip = dual_clip
        self.policy_loss_type = policy_loss_type
        self.enable_vllm_is_correction = enable_vllm_is_correction
        self.vllm_is_truncated_threshold = vllm_is_truncated_threshold
        self.vllm_is_correction_type = vllm_is_correction_type

        # GSPO requires sequence-level loss
        if policy_loss_type == "gspo":
            self.token_level_loss = False

        # Dual-clip PPO: https://arxiv.org/pdf/1912.09729
        if dual_clip is not None:
            assert dual_clip > 1.0, f"dual_clip must be > 1.0, got {dual_clip}"

        if self.vllm_is_correction_type not in {"tis", "icepop", "seq-mask-tis"}:
            raise ValueError(
                f"Invalid vllm_is_correction_type: {self.vllm_is_correction_type}, must be one of tis/icepop/seq-mask-tis"
            )

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: Optional[torch.Tensor] = None,
        rollout_log_probs: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        if self.policy_loss_type in ["ppo", "cfpo"]:
            log_ratio = log_probs - old_log_probs
            ratio = log_ratio.exp()
        elif self.policy_loss_type == "gspo":
            # GSPO: https://arxiv.org/pdf/2507.18071
            if self.enable_vllm_is_correction:
                log_ratio = log_probs - rollout_log_probs
            else:
                log_ratio = log_probs - old_log_probs
            ratio = (log_ratio * action_mask).sum(dim=-1) / action_mask.sum(dim=-1)
            ratio = ratio.exp().unsqueeze(-1) * action_mask
        else:
            raise ValueError(f"Invalid policy loss type: {self.policy_loss_type}")

        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps_low, 1 + self.clip_eps_high) * advantages

        if self.dual_clip is None and self.policy_loss_type != "cfpo":
            # Standard PPO
            loss = -torch.min(surr1, surr2)
        elif self.policy_loss_type == "cfpo":
            # CFPO: https://arxiv.org/abs/2601.22801
            # Loss = -(advantage * ratio - |advantage| * (ratio - 1)^2 / (2 * clip_eps))
            loss = -(advantages * ratio - torch.abs(advantages) * torch.pow(ratio - 1, 2) / (2 * self.clip_eps_low))

        else:
            # Standard PPO clipping
            clip1 = torch.min(surr1, surr2)
            # Dual-clip: additional lower bound for negative advantages
            clip2 = torch.max(clip1, self.dual_clip * advantages)
            # Apply dual-clip: use clip2 for negative advantages, clip1 for positive advantages
            loss = -torch.where(advantages < 0, clip2, clip1)

        # Your Efficient RL Framework Secretly Brings You Off-Policy RL Training: https://fengyao.notion.site/off-policy-rl
        vllm_kl = None
        if self.enable_vllm_is_correction and self.policy_loss_type == "ppo":
            low_threshold, high_threshold = self.vllm_is_truncated_threshold
            log_ratio = old_log_probs - rollout_log_probs
            if self.vllm_is_correction_type == "icepop":
                # ICEPOP: token-level filtering (set coefficients outside the interval to 0)
                vllm_is = torch.exp(log_ratio).detach()
                mask = (vllm_is >= low_threshold) & (vllm_is <= high_threshold)
                vllm_is = vllm_is * mask
                loss = vllm_is * loss
            elif self.vllm_is_correction_type == "seq-mask-tis":
                # seq-mask-tis: use sequence-level geometric mean only for filtering,
                # correction coefficients still use TIS (token-level clamp)
                seq_log_ratio = masked_mean(log_ratio, action_mask, dim=-1)
                seq_is = torch.exp(seq_log_ratio)
                seq_mask = (seq_is >= low_threshold) & (seq_is <= high_threshold)
                vllm_is = torch.exp(log_ratio).detach()
                loss = seq_mask.unsqueeze(-1) * vllm_is * loss
            else:
                # TIS: token-level clamp with low and high thresholds
                vllm_is = torch.exp(log_ratio).clamp(min=low_threshold, max=high_threshold).detach()
                loss = vllm_is * loss
            vllm_kl = masked_mean(rollout_log_probs - old_log_probs, action_mask, dim=None)

        loss = (
            masked_mean(loss, action_mask, dim=None)
            if self.token_level_loss
            else masked_mean(loss, action_mask, dim=-1).mean()
        )
        clip_ratio = masked_mean(torch.lt(surr2, surr1).float(), action_mask, dim=None)
        ppo_kl = masked_mean(-log_ratio.detach(), action_mask, dim=None)
        return loss, clip_ratio, ppo_kl, vllm_kl
# --- end of the copy ---


# --- verl PR #7022 verl/trainer/ppo/core_algos.py, lines 1372-1469 ---
@register_policy_loss("up")
def compute_policy_loss_up(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[ActorConfig] = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """UP-GRPO token-level objective (paper arXiv:2607.06987, Eq. 15).

    UP (Unbounded Positive) is a plug-and-play, asymmetric modification of the GRPO
    policy loss that breaks the exploration-stability dilemma:

    - Positive advantages (A > 0): discard clipping/importance-sampling entirely and
      use an unbounded self-anchored REINFORCE objective. This is realized through the
      stop-gradient trick: the self-anchored ratio ``r_tilde = pi / sg(pi)`` equals 1 in
      value but carries gradient ``grad log pi``. Removing the ``pi_old`` anchor and the
      upper clip maximizes exploration for rare, low-confidence correct tokens without
      importance-sampling induced gradient explosion.
    - Negative advantages (A <= 0): keep the standard GRPO symmetric clip (single epsilon)
      plus the dual-clip safeguard for stability.

    The KL penalty is handled separately by verl via ``use_kl_loss`` / ``kl_loss_coef``,
    so it is intentionally NOT added inside this policy-loss function.

    Args:
        old_log_prob (torch.Tensor):
            Log-probabilities of actions under the old policy, shape (batch_size, response_length).
        log_prob (torch.Tensor):
            Log-probabilities of actions under the current policy, shape (batch_size, response_length).
        advantages (torch.Tensor):
            Advantage estimates for each action, shape (batch_size, response_length).
        response_mask (torch.Tensor):
            Mask indicating which tokens to include in the loss, shape (batch_size, response_length).
        loss_agg_mode (str, optional):
            Aggregation mode for `agg_loss`. Defaults to "token-mean".
        config: `(verl.trainer.config.ActorConfig)`:
            config for the actor.
        rollout_is_weights: `(torch.Tensor)`:
            Optional rollout-correction importance-sampling weights, shape (batch_size, response_length).
    """
    assert config is not None
    assert not isinstance(config, AlgoConfig)
    clip_ratio = config.clip_ratio  # Clipping parameter ε for standard PPO. See https://arxiv.org/abs/1707.06347.
    clip_ratio_low = config.clip_ratio_low if config.clip_ratio_low is not None else clip_ratio
    clip_ratio_high = config.clip_ratio_high if config.clip_ratio_high is not None else clip_ratio
    clip_ratio_c = config.get(  # Lower bound of the ratio for dual-clip PPO. See https://arxiv.org/pdf/1912.09729.
        "clip_ratio_c", 3.0
    )

    assert clip_ratio_c > 1.0, (
        "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0,"
        + f" but get the value: {clip_ratio_c}."
    )

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = verl_F.masked_mean(-negative_approx_kl, response_mask)

    # Positive branch: unbounded self-anchored REINFORCE objective.
    # r_tilde = pi / sg(pi) is 1 in value but has gradient grad log pi, so this
    # removes the pi_old anchor and the clip while keeping the REINFORCE gradient.
    r_tilde = torch.exp(log_prob - log_prob.detach())
    pg_losses_pos = -advantages * r_tilde

    # Negative branch: standard GRPO symmetric clip + dual-clip safeguard.
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses_neg = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)

    pg_losses = torch.where(advantages > 0, pg_losses_pos, pg_losses_neg)

    # Apply rollout correction weights if provided
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    pg_loss = agg_loss(
        loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info
    )

    # Clip metrics are only meaningful on the (clipped) non-positive branch.
    neg_mask = response_mask * (advantages <= 0).float()
    pg_clipfrac = verl_F.masked_mean(torch.gt(pg_losses2, pg_losses1).float(), neg_mask)
    pg_clipfrac_lower = verl_F.masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask
    )

    pg_metrics = {
        "actor/pg_clipfrac": pg_clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach().item(),
    }
    return pg_loss, pg_metrics
# --- end of the copy ---


# --- Kwai-Klear/CE-GPPO verl/trainer/ppo/core_algos.py at 169f3b3c, lines 531-620 ---
def compute_gppo_loss_general_beta(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    cliprange=None,
    cliprange_low=None,
    cliprange_high=None,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    gppo_loss_beta1=0.25,
    gppo_loss_beta2=1.0
):
    """Adapted from https://github.com/huggingface/trl/blob/main/trl/trainer/ppo_trainer.py#L1122
    Args:
        old_log_prob: `(torch.Tensor)`
            shape: (bs, response_length)
        log_prob: `(torch.Tensor)`
            shape: (bs, response_length)
        advantages: `(torch.Tensor)`
            shape: (bs, response_length)
        response_mask: `(torch.Tensor)`
            shape: (bs, response_length)
        cliprange: (float)
            The clip range used in PPO. See https://arxiv.org/abs/1707.06347
        cliprange_low: (float)
            The lower clip range used in PPO.
        cliprange_high: (float)
            The higher clip range used in PPO.
        clip_ratio_c: (float) default: 3.0
            The lower bound of the ratio for dual-clip PPO, See https://arxiv.org/pdf/1912.09729
        loss_agg_mode: (str) choices: "token-mean" /
                                      "seq-mean-token-sum" /
                                      "seq-mean-token-mean" /
                                      "seq-mean-token-sum-norm" /
            "token-mean" is the default behavior

    Returns:
        pg_loss: `a scalar torch.Tensor`
            policy gradient loss computed via PPO
        pg_clipfrac: (float)
            the fraction of policy gradient loss being clipped
        ppo_kl: (float)
            the estimated KL divergence between the latest updating policy and the old sampling policy
        pg_clipfrac_lower: (float)
            the fraction of policy gradient loss being clipped when the advantage is negative
    """
    assert clip_ratio_c > 1.0, (
        "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0,"
        + f" but get the value: {clip_ratio_c}."
    )

    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = verl_F.masked_mean(-negative_approx_kl, response_mask)
    ratio_detached = ratio.detach()
    
    pg_losses1 = -advantages * ratio
    if cliprange_low is None:
        cliprange_low = cliprange
    if cliprange_high is None:
        cliprange_high = cliprange
        
    # case masks
    low_mask = (ratio < (1 - cliprange_low)) & (advantages < 0)
    high_mask = (ratio > (1 + cliprange_high)) & (advantages > 0)
    other_mask = ~(low_mask | high_mask)
    
    beta1 = gppo_loss_beta1
    beta2 = gppo_loss_beta2
    
    # three cases
    clip_pg_losses1 = torch.zeros_like(advantages)
    clip_pg_losses1[low_mask] = -beta1 * (1 - cliprange_low) / ratio_detached[low_mask] * ratio[low_mask] * advantages[low_mask]
    clip_pg_losses1[high_mask] = -beta2 * (1 + cliprange_high) / ratio_detached[high_mask] * ratio[high_mask] * advantages[high_mask]
    clip_pg_losses1[other_mask] = -ratio[other_mask] * advantages[other_mask]

    pg_clipfrac = verl_F.masked_mean((low_mask | high_mask).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c

    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = verl_F.masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask
    )

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)

    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower
# --- end of the copy ---


# --- Kwai-Klear/CE-GPPO verl/trainer/ppo/core_algos.py at defde204, lines 444-521 ---
def compute_gppo_loss(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    cliprange=None,
    cliprange_low=None,
    cliprange_high=None,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
):
    """Adapted from https://github.com/huggingface/trl/blob/main/trl/trainer/ppo_trainer.py#L1122
    Args:
        old_log_prob: `(torch.Tensor)`
            shape: (bs, response_length)
        log_prob: `(torch.Tensor)`
            shape: (bs, response_length)
        advantages: `(torch.Tensor)`
            shape: (bs, response_length)
        response_mask: `(torch.Tensor)`
            shape: (bs, response_length)
        cliprange: (float)
            The clip range used in PPO. See https://arxiv.org/abs/1707.06347
        cliprange_low: (float)
            The lower clip range used in PPO.
        cliprange_high: (float)
            The higher clip range used in PPO.
        clip_ratio_c: (float) default: 3.0
            The lower bound of the ratio for dual-clip PPO, See https://arxiv.org/pdf/1912.09729
        loss_agg_mode: (str) choices: "token-mean" /
                                      "seq-mean-token-sum" /
                                      "seq-mean-token-mean" /
                                      "seq-mean-token-sum-norm" /
            "token-mean" is the default behavior

    Returns:
        pg_loss: `a scalar torch.Tensor`
            policy gradient loss computed via PPO
        pg_clipfrac: (float)
            the fraction of policy gradient loss being clipped
        ppo_kl: (float)
            the estimated KL divergence between the latest updating policy and the old sampling policy
        pg_clipfrac_lower: (float)
            the fraction of policy gradient loss being clipped when the advantage is negative
    """
    assert clip_ratio_c > 1.0, (
        "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0,"
        + f" but get the value: {clip_ratio_c}."
    )

    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = verl_F.masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    if cliprange_low is None:
        cliprange_low = cliprange
    if cliprange_high is None:
        cliprange_high = cliprange
    pg_losses2 = -advantages * torch.clamp(
        ratio, (1 - cliprange_low) / ratio.detach() * ratio, (1 + cliprange_high) / ratio.detach() * ratio
    )  
    clip_pg_losses1 = torch.maximum(
        pg_losses1, pg_losses2
    ) 
    pg_clipfrac = verl_F.masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c

    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = verl_F.masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask
    )

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)

    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower
# --- end of the copy ---


# --- wizard-III/Archer2.0 verl/trainer/ppo/core_algos.py at 0a9492a3, lines 537-583 ---
def compute_policy_loss_archer(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    high_entropy_mask,
    negative_low_entropy_clip_ratio_low=0.2,
    negative_high_entropy_clip_ratio_low=0.4,
    positive_low_entropy_clip_ratio_high=0.2,
    positive_high_entropy_clip_ratio_high=0.4,
    negative_clip_ratio_c=3.0,
    positive_clip_ratio_c=3.0,
    use_dynamic_clip=False,
    loss_agg_mode: str = "token-mean",
):
    assert negative_clip_ratio_c > 1.0, "The negative_clip_ratio_c should be greater than 1.0," + f" but get the value: {negative_clip_ratio_c}."
    assert positive_clip_ratio_c > 1.0, "The positive_clip_ratio_c should be greater than 1.0," + f" but get the value: {positive_clip_ratio_c}."

    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))

    negative_clip_ratio = torch.where(high_entropy_mask, torch.clamp(ratio, min=1-negative_low_entropy_clip_ratio_low, max=None), torch.clamp(ratio, min=1-negative_high_entropy_clip_ratio_low, max=None))
    positive_clip_ratio = torch.where(high_entropy_mask, torch.clamp(ratio, min=None, max=1+positive_low_entropy_clip_ratio_high), torch.clamp(ratio, min=None, max=1+positive_high_entropy_clip_ratio_high))

    clip_ratio = torch.where(advantages < 0, negative_clip_ratio, positive_clip_ratio)

    pg_clipfrac_upper = verl_F.masked_mean(torch.gt(ratio, clip_ratio).float(), response_mask)
    pg_clipfrac_lower = verl_F.masked_mean(torch.lt(ratio, clip_ratio).float(), response_mask)

    negative_pg_losses_clip = -advantages * negative_clip_ratio
    positive_pg_losses_clip = -advantages * (positive_clip_ratio / positive_clip_ratio.detach()) / positive_clip_ratio.detach()

    negative_dual_clip_ratio = torch.clamp(negative_clip_ratio, min=None, max=negative_clip_ratio_c)
    negative_clipped_mask = torch.gt(negative_clip_ratio, negative_dual_clip_ratio)
    negative_pg_clipfrac_dual = verl_F.masked_mean(negative_clipped_mask.float(), response_mask & (advantages < 0))
    negative_pg_losses_dual = -advantages * negative_dual_clip_ratio.detach() * log_prob
    negative_pg_losses = torch.where(negative_clipped_mask, negative_pg_losses_dual, negative_pg_losses_clip)

    positive_dual_clip_ratio = torch.clamp(1/positive_clip_ratio, min=None, max=positive_clip_ratio_c)
    positive_clipped_mask = torch.gt(1/positive_clip_ratio, positive_dual_clip_ratio)
    positive_pg_clipfrac_dual = verl_F.masked_mean(positive_clipped_mask.float(), response_mask & (advantages > 0))
    positive_pg_losses_dual = -advantages * positive_dual_clip_ratio.detach() * log_prob
    positive_pg_losses = torch.where(positive_clipped_mask, positive_pg_losses_dual, positive_pg_losses_clip)

    pg_losses = torch.where(advantages < 0, negative_pg_losses, positive_pg_losses)
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)

    return pg_loss, pg_clipfrac_upper, pg_clipfrac_lower, negative_pg_clipfrac_dual, positive_pg_clipfrac_dual
# --- end of the copy ---


# --- WooooDyy/BAPO recipe/bapo/policy_loss.py at 3b8389c5, lines 21-187 ---
def _compute_effective_advantage(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute masked effective advantage and the positive/negative sums."""

    # NOTE:
    # In the BAPO recipe, clip_low/clip_high are **explicit importance-ratio bounds**
    # (e.g. 0.6 and 1.2), NOT epsilons for (1±eps).
    clip_min = ratio.new_tensor(float(clip_low))
    clip_max = ratio.new_tensor(float(clip_high))

    ratio_pos = torch.minimum(ratio, clip_max)
    ratio_neg = torch.maximum(ratio, clip_min)
    effective_ratio = torch.where(advantages >= 0, ratio_pos, ratio_neg)

    effective_adv = effective_ratio * advantages * response_mask

    pos_contrib = effective_adv.clamp(min=0).sum()
    neg_contrib = (-effective_adv.clamp(max=0)).sum()

    # Make the bound-search decision **globally consistent** across DP ranks.
    # Otherwise each rank may choose different bounds (because each sees different data),
    # and the final all-reduced gradient corresponds to a mixture of objectives.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        stats = torch.stack(
            [pos_contrib.to(torch.float32), neg_contrib.to(torch.float32)],
        )
        torch.distributed.all_reduce(stats, op=torch.distributed.ReduceOp.SUM)
        pos_contrib = stats[0].to(pos_contrib.dtype)
        neg_contrib = stats[1].to(neg_contrib.dtype)

    if torch.all(neg_contrib <= 0):
        pos_neg_ratio = ratio.new_tensor(float("inf"))
    else:
        pos_neg_ratio = pos_contrib / (neg_contrib + ratio.new_tensor(eps))

    return effective_adv, pos_neg_ratio


def _append_metric(buffer: list[Dict[str, float]], clip_low: float, clip_high: float, ratio_value: float):
    buffer.append(
        {
            "clip_low": float(clip_low),
            "clip_high": float(clip_high),
            "pos_neg_ratio": float(ratio_value),
        }
    )


@register_policy_loss("bapo")
def compute_policy_loss_bapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: AlgoConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Compute PPO policy loss with dynamically adjusted clipping bounds."""

    assert config is not None, "Actor config must be provided for BAPO loss."
    assert hasattr(config, "policy_loss"), "Config is expected to carry a policy_loss section."

    pl_config = config.policy_loss

    # Start from actor defaults if recipe overrides are not provided
    # Convert legacy epsilon-style actor defaults (0.2) to explicit bounds (1-0.2, 1+0.2)
    clip_ratio = getattr(config, "clip_ratio", 0.2)
    default_low = 1.0 - (config.clip_ratio_low if getattr(config, "clip_ratio_low", None) is not None else clip_ratio)
    default_high = 1.0 + (
        config.clip_ratio_high if getattr(config, "clip_ratio_high", None) is not None else clip_ratio
    )

    ratio_low_cur = pl_config.ratio_lower_start if pl_config.ratio_lower_start is not None else default_low
    ratio_high_cur = pl_config.ratio_upper_start if pl_config.ratio_upper_start is not None else default_high

    ratio_low_max = pl_config.ratio_lower_max if pl_config.ratio_lower_max is not None else ratio_low_cur
    ratio_high_max = pl_config.ratio_upper_max if pl_config.ratio_upper_max is not None else ratio_high_cur

    ratio_low_step = max(pl_config.ratio_lower_step, 0.0)
    ratio_high_step = max(pl_config.ratio_upper_step, 0.0)

    target_ratio = max(pl_config.adv_ratio_target, 0.0)
    eps = pl_config.eps

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)

    buffer: list[Dict[str, float]] = []

    _, pos_neg_ratio = _compute_effective_advantage(
        ratio=ratio,
        advantages=advantages,
        response_mask=response_mask,
        clip_low=ratio_low_cur,
        clip_high=ratio_high_cur,
        eps=eps,
    )

    # adjust lower clip range first
    while pos_neg_ratio.item() < target_ratio and ratio_low_cur < ratio_low_max and ratio_low_step > 0:
        ratio_low_cur = min(ratio_low_cur + ratio_low_step, ratio_low_max)
        _, pos_neg_ratio = _compute_effective_advantage(
            ratio=ratio,
            advantages=advantages,
            response_mask=response_mask,
            clip_low=ratio_low_cur,
            clip_high=ratio_high_cur,
            eps=eps,
        )
        if pos_neg_ratio.item() >= target_ratio:
            break

    # if still unmet, increase upper bound
    while pos_neg_ratio.item() < target_ratio and ratio_high_cur < ratio_high_max and ratio_high_step > 0:
        ratio_high_cur = min(ratio_high_cur + ratio_high_step, ratio_high_max)
        _, pos_neg_ratio = _compute_effective_advantage(
            ratio=ratio,
            advantages=advantages,
            response_mask=response_mask,
            clip_low=ratio_low_cur,
            clip_high=ratio_high_cur,
            eps=eps,
        )
        if pos_neg_ratio.item() >= target_ratio:
            break

    # record metrics for the actor to log later
    _append_metric(buffer, ratio_low_cur, ratio_high_cur, pos_neg_ratio.item())

    # attach buffer to policy config for the actor to consume after the update
    if hasattr(pl_config, "_bapo_metrics_buffer"):
        pl_config._bapo_metrics_buffer.extend(buffer)
    else:
        pl_config._bapo_metrics_buffer = buffer

    clip_ratio_c = config.get("clip_ratio_c", 3.0)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, ratio_low_cur, ratio_high_cur)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = verl_F.masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = verl_F.masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask
    )

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)

    ppo_kl = verl_F.masked_mean(-negative_approx_kl, response_mask)

    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


# --- end of the copy ---


class _TRLFIPO:  # TRL's GRPOTrainer: the attributes its FIPO code reads
    def __init__(self, args, epsilon_low, epsilon_high):
        self.args, self.epsilon_low, self.epsilon_high = args, epsilon_low, epsilon_high
        self.loss_type, self.current_gradient_accumulation_steps = "fipo", 1

    # --- TRL PR #5434 trl/trainer/grpo_trainer.py, lines 2534-2616 ---
    @staticmethod
    @torch.no_grad()
    def get_fipo_loss_components(
        advantages: torch.Tensor,
        log_ratio_per_token: torch.Tensor,
        mask: torch.Tensor,
        epsilon_low: float,
        epsilon_high: float,
        clip_ratio_c: float = 10.0,
        decay_rate: float = 32.0,
        chunk_size: int = 128,
        influence_clip_ratio: float = 0.2,
        influence_clip_high_only: bool = True,
        safety_threshold: float = 10.0,
    ) -> dict[str, torch.Tensor]:
        """
        Computes the Future-KL influence weights and token losses used by the FIPO loss.
        """
        log_ratio_per_token = torch.clamp(log_ratio_per_token, min=-20.0, max=20.0)
        ratio = torch.exp(log_ratio_per_token)
        batch_size, response_len = log_ratio_per_token.shape
        device = log_ratio_per_token.device
        mask_bool = mask.to(dtype=torch.bool)
        mask_float = mask.to(dtype=log_ratio_per_token.dtype)
        completion_token_count = mask_float.sum().clamp(min=1.0)

        def masked_mean(values: torch.Tensor) -> torch.Tensor:
            return (values * mask_float).sum() / completion_token_count

        future_kl = torch.zeros((batch_size, response_len), device=device, dtype=log_ratio_per_token.dtype)
        pos_i = torch.arange(response_len, device=device).unsqueeze(1)
        filter_threshold = math.log(clip_ratio_c)
        ignore_mask = log_ratio_per_token > filter_threshold
        participation_mask = ~ignore_mask
        kl_response = log_ratio_per_token * mask_float
        kl_response = kl_response * participation_mask.to(dtype=log_ratio_per_token.dtype)

        gamma_t = torch.tensor(2 ** (-1.0 / decay_rate), dtype=log_ratio_per_token.dtype, device=device)
        for j_start in range(0, response_len, chunk_size):
            j_end = min(response_len, j_start + chunk_size)
            j_idx = torch.arange(j_start, j_end, device=device).unsqueeze(0)
            distance = j_idx - pos_i
            distance_mask = distance >= 0
            distance_clamped = distance.clamp(min=0)
            decay_block = torch.pow(gamma_t, distance_clamped) * distance_mask.to(dtype=log_ratio_per_token.dtype)
            future_kl += torch.matmul(kl_response[:, j_start:j_end], decay_block.t())

        raw_influence_weights = torch.exp(future_kl)
        if influence_clip_ratio != 0.0:
            if influence_clip_high_only:
                lower_bound = 1.0
                upper_bound = 1.0 + influence_clip_ratio
            else:
                lower_bound = 1.0 - influence_clip_ratio
                upper_bound = 1.0 + influence_clip_ratio
            influence_weights = torch.clamp(raw_influence_weights, min=lower_bound, max=upper_bound)
        else:
            lower_bound = 0.0
            upper_bound = 10.0
            influence_weights = torch.clamp(raw_influence_weights, max=10.0)

        mask_neg_high_is = (advantages < 0) & (ratio > safety_threshold)
        influence_weights = torch.where(mask_neg_high_is, torch.clamp(influence_weights, min=0.8, max=1.0), influence_weights)

        weighted_advantages = advantages * influence_weights
        pg_losses1 = -weighted_advantages * ratio
        pg_losses2 = -weighted_advantages * torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
        clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
        pg_losses3 = -weighted_advantages * clip_ratio_c

        lower_clip_mask = (advantages < 0) & (clip_pg_losses1 > pg_losses3) & mask_bool
        low_clip_token_counts = lower_clip_mask.sum(dim=1)
        seq_valid_mask = (low_clip_token_counts <= 1).unsqueeze(1)
        loss_mask = (mask_bool & seq_valid_mask).to(dtype=log_ratio_per_token.dtype)

        return {
            "loss_mask": loss_mask,
            "influence_weights": influence_weights,
            "influence_weights_mean_raw": masked_mean(raw_influence_weights),
            "influence_weight_clip_ratio_upper": masked_mean((influence_weights >= upper_bound - 1e-7).float()),
            "influence_weight_clip_ratio_lower": masked_mean((influence_weights <= lower_bound + 1e-7).float()),
            "sequence_drop_ratio": (~seq_valid_mask.squeeze(1)).float().mean(),
        }
    # --- end of the copy ---

    def loss(self, per_token_logps, old_per_token_logps, advantages, mask, mode="train"):
        """The loss of ``_compute_loss`` for ``loss_type="fipo"``: its log-ratio (line 2678), its ``fipo`` branch
        (lines 2717-2740) and its aggregation (lines 2785-2788), each copied unchanged."""
        # --- TRL PR #5434 trl/trainer/grpo_trainer.py, line 2678 ---
        log_ratio = per_token_logps - old_per_token_logps
        # --- end of the copy ---
        if self.loss_type != "fipo":
            raise ValueError(self.loss_type)
        # --- TRL PR #5434 trl/trainer/grpo_trainer.py, lines 2717-2740 ---
        elif self.loss_type == "fipo":
            fipo_outputs = self.get_fipo_loss_components(
                advantages=advantages,
                log_ratio_per_token=log_ratio,
                mask=mask,
                epsilon_low=self.epsilon_low,
                epsilon_high=self.epsilon_high,
                clip_ratio_c=self.args.fipo_clip_ratio_c,
                decay_rate=self.args.fipo_decay_rate,
                chunk_size=self.args.fipo_chunk_size,
                influence_clip_ratio=self.args.fipo_influence_clip_ratio,
                influence_clip_high_only=self.args.fipo_influence_clip_high_only,
                safety_threshold=self.args.fipo_safety_threshold,
            )
            coef_1 = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
            coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)
            weighted_advantages = advantages * fipo_outputs["influence_weights"]
            pg_losses1 = -weighted_advantages * coef_1
            pg_losses2 = -weighted_advantages * coef_2
            clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
            pg_losses3 = -weighted_advantages * self.args.fipo_clip_ratio_c
            clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
            per_token_loss = torch.where(weighted_advantages < 0, clip_pg_losses2, clip_pg_losses1)
            loss_mask = fipo_outputs["loss_mask"]
        # --- end of the copy ---
        if self.loss_type != "fipo":
            raise ValueError(self.loss_type)
        # --- TRL PR #5434 trl/trainer/grpo_trainer.py, lines 2785-2788 ---
        elif self.loss_type == "fipo":
            loss = (per_token_loss * loss_mask).sum() / loss_mask.sum().clamp(min=1.0)
            normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0  # no accum in eval
            loss = loss / normalizer
        # --- end of the copy ---
        return loss, per_token_loss, loss_mask
