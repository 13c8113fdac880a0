"""Time per optimizer step: ATRGRPOTrainer (atr, clip) against stock trl.GRPOTrainer (dr_grpo), same tiny
model, same batch, measured side by side (interleaved, median of repeats).

Two measurements: (1) the loss step alone -- ``_compute_loss`` + backward + AdamW step on one fixed
batch with old log-probs != new ones; (2) end to end -- ``trainer.train()`` for a few steps,
generation included (identical work on both sides, so this ratio is the one a user sees).

Our trainer narrows TRL's log-prob tile to the vocabulary (``logprob_tile_fitted_to_vocabulary``), which stock TRL
does not: ``stock`` is TRL as shipped (the ratio a user switching sees), ``stock_fitted`` is TRL with the same tile
(so ``*_vs_stock_fitted`` is the cost of our loss alone, the same log-prob work on both sides).

    python -m benchmarks.trainer_step [--quick] [--out figures/bench/cpu/trainer_step.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import trl

from atr_llm import data, rewards, tiny
from atr_llm.trainer import ATRGRPOConfig, ATRGRPOTrainer, logprob_tile_fitted_to_vocabulary
from atr_llm.unsloth_backend import output_head


class StockWithFittedTile(trl.GRPOTrainer):
    """Stock TRL, its log-prob tile narrowed to the vocabulary as ours is (nothing else changed)."""

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        with logprob_tile_fitted_to_vocabulary(output_head(model).weight.shape[0]):
            return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)


def make(kind, tok, tmp, method="atr", max_steps=4):
    model = tiny.build_tiny_model(tok, hidden_size=128, layers=4)
    common = dict(
        output_dir=tmp,
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=16,
        use_cpu=True,
        report_to="none",
        loss_type="dr_grpo",
        beta=0.0,
        num_iterations=2,
        max_steps=max_steps,
        logging_steps=1000,
        save_strategy="no",
        learning_rate=1e-4,
        seed=0,
    )
    ds = data.to_grpo_dataset(data.arithmetic_dataset(256))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind in ("stock", "stock_fitted"):
            return (trl.GRPOTrainer if kind == "stock" else StockWithFittedTile)(
                model=model,
                reward_funcs=[rewards.CorrectnessReward()],
                args=trl.GRPOConfig(**common),
                train_dataset=ds,
                processing_class=tok,
            )
        return ATRGRPOTrainer(
            model=model,
            reward_funcs=[rewards.CorrectnessReward()],
            args=ATRGRPOConfig(method=method, **common),
            train_dataset=ds,
            processing_class=tok,
        )


def loss_step_time(trainer, inputs, opt):
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    t0 = time.perf_counter()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None):
    from atr_llm.cli_types import WriteFile
    from atr_llm.command_line import Parser
    from atr_llm.huge_pages import enable_huge_pages_for_large_cpu_tensors

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=WriteFile(), default="figures/bench/cpu/trainer_step.json")
    args = ap.parse_args(argv)
    enable_huge_pages_for_large_cpu_tensors()  # as the trainer's entry points allocate
    reps = 5 if args.quick else 30
    tok = tiny.build_tiny_tokenizer()
    tmp = tempfile.mkdtemp()
    trainers = {
        "stock": make("stock", tok, tmp),
        "stock_fitted": make("stock_fitted", tok, tmp),
        "atr": make("ours", tok, tmp, "atr"),
        "clip": make("ours", tok, tmp, "clip"),
    }
    g = torch.Generator().manual_seed(0)
    B, P, T = 32, 24, 16
    inputs = {
        "prompt_ids": torch.randint(5, len(tok), (B, P), generator=g),
        "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": torch.randint(5, len(tok), (B, T), generator=g),
        "completion_mask": (torch.rand(B, T, generator=g) > 0.1).long(),
        "advantages": torch.randn(B, generator=g),
        "num_items_in_batch": torch.tensor(float(B * T)),
    }
    with torch.no_grad():
        t = trainers["atr"]
        lp = t._get_per_token_logps_and_entropies(
            t.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            T,
        )[0]
    inputs["old_per_token_logps"] = lp + 0.3 * torch.randn(lp.shape, generator=g)
    opts = {k: torch.optim.AdamW(t.model.parameters(), lr=1e-6) for k, t in trainers.items()}
    times = {k: [] for k in trainers}
    for _ in range(3):
        for k, t in trainers.items():
            loss_step_time(t, inputs, opts[k])
    for _ in range(reps):
        for k, t in trainers.items():
            times[k].append(loss_step_time(t, inputs, opts[k]))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "loss_step_ms": {k: 1e3 * v for k, v in med.items()},
        "loss_step_ratio_vs_stock": {k: med[k] / med["stock"] for k in ("atr", "clip")},
        "loss_step_ratio_vs_stock_fitted": {k: med[k] / med["stock_fitted"] for k in ("atr", "clip")},
    }
    # end to end, generation included
    e2e = {k: [] for k in trainers}
    for _ in range(2 if args.quick else 3):
        for k in trainers:
            tr = make(
                k if k.startswith("stock") else "ours",
                tok,
                tempfile.mkdtemp(),
                "atr" if k.startswith("stock") else k,
                max_steps=4 if args.quick else 10,
            )
            t0 = time.perf_counter()
            tr.train()
            e2e[k].append((time.perf_counter() - t0) / tr.state.global_step)
    med2 = {k: statistics.median(v) for k, v in e2e.items()}
    result["end_to_end_s_per_step"] = med2
    result["end_to_end_ratio_vs_stock"] = {k: med2[k] / med2["stock"] for k in ("atr", "clip")}
    result["end_to_end_ratio_vs_stock_fitted"] = {k: med2[k] / med2["stock_fitted"] for k in ("atr", "clip")}
    print(json.dumps(result, indent=1))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
