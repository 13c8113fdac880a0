"""What the trainer tests share: a small GRPO config on the CPU, a random batch in TRL's format, and one loss call
with its gradient (tests/test_llm.py, tests/test_trl_options.py)."""

import torch


def grpo_config_kwargs(tmp_path, **kw) -> dict:
    """Keyword arguments of a tiny CPU GRPO run (8 completions per step, 4 per prompt, 8 tokens, two iterations per
    generated batch so the ratios move); ``kw`` overrides or adds."""
    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        use_cpu=True,
        report_to="none",
        beta=0.0,
        num_iterations=2,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-3,
    )
    base.update(kw)
    return base


def random_batch(tok, B=8, P=6, T=8, seed=0, *, zero_advantage=False, tool_mask=False) -> dict:
    """A generated batch as TRL's ``_compute_loss`` receives it: random prompt / completion ids, ~20% padding,
    advantages; ``zero_advantage``: the last sequence's advantage is 0 (a group whose rewards were all equal);
    ``tool_mask``: ~25% of the completion are tool outputs (not trained on)."""
    g = torch.Generator().manual_seed(seed)
    batch = {
        "prompt_ids": torch.randint(5, len(tok), (B, P), generator=g),
        "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": torch.randint(5, len(tok), (B, T), generator=g),
        "completion_mask": (torch.rand(B, T, generator=g) > 0.2).long(),
        "advantages": torch.randn(B, generator=g),
        "num_items_in_batch": torch.tensor(40.0),
    }
    if zero_advantage:
        batch["advantages"][B - 1] = 0.0
    if tool_mask:
        batch["tool_mask"] = (torch.rand(B, T, generator=g) > 0.25).long()
    return batch


def length_reward(completions, **kwargs):
    """A reward that varies within a group without any grading: the completion's length mod 3."""
    return [float(len(str(c)) % 3) for c in completions]


def tiny_trainer(tok, cfg, trainer_cls=None, rows=32, model=None):
    """A trainer (default ``ATRGRPOTrainer``; TRL's own ``GRPOTrainer`` for a peer) of ``model`` (default a fresh tiny
    model) with ``cfg`` on ``rows`` arithmetic prompts and ``length_reward``, built with warnings silenced; not yet
    trained."""
    import warnings

    from atr_llm import data, tiny

    if trainer_cls is None:
        from atr_llm.trainer import ATRGRPOTrainer as trainer_cls
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trainer_cls(
            model=tiny.build_tiny_model(tok) if model is None else model,
            reward_funcs=[length_reward],
            args=cfg,
            train_dataset=data.to_grpo_dataset(data.arithmetic_dataset(rows)),
            processing_class=tok,
        )



def tiny_moe(tok):
    """A tiny Qwen3-MoE (4 experts, 2 per token) with the tokenizer's vocabulary: TRL adds its router loss."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3MoeConfig

    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # grouped experts: no float64 kernel
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return model


def loss_and_grads(trainer, model, inputs):
    """The trainer's loss on ``inputs`` in training mode (one accumulation step) and its gradients w.r.t. every
    trainable parameter of ``model``."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(model, inputs)
    params = [p for p in model.parameters() if p.requires_grad]
    return loss, torch.autograd.grad(loss, params, allow_unused=True)


def policy_loss_on_logits(log_softmax, inputs, method, **kw):
    """``atr_theory.policy_loss`` of a random batch (``random_batch``) computed by hand from the model's own (B, T, V)
    log-softmax ``log_softmax``: the sampled tokens' log-probs, the batch's old log-probs, advantages and mask, dr_grpo
    over its 8 positions; ``kw``: the rule's parameters and extra inputs."""
    import atr_theory as at

    return at.policy_loss(
        log_softmax.gather(-1, inputs["completion_ids"][..., None])[..., 0],
        inputs["old_per_token_logps"],
        inputs["advantages"],
        inputs["completion_mask"].bool(),
        method=method,
        max_length=8,
        **kw,
    )


_CHECKPOINT_FILES: dict[str, bytes] = {}


def write_checkpoint_files(folder) -> None:
    """The files a resumable checkpoint holds besides its state and method record, each small but real, as
    transformers writes them: the tiny model of ``atr_llm/configs/cpu-tiny.yaml`` (``config.json``,
    ``model.safetensors``), ``optimizer.pt`` (AdamW after one step over the two groups transformers' Trainer makes),
    ``scheduler.pt`` (a ``LambdaLR``) and ``rng_state.pth`` (``Trainer._save_rng_state``'s entries). Built once per
    test process (tests/test_config.py, tests/test_checkpoints.py)."""
    import pathlib
    import random
    import tempfile

    import numpy as np

    if not _CHECKPOINT_FILES:
        from atr_llm.tiny import build_tokenizer_and_model

        _, model = build_tokenizer_and_model("toy")
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            decay = [p for n, p in model.named_parameters() if "norm" not in n]
            rest = [p for n, p in model.named_parameters() if "norm" in n]
            groups = [{"params": decay, "weight_decay": 0.001}, {"params": rest, "weight_decay": 0.0}]
            optimizer = torch.optim.AdamW(groups, lr=1e-4)  # cpu-tiny.yaml's learning rate and weight decay
            model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
            optimizer.step()
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
            torch.save(optimizer.state_dict(), f"{tmp}/optimizer.pt")
            torch.save(scheduler.state_dict(), f"{tmp}/scheduler.pt")
            rng = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
            torch.save(rng, f"{tmp}/rng_state.pth")
            for name in ("config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
                _CHECKPOINT_FILES[name] = (pathlib.Path(tmp) / name).read_bytes()
    for name, data in _CHECKPOINT_FILES.items():
        (pathlib.Path(folder) / name).write_bytes(data)
