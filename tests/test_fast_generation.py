"""fast_generation='merged_lora': the same tokens as the plain path, from the *current* LoRA weights, with every base
weight restored bit for bit, and training that ends with the same weights as without it (CPU, float32)."""

import warnings

import pytest
import torch

from atr_llm import data, tiny
from atr_llm.fast_generation import lora_merged_for_generation, resolve_mode
from atr_llm.trainer import ATRGRPOConfig, ATRGRPOTrainer


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tiny_tokenizer()


def _lora_model(tok, seed=0, scale=0.0):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        tiny.build_tiny_model(tok, seed=seed),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]),
    )
    if scale:  # a trained-looking adapter: B != 0, so the LoRA changes what the model says
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(scale * torch.randn(p.shape, generator=g))
    return model


def _greedy(model, tok, prompts=("1 + 2 = ", "7 - 3 = ", "4 + 4 - 1 = ")):
    batch = tok(list(prompts), return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id)
    return out[:, batch["input_ids"].shape[1] :]


def _sampled(model, tok, seed):
    torch.manual_seed(seed)
    batch = tok(["1 + 2 = ", "7 - 3 = "] * 4, return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=10, do_sample=True, temperature=1.0, pad_token_id=tok.pad_token_id)
    return out[:, batch["input_ids"].shape[1] :]


def _base_state(model):
    return {n: (p.detach().clone(), p.requires_grad, p.dtype) for n, p in model.named_parameters()}


def test_merged_generation_gives_the_plain_tokens_and_restores_every_weight_bit_for_bit(tok):
    model = _lora_model(tok, scale=0.5)
    before = _base_state(model)
    plain_greedy, plain_sampled = _greedy(model, tok), _sampled(model, tok, 3)
    with lora_merged_for_generation(model) as merged:
        assert merged == 2 * 6  # two layers x six target modules
        assert all(layer.merged for layer in model.modules() if hasattr(layer, "merged"))
        fast_greedy, fast_sampled = _greedy(model, tok), _sampled(model, tok, 3)
    assert torch.equal(fast_greedy, plain_greedy) and torch.equal(fast_sampled, plain_sampled)
    after = _base_state(model)
    for name, (value, grad, dtype) in before.items():
        assert torch.equal(after[name][0], value), name  # bit for bit: PEFT's unmerge alone would round
        assert after[name][1:] == (grad, dtype), name
    assert not any(getattr(layer, "merged", False) for layer in model.modules())
    assert all(p.grad is None for p in model.parameters())


def test_merged_generation_reads_the_adapter_as_it_is_now(tok):
    """After an optimizer step the merged path samples from the updated LoRA: a path that merged once and kept the
    merged weights (stale) gives the old tokens and fails."""
    model = _lora_model(tok, scale=0.5)
    with lora_merged_for_generation(model):
        first = _greedy(model, tok)
    with torch.no_grad():  # an "optimizer step" on the adapter only
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(-3.0)
    plain = _greedy(model, tok)
    with lora_merged_for_generation(model):
        second = _greedy(model, tok)
    assert torch.equal(second, plain) and not torch.equal(second, first)


def test_the_base_weights_come_back_even_when_generation_fails(tok):
    model = _lora_model(tok, scale=0.5)
    before = _base_state(model)
    with pytest.raises(RuntimeError, match="boom"), lora_merged_for_generation(model):
        raise RuntimeError("boom")
    assert all(torch.equal(p.detach(), before[n][0]) for n, p in model.named_parameters())


def test_auto_is_merged_lora_only_on_cuda_for_a_lora_model_without_vllm(tok):
    lora, plain = _lora_model(tok), tiny.build_tiny_model(tok)
    assert resolve_mode("auto", model=lora, use_vllm=False, device="cpu") == "off"
    assert resolve_mode("auto", model=lora, use_vllm=False, device="cuda") == "merged_lora"
    assert resolve_mode("auto", model=lora, use_vllm=True, device="cuda") == "off"
    assert resolve_mode("auto", model=plain, use_vllm=False, device="cuda") == "off"
    assert resolve_mode("merged_lora", model=lora, use_vllm=False, device="cpu") == "merged_lora"
    with pytest.raises(ValueError, match="fast_generation must be one of"):
        resolve_mode("fast", model=lora, use_vllm=False, device="cpu")


