"""ROLL's own ``pg_variant`` losses ``topr`` and ``kimi15``, copied as a test-only oracle (ROLL is not on PyPI: the
name ``roll`` there is another project, so it cannot be installed the way ``areal`` and ``verl`` are).

Source: github.com/alibaba/ROLL at commit 8eb27cc2dc34c4d1310b169d9b86d339004d811a (the file last changed in
9de2784e3297f6a62e31607f487e15b7e68036a6), ``roll/pipeline/rlvr/actor_pg_worker.py``: ``ActorPGWorker._compute_topr_loss``
(lines 253-331) and ``ActorPGWorker._compute_kimi15_loss`` (lines 408-442), unchanged below between the markers.
Licence: Apache License 2.0 (ROLL's LICENSE), copyright Alibaba; this file is not part of the installed package.

Around the two methods: ``RollWorker`` stands in for what they read from ``self`` (the config cache, the logger and
the metrics dict, which the loss itself does not use) and ``Data`` for ROLL's ``DataProto`` (``batch["scores"]``).
"""
# ruff: noqa

from __future__ import annotations

import logging
from types import SimpleNamespace

import torch

DataProto = SimpleNamespace


class _RollPGVariants:
    # --- ROLL roll/pipeline/rlvr/actor_pg_worker.py, lines 253-331 ---
    def _compute_topr_loss(self, ratio: torch.Tensor, log_probs: torch.Tensor, old_log_probs: torch.Tensor,
                           advantages: torch.Tensor, data: DataProto):
        """
        计算TOPR (Tapered off-policy REINFORCE) 损失. https://arxiv.org/abs/2503.14286

        根据论文公式(8):
        ∇J_TOPR(π) = Σ_{τ∈T^+} μ(τ)R(τ)∇log π(τ) + Σ_{τ∈T^-} μ(τ)[π(τ)/μ(τ)]_0^1 R(τ)∇log π(τ)

        - 正样本(T^+): SFT更新, 直接对log π(τ)求导, 不使用importance sampling
        - 负样本(T^-): TIS更新, 使用clipped importance sampling ratio [0,1]

        Args:
            ratio: 重要性采样比率 π(a|s) / π_old(a|s) [batch_size, seq_len]
            log_probs: 当前策略的log概率 [batch_size, seq_len]
            old_log_probs: 旧策略的log概率 [batch_size, seq_len]
            advantages: 优势函数值 [batch_size, seq_len]
            data: 数据，包含奖励/分数信息

        Returns:
            topr_loss: TOPR损失 [batch_size, seq_len]
        """
        # 缓存TOPR配置
        positive_weight = self._get_or_cache_config('topr_positive_weight', 1.0)
        negative_weight = self._get_or_cache_config('topr_negative_weight', 1.0)

        scores = data.batch['scores']
        positive_mask = (scores > 0).float()
        negative_mask = (scores <= 0).float()

        if not self._topr_sample_logged:
            total_samples = len(scores)
            positive_count = positive_mask.sum().item()
            negative_count = negative_mask.sum().item()
            self.logger.info(f"TOPR样本分布 - 总样本: {total_samples}, 正样本: {positive_count} ({positive_count/total_samples*100:.1f}%), 负样本: {negative_count} ({negative_count/total_samples*100:.1f}%)")
            self.logger.info(f"TOPR奖励统计 - 平均: {scores.mean().item():.4f}, 标准差: {scores.std().item():.4f}, 最大: {scores.max().item():.4f}, 最小: {scores.min().item():.4f}")
            self.logger.info(f"TOPR权重配置 - 正样本权重: {positive_weight}, 负样本权重: {negative_weight}")
            self._topr_sample_logged = True

        # 计算损失组件
        positive_token_mask = positive_mask.unsqueeze(-1)
        negative_token_mask = negative_mask.unsqueeze(-1)

        positive_loss = - advantages * log_probs * positive_token_mask

        # 负样本: TIS更新，使用clipped importance sampling ratio
        # 梯度是: -[π(τ)/μ(τ)]_0^1 * R(τ) * ∇log π(τ)
        clipped_ratio = torch.clamp(ratio, min=0.0, max=1.0).detach()
        negative_loss = - clipped_ratio * advantages * log_probs * negative_token_mask

        weighted_positive_loss = positive_weight * positive_loss
        weighted_negative_loss = negative_weight * negative_loss

        topr_loss = weighted_positive_loss + weighted_negative_loss



        # 缓存TOPR相关指标
        negative_lower_clipped = ((ratio < 0.0) & (negative_token_mask > 0)).float()
        negative_upper_clipped = ((ratio > 1.0) & (negative_token_mask > 0)).float()
        negative_total_clipped = negative_lower_clipped + negative_upper_clipped
        self._cached_metrics.update({
            "topr_positive_loss": positive_loss,
            "topr_negative_loss": negative_loss,
            "topr_weighted_positive_loss": weighted_positive_loss,
            "topr_weighted_negative_loss": weighted_negative_loss,
            "topr_positive_weight": positive_weight,
            "topr_negative_weight": negative_weight,
            "topr_positive_samples": positive_mask.sum().detach().item(),
            "topr_negative_samples": negative_mask.sum().detach().item(),
            "topr_positive_ratio": (positive_mask.sum() / (positive_mask.size(0) + 1e-8)).detach().item(),
            "topr_negative_ratio": (negative_mask.sum() / (negative_mask.size(0) + 1e-8)).detach().item(),
            "topr_negative_lower_clipfrac": negative_lower_clipped.mean().detach().item(),
            "topr_negative_upper_clipfrac": negative_upper_clipped.mean().detach().item(),
            "topr_negative_total_clipfrac": negative_total_clipped.mean().detach().item(),
            "topr_scores_mean": scores.mean().detach().item(),
            "topr_scores_std": scores.std().detach().item(),
        })

        return topr_loss
    # --- end of lines 253-331 ---

    # --- ROLL roll/pipeline/rlvr/actor_pg_worker.py, lines 408-442 ---
    def _compute_kimi15_loss(self, ratio: torch.Tensor, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor):
        """
        计算Kimi15损失 https://arxiv.org/pdf/2501.12599

        根据论文公式(3):
        1/k Σ (∇_θ log π_θ(y_j, z_j|x)(r(x, y_j, y*) - r̄) - τ/2 ∇_θ (log π_θ(y_j, z_j|x)/π_θ_i(y_j, z_j|x))^2)

        这相当于最小化损失函数的负值:
        L = -[(r - r̄) * log π_θ - τ/2 * (log π_θ/π_θ_i)^2]
        """
        # 缓存Kimi15配置
        tau = self._get_or_cache_config('kimi15_tau', 0.1)

        if not self._kimi15_config_logged:
            self.logger.info(f"Kimi15配置 - tau (正则化参数): {tau}")
            self._kimi15_config_logged = True

        # 计算并缓存指标
        log_ratio = torch.log(ratio + 1e-8)
        policy_grad_magnitude = (advantages * log_ratio).abs().mean().item()
        kl_reg_magnitude = (tau * log_ratio.pow(2) * 0.5).mean().item()

        kimi15_loss = - advantages * log_probs + tau * 0.5 * (log_probs - old_log_probs).pow(2)

        self._cached_metrics.update({
            "kimi15_tau": tau,
            "kimi15_log_ratio_mean": log_ratio.mean().item(),
            "kimi15_log_ratio_std": log_ratio.std().item(),
            "kimi15_log_ratio_abs_mean": log_ratio.abs().mean().item(),
            "kimi15_policy_grad_magnitude": policy_grad_magnitude,
            "kimi15_kl_reg_magnitude": kl_reg_magnitude,
            "kimi15_reg_ratio": kl_reg_magnitude / (policy_grad_magnitude + 1e-8),
        })

        return kimi15_loss
    # --- end of lines 408-442 ---


