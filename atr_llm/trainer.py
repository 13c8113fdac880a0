"""``ATRGRPOTrainer``: TRL's GRPOTrainer with the loss delegated to ``atr_theory.policy_loss``.

Only the loss changes. TRL still generates, scores, computes group advantages, old log-probs and (with
vLLM) the importance-sampling ratio; the trainer hands per-token log-probs, old log-probs, advantages
and the completion mask to ``atr_theory.policy_loss`` -- no clipping or ratio formula lives here.

**Inert clipping.** When ``gradient_accumulation_steps`` is a multiple of ``steps_per_generation *
num_iterations`` no optimizer step separates generation from the loss: TRL uses ``old = logp.detach()``
(or, with vLLM importance sampling, computes old log-probs with the same parameters), every ratio is 1
and every clipping rule is a no-op. The logged ``clip/frac_ratio_moved`` shows it per step. The trainer
detects this at start-up and warns; our presets set ``num_iterations: 2`` so each generated batch is
used for two optimizer passes and the second pass sees ``w != 1``.

Methods that need full distributions (``tr_ppo``, ``truly_ppo``) never build a (B, T, V) tensor: at generation
the policy's final hidden states (B, T, H) are kept as pi_old (one extra decoder forward per generation batch,
plus a snapshot of the LM head if the head itself trains), and the loss computes log-probs, entropies and
``KL(pi_old || pi)`` from hidden states and head ``kl_chunk_size`` positions at a time
(``atr_theory.head_kl_chunked``; extra memory O(kl_chunk_size x V), see benchmarks/real_vocab_step.py).

Methods that read the top-K (``dppo_topk_tv``, ``dppo_topk_kl``) keep, at generation, the generating policy's
``dppo_topk`` most likely tokens other than the sampled one and their log-probs (K x T per completion; one extra
forward without gradient per generation batch), and gather the current policy's log-probs at those ids from the
log-softmax that gives the sampled tokens' own.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings

import torch
from trl import GRPOTrainer

import atr_theory as at

from .checkpoints import (  # noqa: F401  (completed_epochs, the cycle helpers: part of this module's API)
    CYCLE_FILE,
    ExactResumeMixin,
    completed_epochs,
    load_cycle_state,
    save_cycle_state,
)
from .compat import check_supported_versions, logprob_tile_fitted_to_vocabulary, trl_logps_kernel_available  # noqa: F401
from .config import ATRGRPOConfig, clipping_is_inert, inert_clipping_message, trl_loss_types
from .fast_generation import (
    PROMPT_ALLOWANCE,
    check_packed_gqa_model,
    compiled_generation_config,
    generation_context,
    resolve_mode,
    tensors_kept,
)
from .model_parts import base_model, head_snapshot, last_hidden_states, output_head
from .rollout_mismatch import MISMATCH_PREFIX, rollout_mismatch_metrics
from .trl_options import EntropyBonus, EntropyBonusField, trl_metrics, trl_option_layers
from .true_kl import true_kl_summary


def completion_log_softmax(model, input_ids, attention_mask, logits_to_keep, temperature=1.0, aux_losses=None):
    """(B, T, V) ``log_softmax(logits / temperature)`` at the positions that predict the last ``logits_to_keep`` tokens;
    with a list ``aux_losses``, a Mixture-of-Experts model's router loss of the forward is appended to it."""
    extra = {} if aux_losses is None else {"output_router_logits": True}
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, **extra)
    if aux_losses is not None:
        aux_losses.append(outputs.aux_loss)
    logits = outputs.logits
    return torch.log_softmax(logits[:, -logits_to_keep - 1 : -1, :].float() / temperature, dim=-1)


