"""What TRL's continuous-batching generation does to the policy's dtype, and to the updates a LoRA receives.

TRL 1.16 (and 1.15) generates with transformers' continuous batching (``use_transformers_continuous_batching``)
after casting the whole policy in place to bf16 when ``bf16`` is on (TRL's default), and does not cast it back: the
LoRA weights and the optimizer's updates go on in bf16. This trains a tiny Qwen3 with a LoRA (r 4; q, v and up
projections) for a few GRPO steps at the paper's learning rate (5e-6), with and without continuous batching, with
stock ``trl.GRPOTrainer`` and with ``ATRGRPOTrainer`` (which gives every tensor back after the generation:
``atr_llm.fast_generation.tensors_kept``), and records the parameters' dtypes afterwards and the share of LoRA A
entries that moved by more than the bf16 rounding of their starting values.

    python -m experiments.investigations.continuous_batching_dtype [--steps 4] [--out figures/experiments/investigations/continuous_batching_dtype.json]

Stock TRL 1.15's chunked log-prob head needs its Triton kernel, which a CPU lacks: run it with TRL 1.16.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

DEFAULT_OUT = Path("figures/experiments/investigations/continuous_batching_dtype.json")


def lora_a_moved(start: dict[str, torch.Tensor], model) -> float:
    """The share of LoRA A entries of ``model`` that differ from ``start`` (float32 values) by more than the bf16
    rounding of those values: 0 when every update was rounded away."""
    moved = total = 0
    for name, p in model.named_parameters():
        if "lora_A" in name:
            first, now = start[name], p.detach().float()
            moved += ((now != first) & (now != first.bfloat16().float())).sum().item()
            total += now.numel()
    return moved / total


def train_case(trainer: str, continuous_batching: bool, steps: int, out_dir: Path, seed: int = 0) -> dict:
    """``steps`` GRPO steps of a tiny LoRA policy (float32, ``bf16=True`` as TRL defaults, lr 5e-6) with ``trainer``
    ("trl": stock ``trl.GRPOTrainer``; "atr": ``ATRGRPOTrainer``, method atr); the dtypes and the LoRA A share moved."""
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from atr_llm import data, tiny
    from atr_llm.trainer import ATRGRPOConfig, ATRGRPOTrainer

    def length_reward(completions, **kw):
        return [float(len(str(c)) % 3) for c in completions]

    config_cls, trainer_cls, extra = (
        (GRPOConfig, GRPOTrainer, {}) if trainer == "trl" else (ATRGRPOConfig, ATRGRPOTrainer, {"method": "atr"})
    )
    config = config_cls(
        output_dir=str(out_dir / f"{trainer}-{continuous_batching}"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        use_cpu=True,
        report_to="none",
        max_steps=steps,
        save_strategy="no",
        learning_rate=5e-6,
        bf16=True,
        seed=seed,
        use_transformers_continuous_batching=continuous_batching,
        **extra,
    )
    tok = tiny.build_tiny_tokenizer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = trainer_cls(
            model=tiny.build_tiny_model(tok, seed=seed),
            reward_funcs=[length_reward],
            args=config,
            train_dataset=data.to_grpo_dataset(data.arithmetic_dataset(32)),
            processing_class=tok,
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]),
        )
        start = {n: p.detach().float().clone() for n, p in run.model.named_parameters() if "lora_A" in n}
        run.train()
    return {
        "trainer": trainer,
        "continuous_batching": continuous_batching,
        "steps": steps,
        "dtypes_after": sorted({str(p.dtype).removeprefix("torch.") for p in run.model.parameters()}),
        "lora_a_share_moved_beyond_bf16_rounding": lora_a_moved(start, run.model),
    }


def main(argv: list[str] | None = None) -> dict:
    import tempfile

    import trl

    from atr_llm.cli_types import Integer, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=Integer(1), default=4)
    ap.add_argument("--out", type=WriteFile(as_path=True), default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    out = args.out
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for trainer in ("trl", "atr"):
            for cb in (False, True):
                rows.append(train_case(trainer, cb, args.steps, Path(tmp)))
                print(json.dumps(rows[-1]), flush=True)
    import transformers

    result = {
        "command": " ".join(
            [
                "python -m experiments.investigations.continuous_batching_dtype",
                *(sys.argv[1:] if argv is None else argv),
            ]
        ),
        "environment": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