def test_a_bad_fast_generation_value_is_refused_when_the_config_is_built(tmp_path):
    with pytest.raises(ValueError, match="fast_generation must be one of .* got 'turbo'"):
        ATRGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", fast_generation="turbo")


def _train_lora_grpo(tok, tmp_path, mode: str, *, max_steps: int, callbacks=(), **config) -> ATRGRPOTrainer:
    """A few GRPO steps of a tiny LoRA policy (seed 0, a length reward) with ``fast_generation=mode``; the trainer."""
    from peft import LoraConfig

    def length_reward(completions, **kw):
        return [float(len(str(c)) % 3) for c in completions]

    cfg = ATRGRPOConfig(
        method="atr", fast_generation=mode, output_dir=str(tmp_path / mode), per_device_train_batch_size=8,
        num_generations=4, max_completion_length=8, use_cpu=True, report_to="none", loss_type="dr_grpo",
        beta=0.0, num_iterations=2, max_steps=max_steps, logging_steps=1, save_strategy="no", learning_rate=1e-2,
        seed=0, **config,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = ATRGRPOTrainer(
            model=tiny.build_tiny_model(tok, seed=0),
            reward_funcs=[length_reward],
            args=cfg,
            train_dataset=data.to_grpo_dataset(data.arithmetic_dataset(32)),
            processing_class=tok,
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]),
            callbacks=list(callbacks),
        )
        trainer.train()
    return trainer


