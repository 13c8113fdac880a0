"""Held-out Mean@8 / Pass@8 of issue 15's pilot models on the step-by-step task (``arithmetic-3step-steps``, test
split, the 200 problems of ``atr_llm.cpu_table``'s seed), 8 samples at T = 0.3 (the paper's evaluation sampling) and
at T = 1 (the training temperature), top-p 0.95, 32 new tokens.

    python benchmarks/grpo_pilot_eval.py NAME=MODEL_DIR ... --tokenizer SFT_DIR [--out figures/grpo_pilot_eval.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TASK = "arithmetic-3step-steps"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="NAME=MODEL_DIR")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--problems", type=int, default=200)
    ap.add_argument("--out", default="figures/grpo_pilot_eval.json")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atr_llm.data import OFFLINE_TASKS, arithmetic_dataset
    from atr_llm.evaluate import HFGenerator, evaluate_benchmarks, summarise_samples

    test = arithmetic_dataset(args.problems, seed=12345, **{**OFFLINE_TASKS[TASK], "split": "test"})
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    result = {}
    for item in args.models:
        name, model_dir = item.split("=", 1)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        for temperature in (0.3, 1.0):
            gen = HFGenerator(model, tok, max_tokens=32, batch_size=512, seed=0, temperature=temperature, top_p=0.95)
            rows = evaluate_benchmarks(
                gen, {TASK: test}, Path("runs/grpo_pilot_eval") / f"{name}-T{temperature}", n=8,
                chunk_problems=args.problems, workers=1,
            )  # fmt: skip
            result[f"{name} T={temperature}"] = summarise_samples(rows, [1, 8])[TASK]
            print(name, temperature, result[f"{name} T={temperature}"], flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
