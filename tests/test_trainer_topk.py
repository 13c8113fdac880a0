"""The trainer with a rule that reads the top-K (dppo_topk_tv / dppo_topk_kl): what it keeps at generation (the
generating policy's K most likely other tokens, as atr_theory.topk_other_tokens picks them from the model's own
log-softmax), its loss and gradient against policy_loss on the model's (B, T, V) logits by hand, a short training
run, and the refusals of ``dppo_topk``."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import atr_theory as at
from atr_llm import data, rewards, tiny
from atr_llm.config import ATRGRPOConfig
from atr_llm.config.fields import ConfigError
from atr_llm.trainer import ATRGRPOTrainer
from atr_theory.methods.vocab_topk_masks import topk_kl, topk_tv
from tests.grpo_helpers import grpo_config_kwargs, loss_and_grads, policy_loss_on_logits, random_batch, tiny_trainer


def _ids_and_mask(inputs):
    return (
        torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
        torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
    )


def _log_softmax(model, inputs):
    ids, mask = _ids_and_mask(inputs)
    T = inputs["completion_ids"].size(1)
    # in float32, as the trainer computes it (atr_llm.trainer.completion_log_softmax)
    return torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, -T - 1 : -1].float(), -1)


@pytest.mark.parametrize("method", ["dppo_topk_tv", "dppo_topk_kl"])
def test_the_trainers_loss_is_policy_loss_on_the_models_own_top_k(tmp_path, tok, method):
    """The generation step keeps the generating model's top-K (``_old_topk``) as topk_other_tokens picks it from the
    model's log-softmax; the loss gathers the current model's log-probs there: loss and every gradient equal
    ``policy_loss`` on the full (B, T, V) log-softmaxes of a perturbed "generation-time" model and the current one."""
    K = 5
    model = tiny.build_tiny_model(tok).double()
    old_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in old_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype))
    inputs = random_batch(tok)
    # the bound halfway between the two middle divergences: about half the tokens past it, none on its edge
    with torch.no_grad():
        old_full, new_full = _log_softmax(old_model, inputs), _log_softmax(model, inputs)
    tokens = inputs["completion_ids"][..., None]
    old_k, new_k = at.topk_logps(old_full, new_full, inputs["completion_ids"], K)
    divergence = (topk_kl if method == "dppo_topk_kl" else topk_tv)(
        new_full.gather(-1, tokens)[..., 0], old_full.gather(-1, tokens)[..., 0], new_k, old_k
    )[inputs["completion_mask"].bool()].sort().values
    delta = float(divergence[len(divergence) // 2 - 1 : len(divergence) // 2 + 1].mean())
    cfg = ATRGRPOConfig(
        method=method, dppo_topk=K, delta_low=delta, delta_high=delta, **grpo_config_kwargs(tmp_path, loss_type="dr_grpo")
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = ATRGRPOTrainer(
            model=old_model,
            reward_funcs=[rewards.CorrectnessReward()],
            args=cfg,
            train_dataset=data.to_grpo_dataset(data.arithmetic_dataset(16)),
            processing_class=tok,
        )
    with torch.no_grad():
        old_full = _log_softmax(old_model, inputs)
        kept_ids, kept_logp = trainer._old_topk(inputs)  # what generation keeps, from the generating model
    want_ids, want_logp = at.topk_other_tokens(old_full, inputs["completion_ids"], K)
    assert kept_ids.shape == (*inputs["completion_ids"].shape, K)
    assert torch.equal(kept_ids, want_ids)
    torch.testing.assert_close(kept_logp, want_logp)

    inputs.update(
        old_per_token_logps=old_full.gather(-1, inputs["completion_ids"][..., None])[..., 0],
        old_topk_ids=kept_ids,
        old_topk_logp=kept_logp,
    )
    loss, grads = loss_and_grads(trainer, model, inputs)
    params = [p for p in model.parameters() if p.requires_grad]

    full = _log_softmax(model, inputs)
    ref = policy_loss_on_logits(
        full, inputs, method, delta_low=delta, delta_high=delta, old_topk_logp=want_logp, topk_logp=full.gather(-1, want_ids)
    )
    ref_grads = torch.autograd.grad(ref.loss, params, allow_unused=True)
    assert loss.item() == pytest.approx(ref.loss.item(), rel=1e-6, abs=1e-12)
    for g, r in zip(grads, ref_grads):
        if r is not None:
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-9)
    assert 0 < ref.metrics["frac_masked"] < 1, "the bounds keep or drop everything: a weak comparison"


def test_a_short_run_trains_and_logs(tmp_path, tok):
    cfg = ATRGRPOConfig(method="dppo_topk_kl", dppo_topk=7, **grpo_config_kwargs(tmp_path, loss_type="dr_grpo"))
    trainer = tiny_trainer(tok, cfg)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in logs] == [1, 2]
    assert all(0.0 <= h["clip/frac_kept"] <= 1.0 for h in logs)


def test_dppo_topk_is_refused_for_a_rule_that_reads_no_top_k(tmp_path):
    with pytest.raises(ConfigError, match=r"dppo_topk.*rule 'dppo_kl' reads no top-K.*dppo_topk_kl, dppo_topk_tv"):
        ATRGRPOConfig(method="dppo_kl", dppo_topk=5, **grpo_config_kwargs(tmp_path))


@pytest.mark.parametrize("value", [-1, 2.5, True])
def test_dppo_topk_outside_its_domain_is_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="dppo_topk"):
        ATRGRPOConfig(method="dppo_topk_tv", dppo_topk=value, **grpo_config_kwargs(tmp_path))


def test_dppo_topk_beyond_the_vocabulary_is_refused_before_training(tmp_path, tok):
    rows = tiny.build_tiny_model(tok).get_output_embeddings().weight.shape[0]
    cfg = ATRGRPOConfig(method="dppo_topk_tv", dppo_topk=rows, **grpo_config_kwargs(tmp_path))
    with pytest.raises(ValueError, match=rf"dppo_topk={rows}: expected at most the vocabulary size - 1 = {rows - 1}"):
        tiny_trainer(tok, cfg)