class RollWorker(_RollPGVariants):
    """``self`` for the two methods: ``pipeline_config.actor_train`` holds the ``pg_variant`` parameters."""

    def __init__(self, **config):
        self._pg_config_cache = dict(config)
        self._topr_sample_logged = True
        self._kimi15_config_logged = True
        self._cached_metrics = {}
        self.logger = logging.getLogger("roll_pg_variants")

    def _get_or_cache_config(self, key, default_value):
        return self._pg_config_cache.setdefault(key, default_value)


def roll_topr_loss(log_probs, old_log_probs, advantages, scores, **config):
    """ROLL's per-token TOPR loss (to minimise), (B, T): its ``ratio = (log_probs - old_log_probs).exp()`` as in its
    ``loss_func`` (line 72)."""
    ratio = (log_probs - old_log_probs).exp()
    data = DataProto(batch={"scores": scores})
    return RollWorker(**config)._compute_topr_loss(ratio, log_probs, old_log_probs, advantages, data)


def roll_kimi15_loss(log_probs, old_log_probs, advantages, **config):
    """ROLL's per-token Kimi k1.5 loss (to minimise), (B, T)."""
    ratio = (log_probs - old_log_probs).exp()
    return RollWorker(**config)._compute_kimi15_loss(ratio, log_probs, old_log_probs, advantages)