def plain_logps_and_entropies(
    model,
    input_ids,
    attention_mask,
    logits_to_keep,
    temperature=1.0,
    batch_size=None,
    compute_entropy=False,
    aux_losses=None,
):
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` tokens from a plain forward:
    ``log_softmax(logits / temperature)`` gathered at the next token. Batched by ``batch_size`` rows; with a list
    ``aux_losses``, each batch's router loss is appended to it (a Mixture-of-Experts model)."""
    batch_size = batch_size or input_ids.size(0)
    logps, ents = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids = input_ids[start : start + batch_size]
        lsm = completion_log_softmax(
            model, ids, attention_mask[start : start + batch_size], logits_to_keep, temperature, aux_losses
        )
        logps.append(lsm.gather(-1, ids[:, -logits_to_keep:].unsqueeze(-1)).squeeze(-1))
        if compute_entropy:
            ents.append(at.entropy_from_log_probs(lsm))
    return torch.cat(logps), (torch.cat(ents) if compute_entropy else None)


def check_plain_logit_head(model, method: str) -> None:
    """The full-distribution methods compute logits as ``head(hidden) / temperature`` from the decoder's final
    hidden states; refuse a model whose logits are transformed after the head (Gemma 2's soft-capping,
    Cohere's ``logit_scale``), naming the attribute."""
    config = getattr(base_model(model), "config", None)
    for attr in ("final_logit_softcapping", "logit_scale"):
        value = getattr(config, attr, None)
        if value not in (None, 0, 1, 1.0):
            raise ValueError(
                f"method {method!r} scores from hidden states with the plain LM head, but this model's config has "
                f"{attr}={value!r} (its logits are transformed after the head); use a per-token method"
            )


class ATRLossMixin:
    """The overrides, as a mixin so they can sit on TRL's GRPOTrainer or on Unsloth's patched one."""

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **kwargs,
    ):
        """TRL's fused path where it works (its tile fitted to the vocabulary:
        ``logprob_tile_fitted_to_vocabulary``); a plain forward where TRL's needs Triton and has none (CPU,
        TRL <= 1.15). While generating, TRL's no-grad forward for pi_old's log-probs is skipped when
        ``_old_logps_at_first_use`` (set by ``ATRGRPOTrainer``, never on Unsloth's trainer): the batch's first loss
        forward supplies the same numbers (``_loss_inputs``)."""
        if getattr(self, "_generating", False) and getattr(self, "_old_logps_at_first_use", False):
            if not torch.is_grad_enabled():
                return None, None, None
        if trl_logps_kernel_available():
            with logprob_tile_fitted_to_vocabulary(output_head(model).weight.shape[0]):
                return super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size=batch_size,
                    compute_entropy=compute_entropy,
                    compute_aux_loss=compute_aux_loss,
                    **kwargs,
                )
        aux_losses = [] if compute_aux_loss else None
        logps, ents = plain_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, self.temperature, batch_size, compute_entropy, aux_losses
        )
        return logps, ents, (torch.stack(aux_losses).mean() if compute_aux_loss else None)  # as TRL: the batches' mean

    def __init__(self, model, reward_funcs=None, args=None, *rest, **kwargs):
        """TRL's signature and positional order; ``args=None`` builds the default config as TRL does
        (``ATRGRPOConfig("<model name>-GRPO")``)."""
        if args is None:
            args = ATRGRPOConfig(default_output_dir(model))
        elif not isinstance(args, ATRGRPOConfig):
            raise ValueError(
                f"ATRGRPOTrainer needs args=ATRGRPOConfig(...), got {type(args).__name__}: ATRGRPOConfig takes every "
                "GRPOConfig field plus the method (method='trl' trains TRL's own rule for the config)"
            )
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        self.atr_method = self.args.resolved_method  # validated when the config was built
        self.method_spec = self.atr_method.spec
        self._method_generator = torch.Generator().manual_seed(self.args.method_seed)
        self._entropy_bonus = EntropyBonus.from_args(self.args)
        if getattr(self, "aux_loss_enabled", False) and self.method_spec.needs_full_distributions:
            raise ValueError(
                f"method {self.method_spec.name!r} scores from hidden states, which gives no router loss, and this "
                f"Mixture-of-Experts model has router_aux_loss_coef={self.router_aux_loss_coef}: set "
                "router_aux_loss_coef=0 to train without it, or use a per-token method"
            )
        self._old_head: dict[str, torch.Tensor | None] = {}
        if self.method_spec.needs_full_distributions:
            check_plain_logit_head(self.model, self.method_spec.name)
        if self.method_spec.needs_topk:
            vocabulary = output_head(self.model).weight.shape[0]
            if self.args.dppo_topk > vocabulary - 1:
                raise ValueError(
                    f"dppo_topk={self.args.dppo_topk}: expected at most the vocabulary size - 1 = {vocabulary - 1} "
                    "(the other tokens of this model's vocabulary)"
                )
        self.clipping_inert = clipping_is_inert(self.args)
        if self.clipping_inert:
            warnings.warn(inert_clipping_message(self.args), stacklevel=2)

    # ---- TRL's entropy controller state: one place, the EntropyBonus; TRL's names read and write it ---------------
    entropy_coef = EntropyBonusField("coef", 0.0)
    """TRL's ``entropy_coef``: the bonus's current coefficient (it moves under ``use_adaptive_entropy``), what TRL
    saves in a checkpoint's ``entropy_ctrl_state.json`` and restores."""
    _last_world_entropy = EntropyBonusField("last_window_entropy", math.inf)

    # ---- full distributions (tr_ppo, truly_ppo): hidden states and the head, never (B, T, V) --------
    def _completion_hidden(self, model, input_ids, attention_mask, logits_to_keep):
        """(B, T, H) final-norm hidden states at the positions that predict the last ``logits_to_keep`` tokens."""
        return last_hidden_states(model, input_ids, attention_mask)[:, -logits_to_keep - 1 : -1, :]

    def _measurement_hidden(self, model, input_ids, attention_mask, logits_to_keep):
        """``_completion_hidden`` for a measurement: no gradient, the model in eval mode (no dropout) and the random
        state restored after, so that measuring draws nothing training would have drawn."""
        was_training = model.training
        devices = [self.accelerator.device] if self.accelerator.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            model.eval()
            try:
                return self._completion_hidden(model, input_ids, attention_mask, logits_to_keep)
            finally:
                model.train(was_training)

    def _generate_and_score_completions(self, inputs):
        """TRL's generation and scoring (``_generating`` set meanwhile), then what the rule keeps of pi_old beyond
        its log-probs: the top-K, hidden states and the head, the true-KL measurement's hidden states."""
        self._generating = True
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._generating = False
        if self.args.measure_true_kl:  # pi_old for the true KL: the generating policy's hidden states and head
            ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            output["true_kl_old_hidden"] = self._measurement_hidden(
                self.model, ids, mask, output["completion_ids"].size(1)
            )
            self._true_kl_old_head = head_snapshot(self.model)
        if self.method_spec.needs_topk:
            output["old_topk_ids"], output["old_topk_logp"] = self._old_topk(output)
        if self.method_spec.needs_full_distributions and output.get("old_per_token_logps") is not None:
            # pi_old is kept as the policy's hidden states (H values per position, not V) and, when the head
            # itself trains, a snapshot of its weights; KL(pi_old || pi) is then recomputed chunk by chunk
            ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            with torch.no_grad():
                output["old_hidden_states"] = self._completion_hidden(
                    self.model, ids, mask, output["completion_ids"].size(1)
                )
            self._old_head = head_snapshot(self.model)
        return output

    def _old_topk(self, output) -> tuple[torch.Tensor, torch.Tensor]:
        """pi_old's ``dppo_topk`` most likely tokens other than the sampled one at each completion position, and their
        log-probs (``atr_theory.topk_other_tokens``): (B, T, K) each, from the generating policy's log-softmax, one
        ``per_device_train_batch_size`` of rows at a time (memory K x T per completion, not V x T)."""
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        T, rows = output["completion_ids"].size(1), self.args.per_device_train_batch_size
        picked = []
        with torch.no_grad():
            for start in range(0, ids.size(0), rows):
                part = slice(start, start + rows)
                lsm = completion_log_softmax(self.model, ids[part], mask[part], T, self.temperature)
                picked.append(at.topk_other_tokens(lsm, output["completion_ids"][part], self.args.dppo_topk))
        return torch.cat([p[0] for p in picked]), torch.cat([p[1] for p in picked])

    # ---- the loss -------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        """TRL's loss hook, in four steps: the policy's log-probs of the completions (``_loss_inputs``), the rule
        (``_policy_loss``: ``atr_theory.policy_loss`` and TRL's reference-model KL), TRL's normalisation and the
        entropy bonus / router loss (``_trl_normalised``), and the step's metrics (``_log_loss_metrics``)."""
        batch = self._loss_inputs(model, inputs)
        out, loss, per_token_kl = self._policy_loss(inputs, batch)
        loss = self._trl_normalised(loss, inputs, batch, out)
        self._log_loss_metrics(model, inputs, batch, out, per_token_kl)
        return loss

    def _loss_inputs(self, model, inputs) -> dict:
        """The completion's mask, the policy's per-token log-probs and entropies (from hidden states, chunked, for a
        rule that needs the full distributions), the old log-probs (this forward's, detached, when TRL kept none:
        then kept for the batch's later iterations where ``old_logps_from_first_use`` allows), vLLM's importance
        weights and a Mixture-of-Experts model's router loss."""
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        aux_wanted = bool(getattr(self, "aux_loss_enabled", False))

        full_kw, aux_loss = {}, None
        if self.method_spec.needs_full_distributions:
            hidden = self._completion_hidden(model, input_ids, attention_mask, logits_to_keep)
            old_hidden = inputs.get("old_hidden_states")
            old_head = self._old_head if old_hidden is not None else {}
            head = output_head(model)
            scores = at.head_kl_chunked(
                hidden,
                hidden.detach() if old_hidden is None else old_hidden,
                head.weight,
                completion_ids,
                bias=getattr(head, "bias", None),
                old_weight=old_head.get("weight"),
                old_bias=old_head.get("bias"),
                temperature=self.temperature,
                chunk_size=self.args.kl_chunk_size,
            )
            per_token_logps, entropies = scores.logp, scores.entropy
            full_kw = dict(position_kl=scores.kl)
        elif self.method_spec.needs_topk:  # one (B, T, V) log-softmax: the sampled tokens' and the old top-K's
            aux_losses = [] if aux_wanted else None
            lsm = completion_log_softmax(
                model, input_ids, attention_mask, logits_to_keep, self.temperature, aux_losses=aux_losses
            )
            per_token_logps = lsm.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
            with torch.no_grad():
                entropies = at.entropy_from_log_probs(lsm)
                topk_logp = lsm.gather(-1, inputs["old_topk_ids"])
            full_kw = dict(old_topk_logp=inputs["old_topk_logp"], topk_logp=topk_logp)
            aux_loss = torch.stack(aux_losses).mean() if aux_wanted else None
        else:
            res = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, compute_entropy=True, compute_aux_loss=aux_wanted
            )
            per_token_logps, entropies = res[0], res[1]  # TRL returns 2 or 3 values depending on its version
            aux_loss = res[2] if len(res) > 2 else None
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()
            if getattr(self, "_old_logps_at_first_use", False):  # kept for the batch's later iterations
                inputs["old_per_token_logps"] = old_per_token_logps

        token_weights = None
        if self.use_vllm and self.vllm_importance_sampling_correction:
            token_weights = inputs["importance_sampling_ratio"].expand_as(per_token_logps)
        return dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            mask=mask,
            logp=per_token_logps,
            old_logp=old_per_token_logps,
            entropies=entropies,
            aux_loss=aux_loss,
            full_kw=full_kw,
            token_weights=token_weights,
        )

    def _policy_loss(self, inputs, batch: dict):
        """``atr_theory.policy_loss`` with the rule resolved when the config was built, TRL's loss type's aggregation
        and TRL's loss options as layers; plus the penalty towards the reference model (``beta``; the config's
        ``kl_estimator``, TRL's k3 by default: ``atr_theory.reference_kl``), aggregated the same way. Returns the
        ``LossOutput``, the loss and the per-token KL (None without ``beta``)."""
        args, mask = self.args, batch["mask"]
        per_token_logps, old_per_token_logps = batch["logp"], batch["old_logp"]
        aggregation = trl_loss_types()[self.loss_type].aggregation
        max_length = self.max_completion_length if aggregation == "dr_grpo" else None  # only dr_grpo uses it
        layers = trl_option_layers(args)
        if "sequence_mask" in layers:  # OPSM reads the sampling policy's log-probs where vLLM gave them (as TRL)
            behaviour = inputs.get("sampling_per_token_logps", old_per_token_logps)
            # vLLM gives NaN for a token it could not score, which TRL counts as no evidence (its KL term 0,
            # GRPOTrainer.get_off_policy_mask); the loss refuses NaN, so the token's log-ratio is made 0 here
            layers["behaviour_logp"] = torch.where(torch.isnan(behaviour), per_token_logps.detach(), behaviour)
        if args.top_entropy_quantile < 1.0:
            layers.update(entropies=batch["entropies"], top_entropy_quantile=args.top_entropy_quantile)
        out = at.policy_loss(
            per_token_logps,
            old_per_token_logps,
            inputs["advantages"],
            mask.bool(),
            method=self.atr_method,  # resolved once, when the config was built
            aggregation=aggregation,
            max_length=max_length,
            generator=at.rule_generator(self.atr_method, self._method_generator),
            token_weights=batch["token_weights"],
            **layers,
            **batch["full_kw"],
        )
        loss = out.loss
        per_token_kl = None
        if self.beta != 0.0:  # the penalty towards the reference model (kl_estimator), aggregated the same way
            ref = inputs["ref_per_token_logps"]
            per_token_kl = at.reference_kl(per_token_logps, ref, getattr(args, "kl_estimator", "trl_k3"))
            if getattr(args, "use_bias_correction_kl", False):  # TRL >= 1.16: weighted by the loss's ratio pi / pi_old
                log_ratio = (per_token_logps - old_per_token_logps) * mask
                if args.importance_sampling_level == "sequence":
                    log_ratio = at.layers.sequence_log_ratio(log_ratio, mask)
                per_token_kl = per_token_kl * torch.exp(log_ratio)
            loss = loss + self.beta * at.aggregate(per_token_kl, mask.bool(), aggregation, max_length)
        return out, loss, per_token_kl

    def _trl_normalised(self, loss, inputs, batch: dict, out):
        """The loss as TRL's GRPOTrainer scales it: by the generation batch's token count for the loss types that
        divide by it, else by the accumulation steps; then TRL's entropy bonus and a router loss."""
        args, mask = self.args, batch["mask"]
        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if trl_loss_types()[self.loss_type].by_generation_tokens:  # TRL: token sum over the generation batch's count
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                normalizer = normalizer * self.current_gradient_accumulation_steps / args.steps_per_generation
            loss = loss * mask.sum().clamp(min=1.0) / normalizer
            policy_loss = loss.detach()
        else:
            policy_loss = loss.detach()
            loss = loss / accumulation
        metrics = self._metrics[mode]
        if self._entropy_bonus is not None:
            effective = mask.bool() if "entropy_mask" not in out.dropped else mask.bool() & ~out.dropped["entropy_mask"]
            metrics["policy_loss"].append(self.accelerator.gather(policy_loss).nanmean().item())
            loss = loss - self._entropy_bonus.term(batch["entropies"], effective, accumulation, self.accelerator, mode)
            if mode == "train" and self.accelerator.sync_gradients:
                metrics["entropy_coef"].append(self._entropy_bonus.coef)
        aux_loss = batch["aux_loss"]
        if aux_loss is not None:  # a Mixture-of-Experts model's router loss, as TRL adds it
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            metrics["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss.detach()).mean().item())
        return loss

    def _log_loss_metrics(self, model, inputs, batch: dict, out, per_token_kl) -> None:
        """The step's entropy, reference KL, the rule's ``clip/*`` metrics, TRL's loss metrics under TRL's names and
        (``measure_true_kl``) the true KL, each averaged over processes."""
        args, mask, entropies = self.args, batch["mask"], batch["entropies"]
        per_token_logps, old_per_token_logps = batch["logp"], batch["old_logp"]
        metrics = self._metrics["train" if self.model.training else "eval"]
        n_tok = mask.sum().clamp(min=1.0)
        metrics["entropy"].append(self.accelerator.gather((entropies * mask).sum() / n_tok).nanmean().item())
        if per_token_kl is not None:
            metrics["kl"].append(self.accelerator.gather((per_token_kl * mask).sum() / n_tok).nanmean().item())
        local_metrics = {f"clip/{k}": v for k, v in out.metrics.items() if k != "n_tokens"}
        local_metrics.update(trl_metrics(out, inputs["advantages"], per_token_logps - old_per_token_logps, args))
        if args.measure_true_kl and inputs.get("true_kl_old_hidden") is not None:
            local_metrics.update(
                self._true_kl_metrics(
                    model,
                    inputs,
                    batch["input_ids"],
                    batch["attention_mask"],
                    out,
                    per_token_logps,
                    old_per_token_logps,
                )
            )
        sampling_logps = inputs.get("sampling_per_token_logps")
        if sampling_logps is not None:  # another engine generated (vLLM): how far its policy is from pi_old
            mismatch = rollout_mismatch_metrics(old_per_token_logps, sampling_logps, mask)
            local_metrics.update({MISMATCH_PREFIX + k: v for k, v in mismatch.items()})
        keys = list(local_metrics)
        local = torch.tensor([local_metrics[k] for k in keys], dtype=torch.float32, device=self.accelerator.device)
        local = torch.where(torch.isfinite(local), local, torch.full_like(local, math.nan))
        gathered = self.accelerator.gather(local.unsqueeze(0))
        across = gathered.nanmean(0)  # the mean over processes; a largest / smallest value over processes
        largest, smallest = gathered.nan_to_num(-math.inf).amax(0), gathered.nan_to_num(math.inf).amin(0)
        for i, (key, value) in enumerate(zip(keys, across.tolist())):
            if key.startswith(MISMATCH_PREFIX) and key.endswith("_max"):
                value = float(largest[i])
            elif key.startswith(MISMATCH_PREFIX) and key.endswith("_min"):
                value = float(smallest[i])
            if math.isfinite(value):
                metrics[key].append(value)

    def _true_kl_metrics(self, model, inputs, input_ids, attention_mask, out, logp, old_logp) -> dict[str, float]:
        """``atr_llm.true_kl.true_kl_summary`` of this loss call: the current policy's hidden states (one no-grad
        forward, ``_measurement_hidden``) against the generating policy's, over the whole vocabulary."""
        old_hidden = inputs["true_kl_old_hidden"]
        hidden = self._measurement_hidden(model, input_ids, attention_mask, old_hidden.size(1))
        head = output_head(model)
        old_head = getattr(self, "_true_kl_old_head", {})
        kl, reverse = at.head_kl_both_ways(
            hidden,
            old_hidden,
            head.weight.detach(),
            bias=None if getattr(head, "bias", None) is None else head.bias.detach(),
            old_weight=old_head.get("weight"),
            old_bias=old_head.get("bias"),
            temperature=self.temperature,
            chunk_size=self.args.kl_chunk_size,
        )
        against = None if out.outside is None else out.outside[0]
        return true_kl_summary(
            kl, reverse, logp - old_logp, out.result.kept, out.mask, self.args.true_kl_delta, against=against
        )

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        for func in getattr(self, "reward_funcs", []):
            if hasattr(func, "pop_stats"):
                logs.update(func.pop_stats())
        super().log(logs, *args, **kwargs)


def default_output_dir(model) -> str:
    """TRL's default output folder for a trainer built without ``args``: ``"<model name>-GRPO"``."""
    name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "")
    return f"{name.split('/')[-1]}-GRPO"


def old_logps_from_first_use(args, *, beta: float, use_vllm: bool, needs_full_distributions: bool) -> bool:
    """Whether pi_old's log-probs can be taken from each generated batch's first loss forward instead of TRL's extra
    no-grad forward at generation time: every chunk of a generation batch is first used before the optimizer steps
    (``steps_per_generation == gradient_accumulation_steps``, so the policy is still the one that generated it), no
    reference model or adapter-disabled forward shares that call (``beta == 0``), no vLLM importance sampling (which
    needs them at generation) and no full-distribution method (which keys its snapshot of pi_old on them)."""
    return (
        beta == 0.0
        and not use_vllm
        and not needs_full_distributions
        and args.steps_per_generation == args.gradient_accumulation_steps
    )


class ATRGRPOTrainer(ExactResumeMixin, ATRLossMixin, GRPOTrainer):
    """GRPOTrainer whose loss is ``atr_theory.policy_loss(method=args.method, ...)``.

    **The seam with TRL and transformers: every hook this class changes, and why.** Everything else is TRL's own.

    - The loss (``ATRLossMixin``, also put on Unsloth's patched trainer by ``atr_llm.unsloth_backend``):
      ``__init__`` (the resolved rule, its generator, the entropy controller, refusals that need the model);
      ``_compute_loss`` (``atr_theory.policy_loss`` in TRL's normalisation, with TRL's metric names);
      ``_generate_and_score_completions`` (what a rule keeps of pi_old beyond its log-probs: hidden states and the
      head for the full-distribution rules, the top-K for ``dppo_topk_*``, hidden states for ``measure_true_kl``);
      ``_get_per_token_logps_and_entropies`` (TRL's fused kernel where its tile fits the vocabulary, else a plain
      forward: TRL's needs Triton; while generating, pi_old's no-grad forward skipped where this class allows, below);
      ``log`` (the reward functions' own statistics);
      ``entropy_coef`` / ``_last_world_entropy`` (TRL's entropy-controller attributes, kept in one object).
    - Exact resume (``ExactResumeMixin``): ``_save_checkpoint`` (the generation cycle and the rule's record beside
      each checkpoint), ``_load_optimizer_and_scheduler`` (the cycle restored), ``train`` (``latest`` and the
      resume-compatibility check), ``_get_train_sampler`` (the permutations of the epochs already trained), and the
      ``LogAtEveryCheckpoint`` callback (a log at each checkpoint, so a resumed run logs what the uninterrupted one
      logs).
    - Generation (this class): ``__init__`` (``fast_generation``, and ``_old_logps_at_first_use``: whether pi_old's
      log-probs come from the first loss forward, which the mixin's two hooks read; Unsloth's trainer, which has its
      own generation and takes the mixin alone, never sets it) and ``_generate_single_turn`` (the ``fast_generation``
      context). Each hook is overridden once.

    Where ``old_logps_from_first_use`` allows, TRL's no-grad forward for the old log-probs at generation time
    is skipped and each batch's first loss forward supplies them (detached, kept in the batch for its later
    iterations): the policy has not changed in between, so they are the same numbers (on this CPU bit for bit:
    the same weights after training, test), one forward pass per generation fewer (~9% of a cpu-table step).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fast_generation_mode = resolve_mode(
            getattr(self.args, "fast_generation", "off"),
            model=self.model,
            use_vllm=self.use_vllm,
            device=self.args.device,
        )
        logging.getLogger(__name__).info("fast_generation: %s", self.fast_generation_mode)
        if self.fast_generation_mode == "compiled":
            self.generation_config = compiled_generation_config(
                self.generation_config,
                device=self.args.device,
                prompt_allowance=getattr(self.args, "fast_generation_prompt_tokens", PROMPT_ALLOWANCE),
            )
        self.fast_generation_attention = getattr(self.args, "fast_generation_attention", "sdpa")
        if self.fast_generation_attention == "packed_gqa":
            check_packed_gqa_model(self.model)
        self._old_logps_at_first_use = old_logps_from_first_use(
            self.args,
            beta=self.beta,
            use_vllm=self.use_vllm,
            needs_full_distributions=self.method_spec.needs_full_distributions,
        )

    def _generate_single_turn(self, *args, **kwargs):
        """TRL's generation in the ``fast_generation`` context: the LoRA merged into the base weights in
        ``merged_lora`` and ``compiled`` modes (restored after), the decode step's attention as configured. With
        TRL's continuous batching, which casts the policy to bf16 / fp16 for it and leaves it so, every parameter,
        gradient and buffer is afterwards the tensor it was before (``fast_generation.tensors_kept``): training
        goes on in the dtypes it was configured with."""
        cb = getattr(self, "use_transformers_continuous_batching", False)  # set by TRL 1.15 and 1.16
        kept = tensors_kept(self.model) if cb else contextlib.nullcontext()
        with generation_context(self.fast_generation_mode, self.model, self.fast_generation_attention), kept:
            return super()._generate_single_turn(*args, **kwargs)

