"""The trainer with a rule that needs the full distributions (tr_ppo, truly_ppo): it keeps pi_old as hidden states and
a head snapshot, and its chunked KL gives the loss and gradients of policy_loss on the model's own (B, T, V) logits."""

import copy
import warnings

import pytest
import torch
from grpo_helpers import grpo_config_kwargs, loss_and_grads, policy_loss_on_logits, random_batch

import atr_theory as at
from atr_llm import data, rewards, tiny
from atr_llm.trainer import ATRGRPOConfig, ATRGRPOTrainer


@pytest.mark.parametrize("method", ["tr_ppo", "truly_ppo"])
def test_full_distribution_methods_score_from_hidden_states_as_the_full_logits_would(tmp_path, tok, method):
    """The trainer's chunked path (old hidden states + head snapshot -> head_kl_chunked) against policy_loss on
    the model's own (B, T, V) logits of the current and of a perturbed "generation-time" model, by hand."""

    model = tiny.build_tiny_model(tok).double()
    old_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in old_model.parameters():
            p.add_(0.03 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype))
    inputs = random_batch(tok)
    T = inputs["completion_ids"].size(1)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    msk = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)

    def full_log_softmax(m):
        return torch.log_softmax(m(input_ids=ids, attention_mask=msk).logits[:, -T - 1 : -1], -1)

    with torch.no_grad():
        old_full = full_log_softmax(old_model)
        kl = at.full_kl(old_full, full_log_softmax(model))[inputs["completion_mask"].bool()]
    # delta halfway between the two middle KLs: half the tokens inside the trust region, half outside, none on its
    # edge (delta = the median, one token's own KL, left that token's side to float rounding: the test was flaky)
    ranked = kl.sort().values
    delta = float(ranked[len(ranked) // 2 - 1 : len(ranked) // 2 + 1].mean())
    ds = data.to_grpo_dataset(data.arithmetic_dataset(16))
    cfg = ATRGRPOConfig(method=method, divergence_delta=delta, kl_chunk_size=5, **grpo_config_kwargs(tmp_path, loss_type="dr_grpo"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = ATRGRPOTrainer(
            model=model, reward_funcs=[rewards.CorrectnessReward()], args=cfg, train_dataset=ds, processing_class=tok
        )
    with torch.no_grad():
        inputs["old_per_token_logps"] = old_full.gather(-1, inputs["completion_ids"][..., None])[..., 0]
        inputs["old_hidden_states"] = trainer._completion_hidden(old_model, ids, msk, T)
    trainer._old_head = {"weight": old_model.get_output_embeddings().weight.detach()}
    loss, grads = loss_and_grads(trainer, model, inputs)

    full = full_log_softmax(model)
    ref = policy_loss_on_logits(full, inputs, method, delta=delta, old_full_logp=old_full, full_logp=full)
    params = [p for p in model.parameters() if p.requires_grad]
    ref_grads = torch.autograd.grad(ref.loss, params, allow_unused=True)
    assert loss.item() == pytest.approx(ref.loss.item(), rel=1e-6, abs=1e-12)
    for g, r in zip(grads, ref_grads):
        if r is not None:
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-9)
    assert 0 < ref.metrics["frac_masked"] < 1 or method == "truly_ppo"
