"""Peak memory of one training step at Qwen3's real vocabulary (151,936 rows): ATRGRPOTrainer against
stock ``trl.GRPOTrainer``, same model and batch, each case in a fresh process.

The model is a small Qwen3-architecture model (hidden 64, 2 layers) with Qwen3's tokenizer and
embedding (``atr_llm.tiny.build_tokenizer_and_model("qwen3")``), so the vocabulary part dominates, as
it does for the 1.7B model at long completions. One step = ``_compute_loss`` + backward + AdamW step
on a fixed batch (B sequences, P prompt + T completion tokens, old log-probs != new ones). Reported:
the growth of the process's resident high-water mark during the step (reset just before it), and the size of one float32 (B, P + T, V)
logits tensor for scale.

    python -m benchmarks.real_vocab_step [--quick] [--out figures/bench/cpu/real_vocab_step.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from benchmarks._memory import MMAP_ENV, reset_rss_peak_mib, rss_mib

V = 151_936


def one_case(kind: str, B: int, P: int, T: int) -> dict:
    """Run in a fresh process: build, warm up on a tiny batch, then measure the peak growth of one step."""
    import torch
    import trl

    from atr_llm import data, rewards, tiny
    from atr_llm.trainer import ATRGRPOConfig, ATRGRPOTrainer

    torch.manual_seed(0)
    tok, model = tiny.build_tokenizer_and_model("qwen3")
    common = dict(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=B,
        num_generations=B,
        max_completion_length=T,
        use_cpu=True,
        report_to="none",
        loss_type="dr_grpo",
        beta=0.0,
        num_iterations=2,
        save_strategy="no",
    )
    ds = data.to_grpo_dataset(data.arithmetic_dataset(8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "stock":
            cfg = trl.GRPOConfig(**common)
            trainer = trl.GRPOTrainer(
                model=model,
                reward_funcs=[rewards.CorrectnessReward()],
                args=cfg,
                train_dataset=ds,
                processing_class=tok,
            )
        else:
            cfg = ATRGRPOConfig(method=kind, **common)
            trainer = ATRGRPOTrainer(
                model=model,
                reward_funcs=[rewards.CorrectnessReward()],
                args=cfg,
                train_dataset=ds,
                processing_class=tok,
            )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1

    def batch(b, p, t):
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, len(tok), (b, p + t), generator=g)
        with torch.no_grad():
            lp = trainer._get_per_token_logps_and_entropies(model, ids, torch.ones_like(ids), t)[0]
        extra = {}
        if kind in ("tr_ppo", "truly_ppo"):  # pi_old as the trainer keeps it: hidden states of a moved policy
            with torch.no_grad():
                h = trainer._completion_hidden(model, ids, torch.ones_like(ids), t)
            extra["old_hidden_states"] = h + 0.05 * torch.randn(h.shape, generator=g)
        return {
            **extra,
            "prompt_ids": ids[:, :p],
            "prompt_mask": torch.ones(b, p, dtype=torch.long),
            "completion_ids": ids[:, p:],
            "completion_mask": torch.ones(b, t, dtype=torch.long),
            "advantages": torch.randn(b, generator=g),
            "old_per_token_logps": lp + 0.3 * torch.randn(lp.shape, generator=g),
            "num_items_in_batch": torch.tensor(float(b * t)),
        }

    def step(inputs):
        opt.zero_grad()
        trainer._compute_loss(model, inputs).backward()
        opt.step()

    step(batch(1, 4, 4))  # allocates AdamW's state and warms up
    inputs = batch(B, P, T)
    before = reset_rss_peak_mib()
    step(inputs)
    peak = rss_mib("VmHWM")
    return {
        "kind": kind,
        "B": B,
        "P": P,
        "T": T,
        "peak_growth_MiB": peak - before,
        "logits_fp32_MiB": B * (P + T) * V * 4 / 2**20,
        "trl": trl.__version__,
    }


def main(argv=None) -> dict:
    import atr_theory as at
    from atr_llm.cli_types import CommaList, Text, WriteFile
    from atr_llm.command_line import Parser
    from atr_llm.huge_pages import enable_huge_pages_for_large_cpu_tensors

    enable_huge_pages_for_large_cpu_tensors()  # as the trainer's entry points allocate
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=WriteFile(), default="figures/bench/cpu/real_vocab_step.json")
    ap.add_argument(
        "--kinds",
        type=CommaList(choices=("stock", *at.METHODS)),
        default="stock,atr,clip,tr_ppo,truly_ppo",
        help="comma-separated; rows of other kinds in --out are kept",
    )
    ap.add_argument("--case", type=Text(), help=argparse.SUPPRESS)  # internal: kind,B,P,T in this process
    args = ap.parse_args(argv)
    if args.case:
        kind, B, P, T = args.case.split(",")
        print(json.dumps(one_case(kind, int(B), int(P), int(T))))
        return {}
    shapes = [(4, 32, 32)] if args.quick else [(4, 64, 64), (8, 64, 256), (16, 64, 256)]
    kinds = list(args.kinds)
    env = {**os.environ, **MMAP_ENV}  # the cases' high-water marks are of live memory (benchmarks/_memory.py)
    out = Path(args.out)
    old = json.loads(out.read_text())["rows"] if out.exists() and not args.quick else []
    rows = [r for r in old if r["kind"] not in kinds]
    for B, P, T in shapes:
        for kind in kinds:
            res = subprocess.run(
                [sys.executable, "-m", "benchmarks.real_vocab_step", "--case", f"{kind},{B},{P},{T}"],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            row = json.loads(res.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(
                f"{kind:6s} B={B:3d} P+T={P + T:4d}: peak +{row['peak_growth_MiB']:8.1f} MiB (one fp32 logits tensor {row['logits_fp32_MiB']:.0f} MiB)"
            )
    result = {"vocab_rows": V, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
