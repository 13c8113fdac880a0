"""The Unsloth backend's scorer against a plain float32 forward, with unsloth_zoo's real functions.

unsloth_zoo imports on CPU with ``UNSLOTH_ZOO_DISABLE_GPU_INIT=1``; ``make test-pins`` installs it (the version
unsloth 2026.10.9 pins). The model here is a plain transformers Qwen3 with a PEFT LoRA; on a GPU the hidden states
come from Unsloth's patched forward instead (``benchmarks/gpu_step.py --backends trl,unsloth`` compares the two).
"""

import os
import sys

import pytest
import torch

os.environ.setdefault("UNSLOTH_ZOO_DISABLE_GPU_INIT", "1")
pytest.importorskip("transformers")
pytest.importorskip("trl")

from atr_llm import tiny, train  # noqa: E402
from atr_llm import unsloth_backend as ub  # noqa: E402
from atr_llm.trainer import ATRGRPOConfig, plain_logps_and_entropies  # noqa: E402


def _left_padded_batch(tok, seed=0, T=7):
    """Prompts of different lengths, left-padded as TRL pads them; completions right-padded after eos."""
    g = torch.Generator().manual_seed(seed)
    prompts = ["What is 1 + 2?", "Hi", "Compute 12 * 7 and then add 3, please.", "9 - 4?"]
    enc = tok(prompts, padding=True, padding_side="left", return_tensors="pt")
    B = len(prompts)
    completion = torch.randint(5, len(tok), (B, T), generator=g)
    lengths = torch.tensor([T, 3, 5, 1])
    cmask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    completion = torch.where(cmask.bool(), completion, torch.full_like(completion, tok.pad_token_id))
    ids = torch.cat([enc["input_ids"], completion], 1)
    mask = torch.cat([enc["attention_mask"], cmask], 1)
    assert (enc["attention_mask"] == 0).any(), "the batch must have left padding"
    return ids, mask, cmask, T


@pytest.fixture(scope="module")
def lora_model():
    from peft import LoraConfig, get_peft_model

    tok = tiny.build_tiny_tokenizer()
    model = tiny.build_tiny_model(tok, seed=1)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    with torch.no_grad():  # a non-zero adapter so that its gradients see the whole path
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
    return tok, model


def test_left_pack_matches_unsloth_zoos_own_left_pack_padding(lora_model):
    zoo = pytest.importorskip("unsloth_zoo.rl_replacements")
    tok, _ = lora_model
    ids, mask, _, _ = _left_padded_batch(tok)
    prompt_len = ids.size(1) - 7
    packed, packed_mask, pad = ub.left_pack(ids, mask)
    theirs = zoo.left_pack_padding(ids[:, :prompt_len], tok.pad_token_id)
    ours_prompt = torch.cat([packed[i, : prompt_len - int(pad[i])] for i in range(ids.size(0))])
    theirs_prompt = torch.cat([theirs[i, : prompt_len - int(pad[i])] for i in range(ids.size(0))])
    assert torch.equal(ours_prompt, theirs_prompt)
    assert torch.equal(pad, zoo.calculate_pad_tokens_in_prompt(ids, 7, tok.pad_token_id))
    assert torch.equal(packed_mask.sum(1), mask.sum(1)) and (packed_mask[:, 0] == 1).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_scorer_equals_a_plain_float32_forward_in_trls_layout_with_gradients(lora_model, temperature):
    pytest.importorskip("unsloth_zoo.rl_replacements")
    tok, model = lora_model
    ids, mask, cmask, T = _left_padded_batch(tok)
    weights = torch.randn(cmask.shape, generator=torch.Generator().manual_seed(3)) * cmask

    def grads_of(fn):
        model.zero_grad()
        lp, ent = fn()
        (lp * weights).sum().backward()
        return lp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ours = grads_of(lambda: ub.unsloth_logps_and_entropies(model, ids, mask, T, temperature, compute_entropy=True))
    plain = grads_of(lambda: plain_logps_and_entropies(model, ids, mask, T, temperature, compute_entropy=True))
    m = cmask.bool()
    assert ours[0].shape == (ids.size(0), T)
    assert torch.allclose(ours[0][m], plain[0][m], atol=2e-5, rtol=0)
    assert torch.allclose(ours[1][m], plain[1][m], atol=2e-5, rtol=0)
    assert set(ours[2]) == set(plain[2]) and any("lora_A" in n for n in ours[2])
    for n in plain[2]:
        rel = (ours[2][n] - plain[2][n]).norm() / plain[2][n].norm().clamp_min(1e-12)
        assert rel < 1e-4, (n, float(rel))


