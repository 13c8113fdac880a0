"""The verl CPU harness's (``tests/verl_support/verl_cpu.py``) pieces that run without verl, and the verl plugin's parameter sources.

The rollout's log-probabilities are checked against an independent forward pass of the whole sampled sequence
(the quantity verl's actor recomputes as ``old_log_prob``): log softmax(z / T) for vLLM's ``processed_logprobs``,
log softmax(z) for ``raw_logprobs``. verl itself (Ray, its trainers) runs in ``tests/test_verl_e2e.py``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from atr_llm.verl import plugin as verl_plugin
from tests.verl_support import verl_cpu


@pytest.fixture(scope="module")
def tiny_model():
    from atr_llm import tiny

    torch.manual_seed(0)
    tokenizer, model = tiny.build_tokenizer_and_model(seed=0)
    model.eval()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return model, ids, [tokenizer.eos_token_id]


def _forward_logps(model, prompt_ids, tokens, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + tokens])).logits[0].double()
    rows = logits[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(tokens)] / temperature
    return torch.log_softmax(rows, -1)[torch.arange(len(tokens)), torch.tensor(tokens)]


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
def test_rollout_logprobs_are_the_temperature_scaled_logprobs_of_a_forward_pass(tiny_model, temperature):
    model, prompt, eos = tiny_model
    torch.manual_seed(1)
    tokens, logps, reason = verl_cpu.sample_completion(model, prompt, 12, temperature, 1.0, -1, eos)
    assert 1 <= len(tokens) <= 12 and reason in ("stop", "length")
    want = _forward_logps(model, prompt, tokens, temperature)
    assert torch.allclose(torch.tensor(logps, dtype=torch.float64), want, atol=2e-5), (logps, want.tolist())
    # raw_logprobs: the model's own distribution, no temperature
    torch.manual_seed(1)
    tokens_raw, logps_raw, _ = verl_cpu.sample_completion(
        model, prompt, 12, temperature, 1.0, -1, eos, logprobs_mode="raw_logprobs"
    )
    assert tokens_raw == tokens  # same seed, same sampling
    want_raw = _forward_logps(model, prompt, tokens, 1.0)
    assert torch.allclose(torch.tensor(logps_raw, dtype=torch.float64), want_raw, atol=2e-5)
    if temperature != 1.0:
        assert not torch.allclose(want, want_raw, atol=1e-3)  # the two modes are told apart


def test_rollout_samples_the_whole_vocabulary_unless_top_k_is_set(tiny_model):
    """transformers' generate defaults to top-k 50; verl's rollout (vLLM) samples the whole vocabulary."""
    model, prompt, eos = tiny_model
    seen = set()
    for seed in range(40):
        torch.manual_seed(seed)
        tokens, _, _ = verl_cpu.sample_completion(model, prompt, 1, 3.0, 1.0, -1, eos)
        seen.add(tokens[0])
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    top50 = set(torch.topk(logits, 50).indices.tolist())
    assert seen - top50, "40 draws at T = 3 never left the top 50 tokens: a top-k of 50 is on"
    # top_k = 1 is greedy; greedy (T = 0) log-probabilities are the raw ones
    torch.manual_seed(0)
    top1, _, _ = verl_cpu.sample_completion(model, prompt, 6, 1.0, 1.0, 1, eos)
    greedy, logps, _ = verl_cpu.sample_completion(model, prompt, 6, 0.0, 1.0, -1, eos)
    assert top1 == greedy
    assert torch.allclose(
        torch.tensor(logps, dtype=torch.float64), _forward_logps(model, prompt, greedy, 1.0), atol=2e-5
    )


def test_rollout_refuses_an_unknown_logprobs_mode(tiny_model):
    model, prompt, eos = tiny_model
    with pytest.raises(ValueError, match="logprobs_mode must be 'processed_logprobs' or 'raw_logprobs', got 'logits'"):
        verl_cpu.sample_completion(model, prompt, 2, 1.0, 1.0, -1, eos, logprobs_mode="logits")


@pytest.mark.parametrize(
    "backend, expected",
    [
        ("cpu:gloo,cpu:gloo", "cpu:gloo"),  # verl's f"cpu:gloo,{device}:gloo" on a CPU
        ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"),  # a GPU run is left alone
        ("gloo", "gloo"),
        (None, None),
    ],
)
def test_backend_string_keeps_one_entry_per_device(backend, expected):
    assert verl_cpu._dedupe_backend(backend) == expected


def test_cpu_environment_loads_the_hook_module_in_every_verl_process():
    env = verl_cpu.environment("atr_grpo_verl_cpu_hook")
    assert env == {"VERL_USE_EXTERNAL_MODULES": "atr_grpo_verl_cpu_hook", "VERL_PLATFORM": "cpu"}
    hook = Path(__file__).with_name("verl_support") / "atr_grpo_verl_cpu_hook.py"
    assert "cpu.register()" in hook.read_text()  # the test's hook registers; importing verl_cpu does not
    assert f"actor_rollout_ref.rollout.name={verl_cpu.ROLLOUT_NAME}" in verl_cpu.CPU_OVERRIDES


# ---------------------------------------------------------------------------------------------------------------
# the plugin's parameter sources: verl's config first, $ATR_GRPO_PARAMS as the fallback
# ---------------------------------------------------------------------------------------------------------------
def _actor(atr_params=None):
    return SimpleNamespace(
        clip_ratio_low=None, clip_ratio_high=None, policy_loss=SimpleNamespace(atr_params=atr_params)
    )


def test_parameters_come_from_verls_config_else_from_the_environment(monkeypatch):
    monkeypatch.delenv(verl_plugin.PARAMS_ENV, raising=False)
    assert verl_plugin.method_params("atr", _actor({"delta": 0.05})).params == {"delta": 0.05}
    assert verl_plugin.method_params("atr", _actor()).params == {"delta": 0.07}  # the paper's default
    monkeypatch.setenv(verl_plugin.PARAMS_ENV, '{"delta": 0.04}')
    assert verl_plugin.method_params("atr", _actor()).params == {"delta": 0.04}
    assert verl_plugin.method_params("atr", _actor({"delta": 0.04})).params == {"delta": 0.04}  # both, equal


def test_parameters_set_in_both_places_differently_are_refused(monkeypatch):
    monkeypatch.setenv(verl_plugin.PARAMS_ENV, '{"delta": 0.04}')
    with pytest.raises(
        ValueError, match=r"atr_params=\{'delta': 0.05\} and ATR_GRPO_PARAMS=\{'delta': 0.04\} disagree"
    ):
        verl_plugin.method_params("atr", _actor({"delta": 0.05}))


def test_config_parameters_must_be_a_mapping_and_name_the_methods_parameters(monkeypatch):
    monkeypatch.delenv(verl_plugin.PARAMS_ENV, raising=False)
    with pytest.raises(ValueError, match=r"atr_params must be a mapping such as \{delta: 0.05\}, got 0.05"):
        verl_plugin.config_params(_actor(0.05))
    with pytest.raises(ValueError, match=r"sets \['epsilon'\], which method 'atr' does not take"):
        verl_plugin.method_params("atr", _actor({"epsilon": 0.2}))


def test_config_layers_are_read_like_the_environments(monkeypatch):
    monkeypatch.delenv(verl_plugin.PARAMS_ENV, raising=False)
    verl_plugin._CHOICES.clear()
    layers = verl_plugin.choice_for("atr", _actor({"sequence_mask": {"estimator": "k3", "threshold": 0.07}}))[1]
    assert set(layers) == {"sequence_mask"} and layers["sequence_mask"].threshold == 0.07
    assert verl_plugin.choice_for("atr", _actor())[1] == {}
