"""Every key ``python -m atr_llm.train`` (``ATRGRPOTrainer``) logs, declared once: its name, who defines it (this
package, TRL 1.16's ``GRPOTrainer`` or transformers' ``Trainer``), what it means, its range and when it is logged.

The trainer page's metrics table is written from ``LOGGED_METRICS`` (``docs/hooks/config_fields.py``), and
``tests/test_logged_metrics.py`` holds the declaration to the code: every key a tiny run logs, and every key the
functions that log (``atr_theory.LossOutput.metrics``, ``atr_llm.trl_options.trl_metrics``,
``atr_llm.true_kl.true_kl_summary``, ``atr_llm.rewards.CorrectnessReward.pop_stats``) can return for any rule and layer, is
matched by exactly one entry, and every entry is matched by one of them or says why a CPU test cannot log it
(``cpu_absent``). With an evaluation set, transformers logs the evaluation's keys again under an ``eval_`` prefix;
they are not listed here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

__all__ = ["LoggedMetric", "LOGGED_METRICS", "metric_for_key"]

OURS, TRL, TRANSFORMERS = "atr_llm", "TRL", "transformers"
FRACTION = "[0, 1]"


@dataclass(frozen=True)
class LoggedMetric:
    """One logged key (``{name}`` in ``key`` stands for any one path segment: a reward function's name, a layer,
    a grading outcome), who defines it, what it means, its range, when it is logged, and, where no CPU test can log
    it, why (``cpu_absent``)."""

    key: str
    source: str
    meaning: str
    value_range: str
    when: str = "every logging step"
    cpu_absent: str = ""

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        parts = re.split(r"(\{[a-z_]+\})", self.key)
        return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts if p) + r"\Z")


_RULE = "a rule's metrics (`atr_theory.LossOutput.metrics`), one loss call's valid tokens averaged over processes"
_MASK_FORM = "for a rule with a mask form (a ratio range, DPPO, the k-masks)"
_TRUE_KL = "`--measure_true_kl true`"
_ROLLOUT = "another engine generated (`--use_vllm`): its log-probs of the sampled tokens"

LOGGED_METRICS: tuple[LoggedMetric, ...] = (
    # -- this package: the rule, every step -------------------------------------------------------------------------
    LoggedMetric("clip/frac_kept", OURS, "fraction of valid tokens where the rule's constraint holds " + f"({_RULE})",
                 FRACTION),
    LoggedMetric("clip/frac_masked", OURS, "1 - `clip/frac_kept`: the tokens the rule freezes", FRACTION),
    LoggedMetric("clip/frac_clipped_low", OURS, "fraction of valid tokens the rule clips below (w under its range)",
                 FRACTION),
    LoggedMetric("clip/frac_clipped_high", OURS, "fraction of valid tokens the rule clips above (w over its range)",
                 FRACTION),
    LoggedMetric("clip/frac_ratio_moved", OURS,
                 "fraction of valid tokens whose ratio moved away from 1 (|log w| > `RATIO_NOISE_TOL`); near 0 means "
                 "a single update per batch, where no rule acts", FRACTION),
    LoggedMetric("clip/mean_k3", OURS, "mean of k3 = w - 1 - log w over valid tokens (the ATR constraint's estimator)",
                 "[0, inf)"),
    *(
        LoggedMetric(f"clip/ratio_{stat}", OURS, f"the ratio w = pi / pi_old over valid tokens: {words}", "(0, inf)")
        for stat, words in (
            ("mean", "mean"),
            ("min", "minimum"),
            ("p05", "5th percentile (nearest rank)"),
            ("p50", "median (nearest rank)"),
            ("p95", "95th percentile (nearest rank)"),
            ("max", "maximum"),
        )
    ),
    LoggedMetric("clip/frac_outside_against_advantage", OURS,
                 "fraction of valid tokens outside the rule's range on the side against their advantage: where the "
                 "min and mask forms part (`atr_theory.outside_by_advantage`)", FRACTION, _MASK_FORM),
    LoggedMetric("clip/frac_outside_with_advantage", OURS,
                 "fraction of valid tokens outside the rule's range on the side of their advantage (both forms stop "
                 "them)", FRACTION, _MASK_FORM),
    LoggedMetric("clip/frac_dropped_{layer}", OURS,
                 "fraction of valid tokens a layer dropped: `sequence_mask`, `entropy_mask` or `rollout_correction` "
                 "(mask mode)", FRACTION, "with that layer (`--sequence_mask_*`, `--top_entropy_quantile` < 1, "
                 "`--rollout_correction_mode mask`)"),
    # -- this package: the true KL (--measure_true_kl) ------------------------------------------------------------
    LoggedMetric("true_kl/mean", OURS, "mean over valid positions of the full-vocabulary KL(pi_old || pi)",
                 "[0, inf)", _TRUE_KL),
    LoggedMetric("true_kl/p95", OURS, "95th percentile of KL(pi_old || pi) over valid positions", "[0, inf)",
                 _TRUE_KL),
    LoggedMetric("true_kl/reverse_mean", OURS, "mean of the reverse KL(pi || pi_old)", "[0, inf)",
                 _TRUE_KL),
    LoggedMetric("true_kl/reverse_p95", OURS, "95th percentile of KL(pi || pi_old)", "[0, inf)",
                 _TRUE_KL),
    LoggedMetric("true_kl/frac_above_delta", OURS, "fraction of valid positions with KL(pi_old || pi) > "
                 "`true_kl_delta` (default the rule's delta)", FRACTION, _TRUE_KL),
    LoggedMetric("true_kl/frac_above_delta_kept", OURS, "that fraction among the tokens the rule kept", FRACTION,
                 _TRUE_KL + ", a kept token in the step"),
    LoggedMetric("true_kl/frac_above_delta_dropped", OURS, "that fraction among the tokens the rule dropped",
                 FRACTION, _TRUE_KL + ", a dropped token in the step"),
    LoggedMetric("true_kl/k3_rank_corr", OURS, "rank correlation between the sampled token's k3 and its position's "
                 "true KL (how well the one-sample estimate orders positions)", "[-1, 1]",
                 _TRUE_KL),
    LoggedMetric("true_kl/k1_mean", OURS, "mean of the sampled-token estimate k1 = -log w", "(-inf, inf)",
                 _TRUE_KL),
    LoggedMetric("true_kl/k3_mean", OURS, "mean of the sampled-token estimate k3 = w - 1 - log w", "[0, inf)",
                 _TRUE_KL),
    LoggedMetric("true_kl/mean_against_advantage", OURS, "mean true KL at the positions outside the rule's range "
                 "against their advantage", "[0, inf)", _TRUE_KL + ", " + _MASK_FORM.replace("for ", "")),
    # -- this package: the math reward's grading ------------------------------------------------------------------
    LoggedMetric("reward/{outcome}_frac", OURS, "fraction of graded completions by outcome (`correct`, `wrong`, "
                 "`unparsable`, `timeout`, `error`; `truncated` with `--truncated_reward`)", FRACTION,
                 "with the package's math reward (`atr_llm.rewards.CorrectnessReward`)"),
    # -- TRL's names, this package's computation ------------------------------------------------------------------
    LoggedMetric("entropy", TRL, "mean token entropy of the policy over valid completion tokens", "[0, log V]"),
    LoggedMetric("kl", TRL, "mean per-token KL estimate to the reference model (`--kl_estimator`, TRL's k3 by "
                 "default)", "[0, inf) for k3", "`--beta` > 0"),
    LoggedMetric("clip_ratio/low_mean", TRL, "fraction of tokens clipped below (TRL's definition under "
                 "`--method trl`; the rule's own flags otherwise)", FRACTION, "a rule that is not a TRL loss type"),
    LoggedMetric("clip_ratio/high_mean", TRL, "fraction of tokens clipped above", FRACTION,
                 "a rule that is not a TRL loss type"),
    LoggedMetric("clip_ratio/region_mean", TRL, "fraction of tokens clipped on either side", FRACTION,
                 "a rule that is not a TRL loss type"),
    LoggedMetric("clip_ratio/low_min", TRL, "smallest per-sequence fraction clipped below", FRACTION,
                 "a rule that is not a TRL loss type"),
    LoggedMetric("clip_ratio/high_max", TRL, "largest per-sequence fraction clipped above", FRACTION,
                 "a rule that is not a TRL loss type"),
    LoggedMetric("cispo_clip_ratio", TRL, "fraction of tokens whose CISPO weight is truncated", FRACTION,
                 "`--loss_type cispo`"),
    LoggedMetric("vespo/phi_seq_mean", TRL, "mean of VESPO's per-sequence weight phi", "[0, inf)",
                 "`--loss_type vespo`"),
    LoggedMetric("policy_loss", TRL, "the policy loss alone, before the entropy bonus and the auxiliary loss",
                 "(-inf, inf)", "an entropy bonus or a Mixture-of-Experts auxiliary loss"),
    LoggedMetric("entropy_coef", TRL, "the entropy bonus's coefficient (moves with `--use_adaptive_entropy`)",
                 "[0, inf)", "`--entropy_coef` != 0 or `--use_adaptive_entropy`"),
    LoggedMetric("aux_loss", TRL, "the Mixture-of-Experts router's auxiliary loss", "[0, inf)",
                 "a Mixture-of-Experts model with `output_router_logits`"),
    # -- TRL 1.16's GRPOTrainer, unchanged -------------------------------------------------------------------------
    LoggedMetric("reward", TRL, "mean total reward of the step's completions (weighted sum of the reward "
                 "functions)", "the rewards' range"),
    LoggedMetric("reward_std", TRL, "standard deviation of the total reward", "[0, inf)"),
    LoggedMetric("frac_reward_zero_std", TRL, "fraction of groups whose rewards are all equal (advantage 0: no "
                 "signal)", FRACTION),
    LoggedMetric("rewards/{reward}/mean", TRL, "mean of one reward function (its `__name__`)", "its range"),
    LoggedMetric("rewards/{reward}/std", TRL, "standard deviation of one reward function", "[0, inf)"),
    LoggedMetric("num_tokens", TRL, "prompt and completion tokens seen so far", "[0, inf)"),
    LoggedMetric("completions/mean_length", TRL, "mean completion length (tokens)", "[0, max_completion_length]"),
    LoggedMetric("completions/min_length", TRL, "shortest completion", "[0, max_completion_length]"),
    LoggedMetric("completions/max_length", TRL, "longest completion", "[0, max_completion_length]"),
    LoggedMetric("completions/clipped_ratio", TRL, "fraction of completions cut at `max_completion_length` "
                 "(no EOS)", FRACTION),
    LoggedMetric("completions/mean_terminated_length", TRL, "mean length of the completions that ended with EOS "
                 "(0 when none did)", "[0, max_completion_length]"),
    LoggedMetric("completions/min_terminated_length", TRL, "shortest terminated completion",
                 "[0, max_completion_length]"),
    LoggedMetric("completions/max_terminated_length", TRL, "longest terminated completion",
                 "[0, max_completion_length]"),
    LoggedMetric("step_time", TRL, "seconds of the last optimizer step, generation included", "(0, inf)"),
    LoggedMetric("sampling/sampling_logp_difference/mean", TRL, "mean |log pi_old - log pi_vLLM| over valid tokens",
                 "[0, inf)", "`--use_vllm` with its importance-sampling correction", "needs vLLM and a GPU"),
    LoggedMetric("sampling/sampling_logp_difference/max", TRL, "largest |log pi_old - log pi_vLLM|", "[0, inf)",
                 "`--use_vllm` with its importance-sampling correction", "needs vLLM and a GPU"),
    LoggedMetric("sampling/importance_sampling_ratio/min", TRL, "smallest vLLM importance-sampling ratio",
                 "[0, inf)", "`--use_vllm` with its importance-sampling correction", "needs vLLM and a GPU"),
    LoggedMetric("sampling/importance_sampling_ratio/mean", TRL, "mean vLLM importance-sampling ratio", "[0, inf)",
                 "`--use_vllm` with its importance-sampling correction", "needs vLLM and a GPU"),
    LoggedMetric("sampling/importance_sampling_ratio/max", TRL, "largest vLLM importance-sampling ratio", "[0, inf)",
                 "`--use_vllm` with its importance-sampling correction", "needs vLLM and a GPU"),
    # -- this package, under verl's names: the train-rollout mismatch (atr_llm.rollout_mismatch) -----------------
    *(
        LoggedMetric("rollout_corr/" + name, OURS, meaning + " (`atr_llm.rollout_mismatch`; verl logs it under this "
                     "name)" * (not name.startswith("seq_")), value_range, _ROLLOUT)
        for name, meaning, value_range in (
            ("kl", "k1 estimate of KL(mu || pi_old): mean of log mu - log pi_old over valid tokens, mu the rollout "
             "engine's policy", "(-inf, inf)"),
            ("k3_kl", "k3 estimate of the same KL: mean of rho - 1 - log rho, rho = pi_old / mu", "[0, inf)"),
            ("chi2_token", "chi-squared(pi_old || mu) per token: mean rho^2 - 1", "[-1, inf)"),
            ("chi2_seq", "chi-squared per sequence: mean over sequences of (prod_t rho_t)^2 - 1", "[-1, inf)"),
            ("training_ppl", "mean over sequences of pi_old's perplexity of the completion", "[1, inf)"),
            ("training_log_ppl", "mean over sequences of pi_old's log-perplexity", "[0, inf)"),
            ("rollout_ppl", "mean over sequences of the rollout engine's perplexity", "[1, inf)"),
            ("rollout_log_ppl", "mean over sequences of the rollout engine's log-perplexity", "[0, inf)"),
            ("log_ppl_diff", "mean over sequences of d = mean_t (log mu - log pi_old)", "(-inf, inf)"),
            ("log_ppl_abs_diff", "mean over sequences of |d|", "[0, inf)"),
            ("log_ppl_diff_max", "largest d (over processes too)", "(-inf, inf)"),
            ("log_ppl_diff_min", "smallest d (over processes too)", "(-inf, inf)"),
            ("ppl_ratio", "mean over sequences of exp(d), pi_old's perplexity over the engine's", "(0, inf)"),
            ("seq_log_ratio_mean", "mean over sequences of the sequence log-ratio sum_t log rho_t", "(-inf, inf)"),
            ("seq_log_ratio_max", "largest |sum_t log rho_t| (over processes too)", "[0, inf)"),
        )
    ),
    LoggedMetric("tools/call_frequency", TRL, "tool calls per completion", "[0, inf)", "with `tools`",
                 "the package's runs give the model no tools"),
    LoggedMetric("tools/failure_frequency", TRL, "fraction of tool calls that failed", FRACTION, "with `tools`",
                 "the package's runs give the model no tools"),
    # -- transformers' Trainer -------------------------------------------------------------------------------------
    LoggedMetric("loss", TRANSFORMERS, "the training loss averaged since the last log (policy loss, minus the "
                 "entropy bonus, plus beta x KL)", "(-inf, inf)"),
    LoggedMetric("grad_norm", TRANSFORMERS, "gradient norm before clipping (`--max_grad_norm`)", "[0, inf)"),
    LoggedMetric("learning_rate", TRANSFORMERS, "the scheduler's learning rate at this step", "[0, inf)"),
    LoggedMetric("epoch", TRANSFORMERS, "epochs of the training set completed (fractional)", "[0, inf)"),
    LoggedMetric("train_loss", TRANSFORMERS, "the mean training loss over the run", "(-inf, inf)", "the last entry"),
    LoggedMetric("train_runtime", TRANSFORMERS, "seconds the run took", "(0, inf)", "the last entry"),
    LoggedMetric("train_samples_per_second", TRANSFORMERS, "prompts per second over the run", "(0, inf)",
                 "the last entry"),
    LoggedMetric("train_steps_per_second", TRANSFORMERS, "optimizer steps per second over the run", "(0, inf)",
                 "the last entry"),
    LoggedMetric("total_flos", TRANSFORMERS, "floating-point operations of the run (transformers' estimate)",
                 "[0, inf)", "the last entry"),
)
"""The declaration: one entry per logged key (``step`` is transformers' step counter, not a metric)."""


def metric_for_key(key: str) -> LoggedMetric | None:
    """The entry of ``LOGGED_METRICS`` whose key matches ``key``, or None."""
    found = [m for m in LOGGED_METRICS if m.pattern.match(key)]
    return found[0] if found else None
