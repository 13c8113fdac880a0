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
):
    """Supervised fine-tuning on ``dataset`` (columns problem, answer[, solution]); returns the trained model.

    The model is saved to ``output_dir`` (so a later run can start RL from it).
    """
    from trl import SFTConfig, SFTTrainer

    from .data import to_sft_dataset
    from .trainer import trl_logps_kernel_available

    if not trl_logps_kernel_available() and peft_config is None:
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


def plain_sft(model, tokenizer, dataset, *, max_steps: int, learning_rate: float, batch_size: int, seed: int = 0):
    """The same completion-only SFT as a plain torch loop (AdamW, warm-up + cosine), for TRL releases whose
    SFTTrainer needs Triton and cannot run on a CPU-only install (TRL <= 1.15)."""
    import math
    import random

    import torch

    from .data import format_completion, format_prompt

    rng = random.Random(seed)
    rows = list(dataset)
    examples = []
    for r in rows:
        prompt = tokenizer.apply_chat_template(format_prompt(r["problem"]), tokenize=False, add_generation_prompt=True)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c_ids = tokenizer(
            format_completion(r["answer"], r.get("solution")) + tokenizer.eos_token, add_special_tokens=False
        )["input_ids"]
        examples.append((p_ids + c_ids, [-100] * len(p_ids) + c_ids))
    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    warm = max(1, max_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, max_steps - warm))),
    )
    model.train()
    pad = tokenizer.pad_token_id
    for _ in range(max_steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        L = max(len(x) for x, _ in batch)
        ids = torch.tensor([x + [pad] * (L - len(x)) for x, _ in batch])
        labels = torch.tensor([y + [-100] * (L - len(y)) for _, y in batch])
        att = (torch.arange(L)[None, :] < torch.tensor([len(x) for x, _ in batch])[:, None]).long()
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return model


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