def test_scorer_is_right_when_the_forward_ignores_the_attention_mask_as_unsloths_does(lora_model):
    """Unsloth's training forward drops the 2-D mask; left-packing keeps the pads where causal attention never
    looks. Simulated here by a hook that drops the mask of the decoder body."""
    pytest.importorskip("unsloth_zoo.rl_replacements")
    tok, model = lora_model
    ids, mask, cmask, T = _left_padded_batch(tok, seed=2)
    with torch.no_grad():
        plain, _ = plain_logps_and_entropies(model, ids, mask, T)
        body = model.get_base_model().model
        hook = body.register_forward_pre_hook(lambda mod, a, kw: (a, {**kw, "attention_mask": None}), with_kwargs=True)
        try:
            ours, _ = ub.unsloth_logps_and_entropies(model, ids, mask, T)
            unpacked = model.get_base_model()(input_ids=ids, attention_mask=mask).logits  # pads now attended
        finally:
            hook.remove()
    m = cmask.bool()
    assert torch.allclose(ours[m], plain[m], atol=2e-5, rtol=0)
    wrong = torch.log_softmax(unpacked[:, -T - 1 : -1].float(), -1).gather(-1, ids[:, -T:, None])[..., 0]
    assert (wrong[m] - plain[m]).abs().max() > 1e-3  # the hook really removes the mask


def test_old_and_current_log_probs_come_from_one_scorer_so_the_ratio_starts_at_exactly_one(lora_model):
    pytest.importorskip("unsloth_zoo.rl_replacements")
    tok, model = lora_model
    ids, mask, cmask, T = _left_padded_batch(tok, seed=5)
    with torch.no_grad():
        old, _ = ub.unsloth_logps_and_entropies(model, ids, mask, T)
    new, _ = ub.unsloth_logps_and_entropies(model, ids, mask, T)
    assert new.requires_grad and torch.equal(new.detach(), old)


def test_unsloth_backend_refuses_what_it_cannot_honour(tmp_path):
    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    cfg = ATRGRPOConfig(method="atr", **common)
    if "unsloth_grpo_mini_batch" not in ATRGRPOConfig.__dataclass_fields__:  # unsloth was not imported first
        with pytest.raises(RuntimeError, match="import unsloth before atr_llm.trainer"):
            ub.check_unsloth_config(cfg)
    cls = type("WithUnslothFields", (), {"__dataclass_fields__": {"unsloth_grpo_mini_batch": None}})
    fake = cls()
    fake.method, fake.use_vllm, fake.vllm_importance_sampling_correction = "tr_ppo", False, False
    fake.resolved_method = ATRGRPOConfig(method="tr_ppo", **common).resolved_method
    with pytest.raises(ValueError, match="full"):
        ub.check_unsloth_config(fake)
    fake.method, fake.resolved_method = "atr", cfg.resolved_method
    fake.use_vllm = fake.vllm_importance_sampling_correction = True
    with pytest.raises(ValueError, match="vllm_importance_sampling_correction"):
        ub.check_unsloth_config(fake)
    fake.vllm_importance_sampling_correction = False
    ub.check_unsloth_config(fake)


def test_the_backend_is_read_before_trl_is_imported(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("backend: unsloth\nmethod: atr\n")
    assert train.requested_backend(["--config", str(cfg)]) == "unsloth"
    assert train.requested_backend(["--config", str(cfg), "--backend", "trl"]) == "trl"
    assert train.requested_backend(["--backend=unsloth"]) == "unsloth"
    assert train.requested_backend([]) == "trl"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            train.main(["--config", str(cfg), "--output_dir", str(tmp_path / "o")])
    assert "unsloth" not in sys.modules or torch.cuda.is_available()
