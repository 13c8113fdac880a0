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


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