@pytest.mark.slow
def test_training_with_merged_generation_ends_with_the_weights_of_plain_generation(tmp_path, tok, monkeypatch):
    """Three GRPO steps with a LoRA policy: the same completions, the same old log-probs and losses, so the same
    adapter and base weights bit for bit, with and without the merged generation."""
    from atr_llm import fast_generation

    merges = []
    real = fast_generation.lora_merged_for_generation
    monkeypatch.setattr(fast_generation, "lora_merged_for_generation", lambda m: merges.append(1) or real(m))
    results = {}
    for mode in ("off", "merged_lora"):
        trainer = _train_lora_grpo(tok, tmp_path, mode, max_steps=3)
        assert trainer.fast_generation_mode == mode
        results[mode] = (
            {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
            [h.get("loss") for h in trainer.state.log_history if "loss" in h],
        )
    assert len(merges) >= 2  # merged_lora generated (at least) twice: steps 1 and 3 (num_iterations 2)
    (w_off, loss_off), (w_fast, loss_fast) = results["off"], results["merged_lora"]
    assert loss_fast == loss_off
    assert w_off.keys() == w_fast.keys() and all(torch.equal(w_off[n], w_fast[n]) for n in w_off)
    assert any("lora_B" in n and w_off[n].abs().sum() > 0 for n in w_off)  # the adapter did train


# --- fast_generation="compiled": static cache + compiled decode step -------------------------------------------


def test_compiled_generation_config_asks_transformers_for_one_static_cache_and_its_compiled_step():
    from transformers import GenerationConfig

    from atr_llm.fast_generation import PROMPT_ALLOWANCE, compiled_generation_config

    trl_config = GenerationConfig(max_new_tokens=1536, do_sample=True, disable_compile=True)
    gpu = compiled_generation_config(trl_config, device="cuda")
    assert (gpu.cache_implementation, gpu.max_cache_len, gpu.disable_compile) == ("static", 1536 + PROMPT_ALLOWANCE, False)
    assert gpu.compile_config.mode == "reduce-overhead" and not gpu.compile_config._compile_all_devices
    cpu = compiled_generation_config(trl_config, device="cpu")
    assert cpu.compile_config.mode == "default" and cpu.compile_config._compile_all_devices
    assert trl_config.disable_compile and trl_config.cache_implementation is None  # TRL's own config is not touched
    with pytest.raises(ValueError, match="needs max_new_tokens"):
        compiled_generation_config(GenerationConfig(), device="cpu")
    with pytest.raises(ValueError, match="cache_implementation='offloaded'"):
        compiled_generation_config(GenerationConfig(max_new_tokens=4, cache_implementation="offloaded"), device="cpu")


def test_the_input_embedding_hooks_are_set_aside_and_come_back_in_order(tok):
    from atr_llm.fast_generation import input_embedding_hooks_set_aside

    model = _lora_model(tok)
    emb = model.get_input_embeddings()
    calls = []
    for i in range(3):
        emb.register_forward_hook(lambda m, a, out, i=i: calls.append(i))
    before = list(emb._forward_hooks.items())
    with input_embedding_hooks_set_aside(model) as n:
        assert n == 3 and len(emb._forward_hooks) == 0
        emb(torch.tensor([[1, 2]]))
    assert calls == [] and list(emb._forward_hooks.items()) == before
    emb(torch.tensor([[1, 2]]))
    assert calls == [0, 1, 2]
    with pytest.raises(RuntimeError, match="boom"), input_embedding_hooks_set_aside(model):
        raise RuntimeError("boom")
    assert list(emb._forward_hooks.items()) == before


@pytest.fixture
def recompiles_fail():
    """A second compile of a function raises (torch's own config patch: pytest >= 9.2's monkeypatch deletes a torch
    config entry on undo, which broke every later test that reads it)."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield
    torch._dynamo.reset()


def test_compiled_generation_gives_the_eager_greedy_tokens_for_any_prompt_length_without_recompiling(
    tok, recompiles_fail
):
    from transformers import GenerationConfig

    from atr_llm.fast_generation import compiled_generation_config, generation_context

    model = _lora_model(tok, scale=0.5)
    eager = GenerationConfig(max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id, disable_compile=True)
    compiled = compiled_generation_config(eager, device="cpu")
    for prompts in (["1 + 2 = ", "7 - 3 = ", "4 + 4 - 1 = "], ["12 + 2 = ", "7 = ", "3 + 3 + 3 + 3 + 3 = "]):
        batch = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
        plain = model.generate(**batch, generation_config=eager)
        with generation_context("compiled", model):
            fast = model.generate(**batch, generation_config=compiled)
        assert torch.equal(fast, plain)
    assert getattr(model.get_base_model(), "_compiled_call", None) is not None  # the compiled step did run


@pytest.mark.parametrize(
    "extra, name",
    [({"use_transformers_continuous_batching": True}, "use_transformers_continuous_batching"),
     ({"cache_implementation": "dynamic"}, "cache_implementation='dynamic'")],
)
def test_compiled_is_refused_with_another_generation_path(tmp_path, extra, name):
    with pytest.raises(ValueError, match=f"fast_generation='compiled'.*{name}"):
        ATRGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", fast_generation="compiled", **extra)


@pytest.mark.slow
def test_training_with_compiled_generation_ends_with_the_weights_of_plain_generation_and_compiles_once(
    tmp_path, tok, recompiles_fail
):
    """Four GRPO steps (two generations) of a LoRA policy with gradient checkpointing: with ``compiled`` the same
    completions, losses and weights bit for bit as with plain generation, and the decode step compiled once. Without
    setting the embedding's hooks aside the second generation compiles again (TRL's checkpointing toggle leaves two
    more hooks per generation: counted here too), which ``error_on_recompile`` turns into a failure."""
    from transformers import TrainerCallback

    hooks = []

    class CountHooks(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            hooks.append(len(model.get_input_embeddings()._forward_hooks))

    results = {}
    for mode in ("off", "compiled"):
        torch._dynamo.reset()  # each mode compiles (or not) from scratch
        hooks.clear()
        trainer = _train_lora_grpo(
            tok, tmp_path, mode, max_steps=4, callbacks=[CountHooks()], gradient_checkpointing=True
        )
        assert trainer.fast_generation_mode == mode
        assert hooks[2] > hooks[0]  # the hooks grow with every generation (steps 1 and 3 generate)
        results[mode] = (
            {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
            [h.get("loss") for h in trainer.state.log_history if "loss" in h],
        )
    assert trainer.generation_config.cache_implementation == "static"
    (w_off, loss_off), (w_fast, loss_fast) = results["off"], results["compiled"]
    assert loss_fast == loss_off
    assert w_off.keys() == w_fast.keys() and all(torch.equal(w_off[n], w_fast[n]) for n in w_off)
    assert any("lora_B" in n and w_off[n].abs().sum() > 0 for n in w_off)
