"""The formatting SFT stage the paper runs before RL (on OpenMathReasoning; offline: on the arithmetic
task), with TRL's SFTTrainer on conversational ``messages`` (loss on the assistant turn only)."""

from __future__ import annotations

from pathlib import Path


def run_sft(
    model,
    tokenizer,
    dataset,
    output_dir: str | Path,
    *,
    max_steps: int = 200,
    learning_rate: float = 3e-3,
    batch_size: int = 32,
    seed: int = 0,
    peft_config=None,
    report_to: str = "none",
    logging_steps: int = 20,
    implementation: str = "trl",
):
    """Supervised fine-tuning on ``dataset`` (columns problem, answer[, solution]); returns the trained model.

    The model is saved to ``output_dir`` (so a later run can start RL from it). ``implementation``: ``"trl"``
    (TRL's SFTTrainer; falls back to ``plain_sft`` where SFTTrainer cannot run) or ``"plain"``
    (``plain_sft``, no PEFT).
    """
    from trl import SFTConfig, SFTTrainer

    from .data import to_sft_dataset
    from .trainer import trl_logps_kernel_available

    check_sft_implementation(implementation, use_peft=peft_config is not None)
    if implementation == "plain" or (not trl_logps_kernel_available() and peft_config is None):
        model = plain_sft(
            model,
            tokenizer,
            dataset,
            max_steps=max_steps,
            learning_rate=learning_rate,
            batch_size=batch_size,
            seed=seed,
        )
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(output_dir))
        tokenizer.save_pretrained(str(output_dir))
        return model

    args = SFTConfig(
        output_dir=str(output_dir),
        max_steps=max_steps,
        learning_rate=learning_rate,
        per_device_train_batch_size=batch_size,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, max_steps // 20),
        logging_steps=logging_steps,
        save_strategy="no",
        report_to=report_to,
        seed=seed,
        max_length=256,
        use_cpu=not _cuda(),
        bf16=False,
        dataloader_num_workers=0,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=to_sft_dataset(dataset),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train()
    trainer.save_model(str(output_dir))
    tokenizer.save_pretrained(str(output_dir))
    return trainer.model


def check_sft_implementation(implementation: str, use_peft: bool) -> None:
    """``implementation`` is ``"trl"`` or ``"plain"``, and ``"plain"`` (which trains every weight) is not combined
    with PEFT; else ValueError naming the option. Checked before any model loads (``atr_llm.train``) and here."""
    if implementation not in ("trl", "plain"):
        raise ValueError(f"sft_implementation must be 'trl' or 'plain', got {implementation!r}")
    if implementation == "plain" and use_peft:
        raise ValueError("sft_implementation 'plain' trains every weight and cannot use --use_peft: use 'trl'")


def plain_sft(model, tokenizer, dataset, *, max_steps: int, learning_rate: float, batch_size: int, seed: int = 0):
    """The same completion-only SFT as a plain torch loop (AdamW, warm-up + cosine).

    Used where TRL's SFTTrainer cannot run (TRL <= 1.15 needs Triton for it on a CPU-only install) and with
    ``--sft_implementation plain``: batches are left-padded and the model scores only the last
    ``max completion + 1`` positions (``completion_only_loss``), which at Qwen3's 151,936-row vocabulary
    is several times cheaper than the full-sequence logits SFTTrainer computes."""
    import math
    import random

    import torch
    from tqdm.auto import tqdm

    rng = random.Random(seed)
    examples = [sft_example(tokenizer, r) for r in dataset]
    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    warm = max(1, max_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, max_steps - warm))),
    )
    model.train()
    bar = tqdm(range(max_steps), desc="SFT")
    for _ in bar:
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        loss = completion_only_loss(model, batch, tokenizer.pad_token_id)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return model


def sft_example(tokenizer, row: dict) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of one row: the chat-formatted prompt with the generation prompt, and the
    formatted answer followed by the eos token (what SFTTrainer's completion-only loss trains on)."""
    from .data import format_completion, format_prompt

    prompt = tokenizer.apply_chat_template(format_prompt(row["problem"]), tokenize=False, add_generation_prompt=True)
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    c_ids = tokenizer(
        format_completion(row["answer"], row.get("solution")) + tokenizer.eos_token, add_special_tokens=False
    )["input_ids"]
    return p_ids, c_ids


def completion_only_loss(model, batch: list[tuple[list[int], list[int]]], pad_token_id: int):
    """Mean next-token cross-entropy over the completion tokens of ``batch`` ((prompt ids, completion ids) pairs).

    Sequences are left-padded, so every completion ends at the last position and only the last
    ``max_i |completion_i| + 1`` positions need logits (``logits_to_keep``); position ids restart at 0 at each
    sequence's first real token (a rotary model such as Qwen3 is blind to a constant shift anyway; a model with
    absolute positions is not), so the value equals the model's own ``labels=`` loss on the right-padded batch
    with the prompt masked (test)."""
    import torch

    seqs = [p + c for p, c in batch]
    L = max(len(s) for s in seqs)
    keep = max(len(c) for _, c in batch) + 1
    ids = torch.tensor([[pad_token_id] * (L - len(s)) + s for s in seqs])
    att = torch.tensor([[0] * (L - len(s)) + [1] * len(s) for s in seqs])
    pos = (att.cumsum(-1) - 1).clamp_min(0)
    labels = torch.tensor([[-100] * (L - len(c)) + c for _, c in batch])[:, L - keep + 1 :]
    logits = model(input_ids=ids, attention_mask=att, position_ids=pos, logits_to_keep=keep).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
