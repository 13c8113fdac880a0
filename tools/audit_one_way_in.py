"""An audit of the promise "every bad input, whatever way it comes in, is refused before any work, clearly": bad inputs
written as a new user would type them (from README.md, docs/getting-started.md, docs/trainer.md, docs/reliability.md
and each command's ``--help``), through every way in, each run in a fresh process and a fresh temporary folder.

    python -m tools.audit_one_way_in                 # every case; writes figures/tools/cli_audit/one_way_in_audit.json
    python -m tools.audit_one_way_in --only Y0 --out /tmp/some.json     # the cases whose id starts with Y0

The ways in (``CLASSES``): a ``--config`` YAML file, the Python constructors (``ATRGRPOConfig``, ``ScriptArguments``,
``RunConfig``), command-line options (train, evaluate, sims, benchmarks, experiments, tools), ``atr_theory.policy_loss``
and ``atr_theory.resolve``, the environment (``RANK`` ... and the verl plugin's ``ATR_GRPO_PARAMS``), a resume
(``--resume_from_checkpoint``) of a checkpoint that trained something else, and values that used to fail only after
work had started.

The promise, as judged here:

* a command: exit status 2, exactly one line on stderr that starts with ``error: `` and names the argument as the user
  gave it (``--flag``, ``--config FILE: key NAME``, ``$VARIABLE``), no traceback, nothing written (no folder, file or
  lock: the case's temporary folder, the shared fixtures, the checkout's top level and its ``runs/`` are compared
  before and after; a command that starts writing is stopped as soon as it does);
* the Python API: a ValueError or TypeError whose one-line message names the argument, nothing written.

Verdicts: ``clean`` (refused as promised), ``unclear`` (refused before any work, but the message does not name the
argument, is not one line, the exit status is not 2, or the exception is of another type), ``bad`` (accepted, a
traceback, or refused only after work started: something was written).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "figures" / "tools" / "cli_audit" / "one_way_in_audit.json"
PRESET = "atr_llm/configs/cpu-tiny.yaml"
BENCH_FILE = "atr_llm/data/arithmetic_bench.jsonl"

CLASSES = {
    1: "YAML --config file of python -m atr_llm.train",
    2: "Python constructors (ATRGRPOConfig, ScriptArguments, RunConfig)",
    3: "command-line options that contradict, repeat or are ignored",
    4: "atr_theory.policy_loss / atr_theory.resolve",
    5: "environment variables (RANK, LOCAL_RANK, WORLD_SIZE, THP_MEM_ALLOC_ENABLE, ATR_GRPO_PARAMS)",
    6: "resume (--resume_from_checkpoint) of a checkpoint that trained something else",
    7: "values that used to fail only after work started",
}

RUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "THP_MEM_ALLOC_ENABLE", "ATR_GRPO_PARAMS")


@dataclass
class Case:
    """One bad input. ``argv`` (a command, after ``python``) or ``code`` (a Python snippet run with ``python -c``);
    ``{tmp}`` is the case's fresh folder, ``{out}`` a fresh output folder in it (not made), ``{fix}`` the shared
    fixtures, ``{repo}`` this checkout. ``names``: what the refusal must name, each item a text the message must hold
    (``a|b``: either). ``files``: files written into ``{tmp}`` first; ``setup``: a fixture made in ``{out}`` first."""

    id: str
    cls: int
    input: str
    expected: str
    names: tuple[str, ...]
    argv: list[str] | None = None
    code: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    setup: str | None = None
    timeout: float = 150.0

    @property
    def way(self) -> str:
        return "command" if self.argv is not None else "python"


# ---------------------------------------------------------------------------------------------------------------
# how the cases are written
# ---------------------------------------------------------------------------------------------------------------
def train(*extra: str, config: str = PRESET) -> list[str]:
    """``python -m atr_llm.train --config CONFIG --output_dir {out} EXTRA...``."""
    return ["-m", "atr_llm.train", "--config", config, "--output_dir", "{out}", *extra]


def preset_with(replace: dict[str, str | None] | None = None, append: str = "") -> str:
    """cpu-tiny.yaml with the line of each key of ``replace`` replaced by ``key: value`` (None: removed), and
    ``append`` added at the end."""
    replace = dict(replace or {})
    lines = []
    for line in (ROOT / PRESET).read_text().splitlines():
        key = line.split(":", 1)[0]
        if ":" in line and not line.startswith((" ", "#")) and key in replace:
            value = replace.pop(key)
            if value is not None:
                lines.append(f"{key}: {value}")
            continue
        lines.append(line)
    if replace:
        raise ValueError(f"cpu-tiny.yaml has no key {sorted(replace)}")
    return "\n".join(lines) + "\n" + append


def yaml_case(id: str, input: str, names: tuple[str, ...], replace=None, append: str = "", expected: str = "") -> Case:
    return Case(
        id,
        1,
        input,
        expected or "refused before any work, naming --config FILE and the key",
        ("--config", *names),
        argv=train(config="{tmp}/config.yaml"),
        files={"config.yaml": preset_with(replace, append)},
    )


PY_CONFIG = """
import math, os
from atr_llm.config import ATRGRPOConfig, RunConfig, ScriptArguments
from trl import ModelConfig
OUT = os.environ["AUDIT_OUT"]
BASE = dict(output_dir=OUT, use_cpu=True, bf16=False, report_to="none")
"""

PY_LOSS = """
import math, torch
import atr_theory as at
B, T, V = 2, 3, 5
g = torch.Generator().manual_seed(0)
old = -torch.rand(B, T, generator=g) - 0.1
logp = (old + 0.1 * torch.randn(B, T, generator=g)).requires_grad_()
adv = torch.randn(B, generator=g)
mask = torch.ones(B, T, dtype=torch.bool)
full_old = torch.log_softmax(torch.randn(B, T, V, generator=g), -1)
full_new = torch.log_softmax(torch.randn(B, T, V, generator=g), -1)

def put(x, position, value):
    x = x.detach().clone()
    x[position] = value
    return x
"""

PY_VERL = """
import types
from atr_llm.verl.plugin import choice_for
config = types.SimpleNamespace(clip_ratio_low=None, clip_ratio_high=None, policy_loss=types.SimpleNamespace())
"""


def py_case(id: str, cls: int, input: str, names: tuple[str, ...], call: str, prelude: str, env=None) -> Case:
    """A Python snippet: ``call`` is one expression, evaluated after ``prelude``."""
    return Case(
        id,
        cls,
        input,
        "a ValueError or TypeError whose one-line message names " + " and ".join(n.replace("|", " or ") for n in names),
        names,
        code=prelude + f"\nRESULT = lambda: ({call})\n",
        env=dict(env or {}),
    )


def config_case(id, input, names, call):
    return py_case(id, 2, input, names, call, PY_CONFIG)


def loss_case(id, input, names, call):
    return py_case(id, 4, input, names, call, PY_LOSS)


def verl_case(id, value: str, names, call="choice_for('atr', config)", prelude=PY_VERL):
    return py_case(
        id,
        5,
        f"ATR_GRPO_PARAMS={value!r}; {call}",
        ("ATR_GRPO_PARAMS", *names),
        call,
        prelude,
        env={"ATR_GRPO_PARAMS": value},
    )


def command(id, cls, input, names, argv, expected="", **kw) -> Case:
    shown = " ".join(n.replace("|", " or ") for n in names)
    return Case(id, cls, input, expected or f"exit 2, one line naming {shown}, nothing written", names, argv=argv, **kw)


EVAL = ["-m", "atr_llm.evaluate", "--tiny-model", "{fix}/model", "--benchmarks", "arith"]
EVAL_FILE = ["--benchmark_path", f"arith={BENCH_FILE}", "--max_tokens", "4", "--output_dir", "{out}"]


def cases() -> list[Case]:
    """Every case, by class."""
    out: list[Case] = []

    # 1. the --config YAML file (a copy of cpu-tiny.yaml, broken)
    out += [
        yaml_case("Y01", "learning_rate: null", ("learning_rate",), {"learning_rate": "null"}),
        yaml_case(
            "Y02", "num_generations: 8.0 (a float for a count)", ("num_generations",), {"num_generations": "8.0"}
        ),
        yaml_case("Y03", "seed: [0, 1] (a list: two seeds in one run)", ("seed",), {"seed": "[0, 1]"}),
        yaml_case(
            "Y04", "method: {name: atr, delta: 0.07} (a mapping)", ("method",), {"method": "{name: atr, delta: 0.07}"}
        ),
        yaml_case("Y05", "seed: 0 ... seed: 1 (a key written twice)", ("seed",), append="seed: 1\n"),
        yaml_case(
            "Y06",
            "0.07: divergence_delta (key and value swapped: a non-string key)",
            ("0.07",),
            append="0.07: divergence_delta\n",
        ),
        yaml_case(
            "Y07", "lerning_rate: 0.0001 (an unknown key: a typo)", ("lerning_rate",), append="lerning_rate: 0.0001\n"
        ),
        yaml_case("Y08", "env: {RANK: abc} (a bad env: entry)", ("RANK",), append="env:\n  RANK: abc\n"),
        yaml_case("Y09", "env: [RANK=0] (env: as a list)", ("env",), append="env:\n  - RANK=0\n"),
        yaml_case(
            "Y10", "divergence_delta: -0.07 (out of range)", ("divergence_delta",), {"divergence_delta": "-0.07"}
        ),
        yaml_case("Y11", "save_steps: 2.5 (a fraction above 1)", ("save_steps",), {"save_steps": "2.5"}),
        yaml_case(
            "Y12", "temperature: 0 (greedy is not a training temperature)", ("temperature",), {"temperature": "0"}
        ),
        yaml_case(
            "Y13",
            "kl_chunk_size: 32 with method: atr (a field that method never reads)",
            ("kl_chunk_size",),
            append="kl_chunk_size: 32\n",
            expected="refused: kl_chunk_size is read only by tr_ppo / truly_ppo / measure_true_kl (an ignored option)",
        ),
    ]

    # 2. the Python constructors
    out += [
        config_case(
            "P01",
            "ATRGRPOConfig(learning_rate=nan)",
            ("learning_rate",),
            "ATRGRPOConfig(**BASE, learning_rate=float('nan'))",
        ),
        config_case(
            "P02",
            "ATRGRPOConfig(learning_rate=10**400) (a huge integer)",
            ("learning_rate",),
            "ATRGRPOConfig(**BASE, learning_rate=10**400)",
        ),
        config_case(
            "P03",
            "ATRGRPOConfig(num_generations='8') (text for a count)",
            ("num_generations",),
            "ATRGRPOConfig(**BASE, num_generations='8')",
        ),
        config_case(
            "P04",
            "ATRGRPOConfig(divergence_delta=[0.05, 0.07]) (a list)",
            ("divergence_delta",),
            "ATRGRPOConfig(**BASE, divergence_delta=[0.05, 0.07])",
        ),
        config_case("P05", "ATRGRPOConfig(seed=None)", ("seed",), "ATRGRPOConfig(**BASE, seed=None)"),
        config_case(
            "P06",
            "ATRGRPOConfig(gradient_checkpointing='false') (text for a flag)",
            ("gradient_checkpointing",),
            "ATRGRPOConfig(**BASE, gradient_checkpointing='false')",
        ),
        config_case(
            "P07",
            "ATRGRPOConfig(method='atr', kl_chunk_size=16) (read only by full-distribution methods)",
            ("kl_chunk_size",),
            "ATRGRPOConfig(**BASE, method='atr', kl_chunk_size=16)",
        ),
        config_case(
            "P08",
            "ATRGRPOConfig(lr_scheduler_type='cosine_warmup') (not a scheduler)",
            ("lr_scheduler_type",),
            "ATRGRPOConfig(**BASE, lr_scheduler_type='cosine_warmup')",
        ),
        config_case(
            "P09",
            "ATRGRPOConfig(top_entropy_quantile=True) (a bool)",
            ("top_entropy_quantile",),
            "ATRGRPOConfig(**BASE, top_entropy_quantile=True)",
        ),
        config_case(
            "P10",
            "ATRGRPOConfig(steps_per_generation=2, generation_batch_size=64) (both: they contradict)",
            ("generation_batch_size|steps_per_generation",),
            "ATRGRPOConfig(**BASE, steps_per_generation=2, generation_batch_size=64)",
        ),
        config_case(
            "P11", "ScriptArguments(dataset_limit=2.0)", ("dataset_limit",), "ScriptArguments(dataset_limit=2.0)"
        ),
        config_case(
            "P12",
            "ScriptArguments(sft_learning_rate=inf)",
            ("sft_learning_rate",),
            "ScriptArguments(sft_learning_rate=float('inf'))",
        ),
        config_case(
            "P13",
            "RunConfig(ScriptArguments(tiny=False), ATRGRPOConfig(...), ModelConfig()) (no model at all)",
            ("model_name_or_path",),
            "RunConfig(ScriptArguments(tiny=False), ATRGRPOConfig(**BASE), ModelConfig())",
        ),
        config_case(
            "P14",
            "RunConfig(ScriptArguments(tiny=True, sft_steps=0, sft_batch_size=16), ...) (an SFT option with no SFT)",
            ("sft_batch_size",),
            "RunConfig(ScriptArguments(tiny=True, sft_steps=0, sft_batch_size=16), ATRGRPOConfig(**BASE), ModelConfig())",
        ),
        config_case(
            "P15",
            "RunConfig(..., ModelConfig(lora_r=8)) without use_peft (LoRA rank of no adapter)",
            ("lora_r",),
            "RunConfig(ScriptArguments(tiny=True), ATRGRPOConfig(**BASE), ModelConfig(lora_r=8))",
        ),
        # P16 (ModelConfig dtype with the tiny model) is honoured now: the tiny model is cast (tests/test_command_line.py)
        config_case(
            "P17",
            "RunConfig(ScriptArguments(tiny=True), ATRGRPOConfig(...), None) (no ModelConfig)",
            ("model",),
            "RunConfig(ScriptArguments(tiny=True), ATRGRPOConfig(**BASE), None)",
        ),
    ]

    # 3. command-line options that contradict, repeat or are ignored
    out += [
        command(
            "C01",
            3,
            "train --divergence_delta 0.05 --divergence_delta=0.06 (given twice, two spellings)",
            ("--divergence_delta",),
            train("--divergence_delta", "0.05", "--divergence_delta=0.06"),
        ),
        command(
            "C02",
            3,
            "train --kl_chunk_size 32 (the preset trains atr: only tr_ppo / truly_ppo / --measure_true_kl read it)",
            ("--kl_chunk_size",),
            train("--kl_chunk_size", "32"),
        ),
        command(
            "C03",
            3,
            "train --method_seed 7 (only clip_cov draws from it; the preset trains atr)",
            ("--method_seed",),
            train("--method_seed", "7"),
        ),
        command(
            "C04",
            3,
            "train --lora_r 8 --lora_alpha 16 (without --use_peft: no adapter is built)",
            ("--lora_r|--lora_alpha",),
            train("--lora_r", "8", "--lora_alpha", "16"),
        ),
        command(
            "C05",
            3,
            "train --sft_steps 0 --sft_batch_size 16 (an SFT option with the SFT stage off)",
            ("--sft_batch_size",),
            train("--sft_steps", "0", "--sft_batch_size", "16"),
        ),
        command(
            "C06",
            3,
            "train --steps_per_generation 2 --generation_batch_size 64 (TRL takes one of them)",
            ("--generation_batch_size|--steps_per_generation",),
            train("--steps_per_generation", "2", "--generation_batch_size", "64"),
        ),
        command(
            "C07",
            3,
            "train --num_train_epochs 3 (the preset's max_steps 2000 decides: the epochs are ignored)",
            ("--num_train_epochs",),
            train("--num_train_epochs", "3"),
        ),
        # C08 (train --dtype bfloat16 with the tiny model) is honoured now, as P16
        command(
            "C09", 3, "train --vllm_mode server (without --use_vllm)", ("--vllm_mode",), train("--vllm_mode", "server")
        ),
        command(
            "C10",
            3,
            "train --bf16 true --fp16 true (two precisions)",
            ("--fp16|--bf16",),
            train("--bf16", "true", "--fp16", "true"),
        ),
        command(
            "C11",
            3,
            "train --lr_scheduler_type cosine_warmup (not one of transformers' schedulers)",
            ("--lr_scheduler_type",),
            train("--lr_scheduler_type", "cosine_warmup"),
        ),
        command(
            "C12",
            3,
            "evaluate --temperature 0 --top_p 0.5 (greedy decoding ignores top-p)",
            ("--top_p",),
            [*EVAL, "--temperature", "0", "--top_p", "0.5", "--n", "1", *EVAL_FILE],
        ),
        command(
            "C13",
            3,
            "evaluate --benchmarks arith,arith (a benchmark named twice)",
            ("--benchmarks",),
            [
                "-m",
                "atr_llm.evaluate",
                "--tiny-model",
                "{fix}/model",
                "--benchmarks",
                "arith,arith",
                "--n",
                "1",
                *EVAL_FILE,
            ],
        ),
        # C14 (evaluate --n 4 --k 3, an empty table) is honoured now: Pass@3 is computed (tests/test_evaluate.py)
        command(
            "C15",
            3,
            "evaluate --every 2 without --checkpoints",
            ("--every",),
            [*EVAL, "--every", "2", "--n", "1", *EVAL_FILE],
        ),
        command(
            "C16",
            3,
            "evaluate --tiny-model DIR --model Qwen/Qwen3-1.7B (two base models)",
            ("--model|--tiny-model",),
            [*EVAL, "--model", "Qwen/Qwen3-1.7B", "--n", "1", *EVAL_FILE],
        ),
        command(
            "C17",
            3,
            "sims.clip_ranges --quick --seed 3 (--help offers --seed; nothing here is random)",
            ("--seed",),
            ["-m", "sims.clip_ranges", "--quick", "--seed", "3", "--out", "{out}"],
        ),
        command(
            "C18",
            3,
            "sims.trust_regions --quick --seed 3 (--help offers --seed; nothing here is random)",
            ("--seed",),
            ["-m", "sims.trust_regions", "--quick", "--seed", "3", "--out", "{out}"],
        ),
        command(
            "C19",
            3,
            "sims.verify_theorems --quick --n 500",
            ("--n|--quick",),
            ["-m", "sims.verify_theorems", "--quick", "--n", "500", "--out", "{out}"],
        ),
        command(
            "C20",
            3,
            "benchmarks.decode_attention --quick --allowances 256,128 (--quick keeps one allowance)",
            ("--allowances",),
            [
                "-m",
                "benchmarks.decode_attention",
                "--quick",
                "--allowances",
                "256,128",
                "--heads",
                "2",
                "--kv-heads",
                "1",
                "--head-dim",
                "8",
                "--layers",
                "1",
                "--completion",
                "8",
                "--repeats",
                "1",
                "--out",
                "{out}/decode.json",
            ],
        ),
        command(
            "C21",
            3,
            "benchmarks.loss_overhead --quick --repeats 3",
            ("--repeats|--quick",),
            ["-m", "benchmarks.loss_overhead", "--quick", "--repeats", "3", "--out", "{out}/loss.json"],
        ),
        command(
            "C22",
            3,
            "benchmarks.gpu_step --tiny --backends unsloth (Unsloth needs CUDA; --tiny runs on CPU)",
            ("--backends",),
            [
                "-m",
                "benchmarks.gpu_step",
                "--tiny",
                "--backends",
                "unsloth",
                "--kinds",
                "atr",
                "--steps",
                "1",
                "--max-completion-length",
                "4",
                "--out",
                "{out}/gpu_step.json",
            ],
        ),
        command(
            "C23",
            3,
            "experiments.cpu_table --quick --save-steps 10 (--quick runs 4 steps: no checkpoint would be saved)",
            ("--save-steps",),
            [
                "-m",
                "experiments.cpu_table",
                "--quick",
                "--save-steps",
                "10",
                "--runs-dir",
                "{out}/runs",
                "--out",
                "{out}/table",
            ],
        ),
        command(
            "C24",
            3,
            "experiments.cpu_table --quick --runs atr atr (a run named twice)",
            ("--runs",),
            [
                "-m",
                "experiments.cpu_table",
                "--quick",
                "--runs",
                "atr",
                "atr",
                "--runs-dir",
                "{out}/runs",
                "--out",
                "{out}/table",
            ],
        ),
        command(
            "C25",
            3,
            "experiments.cpu_table --rewrite --out DIR --quick",
            ("--rewrite|--quick",),
            ["-m", "experiments.cpu_table", "--rewrite", "--out", "{out}/table", "--quick"],
        ),
        command(
            "C26",
            3,
            "tools.mutation_fresh_process --names m1 --sample 3",
            ("--sample|--names",),
            [
                "-m",
                "tools.mutation_fresh_process",
                "--names",
                "atr_theory.ranges.x__mutmut_1",
                "--sample",
                "3",
                "--out",
                "{out}/fresh.txt",
            ],
        ),
        command(
            "C27",
            3,
            "tools.mutant_differential --mutants-dir EMPTY_DIR name (a folder without mutmut's copy)",
            ("--mutants-dir",),
            [
                "-m",
                "tools.mutant_differential",
                "--mutants-dir",
                "{fix}/empty",
                "atr_theory.ranges.x__mutmut_1",
                "--out",
                "{out}/diff.txt",
            ],
        ),
        command(
            "C28",
            3,
            "tools.mutation_fresh_process --root OTHER_PROJECT --sample 3 (a pyproject.toml without [tool.mutmut])",
            ("--root",),
            [
                "-m",
                "tools.mutation_fresh_process",
                "--root",
                "{fix}/otherproject",
                "--sample",
                "3",
                "--out",
                "{out}/fresh.txt",
            ],
        ),
        command(
            "C29",
            3,
            "tools.gpu_wheels --table --trl",
            ("--trl|--table",),
            ["-m", "tools.gpu_wheels", "--table", "--trl"],
        ),
    ]

    # 4. atr_theory.policy_loss / resolve
    call = "at.policy_loss({}, old, adv, mask{})"
    out += [
        loss_case("L01", "logp NaN at a valid position", ("logp",), call.format("put(logp, (0, 1), math.nan)", "")),
        loss_case(
            "L02",
            "old_logp -inf at a valid position",
            ("old_logp",),
            "at.policy_loss(logp, put(old, (1, 2), -math.inf), adv, mask)",
        ),
        loss_case(
            "L03", "advantages (B,) +inf", ("advantages",), "at.policy_loss(logp, old, put(adv, (1,), math.inf), mask)"
        ),
        loss_case(
            "L04",
            "token_weights NaN at a valid position",
            ("token_weights",),
            call.format("logp", ", token_weights=put(torch.ones(B, T), (0, 0), math.nan)"),
        ),
        loss_case(
            "L05",
            "behaviour_logp NaN with rollout_correction=RolloutCorrection()",
            ("behaviour_logp",),
            call.format(
                "logp", ", behaviour_logp=put(old, (0, 2), math.nan), rollout_correction=at.RolloutCorrection()"
            ),
        ),
        loss_case(
            "L06",
            "behaviour_logp +inf with sequence_mask=SequenceMask('k1', 'mean', 0.1, 'negative')",
            ("behaviour_logp",),
            call.format(
                "logp",
                ", behaviour_logp=put(old, (1, 0), math.inf), sequence_mask=at.SequenceMask('k1', 'mean', 0.1, 'negative')",
            ),
        ),
        loss_case(
            "L07",
            "entropies NaN with top_entropy_quantile=0.5",
            ("entropies",),
            call.format("logp", ", entropies=put(torch.ones(B, T), (1, 1), math.nan), top_entropy_quantile=0.5"),
        ),
        loss_case(
            "L08",
            "old_full_logp NaN, method tr_ppo",
            ("old_full_logp",),
            call.format(
                "logp", ", method='tr_ppo', old_full_logp=put(full_old, (0, 1, 2), math.nan), full_logp=full_new"
            ),
        ),
        loss_case(
            "L09",
            "full_logp a row of -inf, method truly_ppo",
            ("full_logp",),
            call.format(
                "logp", ", method='truly_ppo', old_full_logp=full_old, full_logp=put(full_new, (1, 0), -math.inf)"
            ),
        ),
        loss_case(
            "L10",
            "position_kl +inf, method tr_ppo",
            ("position_kl",),
            call.format("logp", ", method='tr_ppo', position_kl=put(torch.zeros(B, T), (0, 0), math.inf)"),
        ),
        loss_case(
            "L11", "mask holding 0.5", ("mask",), "at.policy_loss(logp, old, adv, put(mask.float(), (0, 0), 0.5))"
        ),
        loss_case(
            "L12", "delta=10**400 (a huge integer)", ("delta",), call.format("logp", ", method='atr', delta=10**400")
        ),
        loss_case("L13", "delta='0.07' (text)", ("delta",), call.format("logp", ", method='atr', delta='0.07'")),
        loss_case("L14", "max_length=nan", ("max_length",), call.format("logp", ", max_length=math.nan")),
        loss_case(
            "L15",
            "kl_chunk_size=0 with truly_ppo",
            ("kl_chunk_size",),
            call.format("logp", ", method='truly_ppo', old_full_logp=full_old, full_logp=full_new, kl_chunk_size=0"),
        ),
        loss_case(
            "L16",
            "kl_chunk_size=16 with method atr (no full distribution to chunk)",
            ("kl_chunk_size",),
            call.format("logp", ", method='atr', kl_chunk_size=16"),
        ),
        loss_case(
            "L17",
            "top_entropy_quantile=nan (with entropies)",
            ("top_entropy_quantile",),
            call.format("logp", ", entropies=torch.ones(B, T), top_entropy_quantile=math.nan"),
        ),
        loss_case(
            "L18",
            "generator=0 with clip_cov (a seed, not a torch.Generator)",
            ("generator",),
            call.format("logp", ", method='clip_cov', generator=0"),
        ),
        loss_case(
            "L19", "validate='false' (text for a flag)", ("validate",), call.format("logp", ", validate='false'")
        ),
        loss_case("L20", "ratio_level='seq'", ("ratio_level",), call.format("logp", ", ratio_level='seq'")),
        loss_case("L21", "logp as a Python list", ("logp",), call.format("logp.tolist()", "")),
        loss_case("L22", "at.resolve('atr', delta=10**400)", ("delta",), "at.resolve('atr', delta=10**400)"),
        loss_case("L23", "at.resolve('atr', form='clip')", ("form",), "at.resolve('atr', form='clip')"),
    ]

    # 5. the environment
    out += [
        command("E01", 5, "RANK=abc python -m atr_llm.train ...", ("$RANK",), train(), env={"RANK": "abc"}),
        command(
            "E02", 5, "WORLD_SIZE=0 python -m atr_llm.train ...", ("$WORLD_SIZE",), train(), env={"WORLD_SIZE": "0"}
        ),
        command(
            "E03", 5, "LOCAL_RANK=1.5 python -m atr_llm.train ...", ("$LOCAL_RANK",), train(), env={"LOCAL_RANK": "1.5"}
        ),
        command(
            "E04",
            5,
            "THP_MEM_ALLOC_ENABLE=yes python -m atr_llm.train ...",
            ("$THP_MEM_ALLOC_ENABLE",),
            train(),
            env={"THP_MEM_ALLOC_ENABLE": "yes"},
        ),
        command(
            "E05",
            5,
            "RANK=2 WORLD_SIZE=2 python -m atr_llm.train ... (a rank outside the world)",
            ("$RANK",),
            train(),
            env={"RANK": "2", "WORLD_SIZE": "2"},
        ),
        command(
            "E06",
            5,
            "RANK=1 python -m atr_llm.train ... (a worker rank with no WORLD_SIZE: it skips the folder's lock)",
            ("$RANK",),
            train(),
            env={"RANK": "1"},
        ),
        command(
            "E07",
            5,
            "LOCAL_RANK=1 LOCAL_WORLD_SIZE=1 python -m atr_llm.train ... (a local rank outside the node)",
            ("$LOCAL_RANK",),
            train(),
            env={"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"},
        ),
        verl_case("V01", '{"delta": 0.05', ()),
        verl_case("V02", '{"delta": "0.05"}', ("delta",)),
        verl_case("V03", '{"delta": NaN}', ("delta",)),
        verl_case("V04", '{"delta": 0.05, "delta": 0.06}', ("delta",)),
        verl_case("V05", '{"rollout_correction": {"level": "tokens"}}', ("rollout_correction",)),
        verl_case("V06", '{"delta": 0.05, "form": "clip"}', ("form",)),
        verl_case("V07", '{"Delta": 0.05}', ("Delta",)),
        verl_case(
            "V08",
            '{"delta": 0.05}',
            ("atr_params",),
            prelude=PY_VERL + "config.policy_loss.atr_params = {'delta': 0.06}\n",
        ),
    ]
    out[-1].input += " with config.policy_loss.atr_params={'delta': 0.06} (two values disagree)"

    # 6. resume of a checkpoint that trained something else ({out}/checkpoint-2: trainer_state.json {}, atr_method.json)
    latest = ("--resume_from_checkpoint", "latest")
    out += [
        command(
            "R01",
            6,
            "resume latest (trained atr) with --method is_kl3",
            ("--resume_from_checkpoint", "--method"),
            train(*latest, "--method", "is_kl3"),
            setup="atr",
        ),
        command(
            "R02",
            6,
            "resume latest (trained atr, min form) with --form mask",
            ("--form",),
            train(*latest, "--form", "mask"),
            setup="atr",
        ),
        command(
            "R03",
            6,
            "resume latest (trained atr, delta 0.07) with --divergence_delta 0.05",
            ("--divergence_delta",),
            train(*latest, "--divergence_delta", "0.05"),
            setup="atr",
        ),
        command(
            "R04",
            6,
            "resume latest (trained atr) with TRL's --delta 1.5 (a two-sided clip on atr's range: another rule)",
            ("--delta",),
            train(*latest, "--delta", "1.5"),
            setup="atr",
        ),
        command(
            "R05",
            6,
            "resume {out}/checkpoint-2 (trained atr) with --method kl2",
            ("--method",),
            train("--resume_from_checkpoint", "{out}/checkpoint-2", "--method", "kl2"),
            setup="atr",
        ),
        command(
            "R06",
            6,
            "resume latest of a checkpoint whose config.json is another model (hidden_size 128) with the tiny model",
            ("--resume_from_checkpoint",),
            train(*latest),
            setup="atr_other_model_config",
        ),
        command(
            "R07",
            6,
            "resume latest (atr_method.json records the tiny model) with --tiny false --model_name_or_path Qwen/Qwen3-0.6B",
            ("--model_name_or_path|--resume_from_checkpoint",),
            train(*latest, "--tiny", "false", "--model_name_or_path", "Qwen/Qwen3-0.6B"),
            setup="atr_tiny_model",
        ),
        command(
            "R08",
            6,
            "resume latest (atr_method.json records the toy-vocabulary tiny model) with --tiny_vocab qwen3",
            ("--tiny_vocab|--resume_from_checkpoint",),
            train(*latest, "--tiny_vocab", "qwen3"),
            setup="atr_tiny_model",
        ),
        command(
            "R09",
            6,
            "resume latest (trained atr in the mask form) with the preset (min form)",
            ("--form",),
            train(*latest),
            setup="atr_mask",
        ),
    ]

    # 7. values that used to fail only after work started
    out += [
        command(
            "F01",
            7,
            "train --tiny false (no --model_name_or_path: no model at all)",
            ("--model_name_or_path|--tiny",),
            train("--tiny", "false"),
        ),
        command(
            "F02",
            7,
            "train --report_to wandb (wandb is not installed)",
            ("--report_to",),
            train("--report_to", "wandb"),
        ),
        command(
            "F03",
            7,
            "train --optim adamw_bnb_8bit (bitsandbytes is not installed)",
            ("--optim",),
            train("--optim", "adamw_bnb_8bit"),
        ),
        command(
            "F04",
            7,
            "train --use_vllm true (vllm is not installed, no CUDA)",
            ("--use_vllm",),
            train("--use_vllm", "true"),
        ),
        command(
            "F05",
            7,
            "train --dataset_limit 2000000000 (a huge count: 2e9 generated problems)",
            ("--dataset_limit",),
            train("--dataset_limit", "2000000000"),
        ),
        command(
            "F06",
            7,
            "train --temperature 5e-6 (below a sampler's 1e-5)",
            ("--temperature",),
            train("--temperature", "5e-6"),
        ),
        command("F07", 7, "train --seed 4294967296 (2**32)", ("--seed",), train("--seed", "4294967296")),
        command(
            "F08",
            7,
            "train --output_dir '' (an empty path)",
            ("--output_dir",),
            ["-m", "atr_llm.train", "--config", PRESET, "--output_dir", ""],
        ),
        command(
            "F09",
            7,
            "train --output_dir README.md/run (a path below a file)",
            ("--output_dir",),
            ["-m", "atr_llm.train", "--config", PRESET, "--output_dir", "README.md/run"],
        ),
        command(
            "F10",
            7,
            "train --resume_from_checkpoint false (meant: do not resume)",
            ("--resume_from_checkpoint",),
            train("--resume_from_checkpoint", "false"),
        ),
        command(
            "F11",
            7,
            "train --use_liger_kernel true (liger-kernel is not installed)",
            ("--use_liger_kernel",),
            train("--use_liger_kernel", "true"),
        ),
        command(
            "F12",
            7,
            "evaluate --temperature 1e-7 (below a sampler's 1e-5, not 0)",
            ("--temperature",),
            [*EVAL, "--temperature", "1e-7", "--n", "1", *EVAL_FILE],
        ),
        command(
            "F13",
            7,
            "evaluate --seed 18446744073709551616 (2**64)",
            ("--seed",),
            [*EVAL, "--seed", str(2**64), "--n", "1", *EVAL_FILE],
        ),
        command(
            "F14",
            7,
            "evaluate --output_dir '' (an empty path)",
            ("--output_dir",),
            [*EVAL, "--n", "1", "--benchmark_path", f"arith={BENCH_FILE}", "--output_dir", ""],
        ),
        command(
            "F15",
            7,
            "sims.delta_sweep --quick --seed 4294967296 (2**32)",
            ("--seed",),
            ["-m", "sims.delta_sweep", "--quick", "--seed", "4294967296", "--out", "{out}"],
        ),
        command(
            "F16",
            7,
            "sims.clip_ranges --quick --out README.md/figs (a path below a file)",
            ("--out",),
            ["-m", "sims.clip_ranges", "--quick", "--out", "README.md/figs"],
        ),
        command(
            "F17",
            7,
            "experiments.cpu_table --quick --seeds 4294967296 (2**32)",
            ("--seeds",),
            [
                "-m",
                "experiments.cpu_table",
                "--quick",
                "--seeds",
                "4294967296",
                "--runs-dir",
                "{out}/runs",
                "--out",
                "{out}/table",
            ],
        ),
    ]
    return out


# ---------------------------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------------------------
def make_fixtures(fix: Path, selected: list[Case]) -> None:
    """The shared fixtures: an empty folder, another project's pyproject.toml, and (when a case needs it) a saved
    tiny model (``python -m atr_llm.tiny``)."""
    (fix / "empty").mkdir(parents=True)
    (fix / "otherproject").mkdir()
    (fix / "otherproject" / "pyproject.toml").write_text('[project]\nname = "another"\nversion = "0.1"\n')
    if any("{fix}/model" in " ".join(c.argv or []) for c in selected):
        subprocess.run(
            [sys.executable, "-m", "atr_llm.tiny", "--out", str(fix / "model")],
            cwd=ROOT,
            env=base_environment(),
            check=True,
            capture_output=True,
        )


def make_checkpoint(out: Path, kind: str) -> None:
    """``out/checkpoint-2``: ``trainer_state.json`` holding ``{}`` and the ``atr_method.json`` of ``kind``: ``atr``
    (``write_method_record(folder, resolve("atr"))``), ``atr_mask`` (atr's mask form), ``atr_tiny_model`` (with the
    toy-vocabulary tiny model as the trained model), ``atr_other_model_config`` (plus a ``config.json`` of a model with
    hidden_size 128)."""
    import atr_theory as at
    from atr_llm.checkpoints import write_method_record

    folder = out / "checkpoint-2"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    model = None
    if kind == "atr_tiny_model":
        from atr_llm.tiny import build_tokenizer_and_model

        _, model = build_tokenizer_and_model("toy", seed=0)
    write_method_record(folder, at.resolve("atr", "mask" if kind == "atr_mask" else None), model)
    if kind == "atr_other_model_config":
        config = {"model_type": "qwen3", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
        (folder / "config.json").write_text(json.dumps(config))


# ---------------------------------------------------------------------------------------------------------------
# running a case
# ---------------------------------------------------------------------------------------------------------------
def base_environment() -> dict[str, str]:
    """This process's environment without the variables a run reads, offline, the checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k not in RUN_VARIABLES and k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(
        PYTHONPATH=str(ROOT),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def listing(folder: Path) -> set[tuple[str, int]]:
    """Every path below ``folder`` with its size (-1 for a folder); empty when it does not exist."""
    if not folder.exists():
        return set()
    found = set()
    for p in folder.rglob("*"):
        try:
            found.add((str(p.relative_to(folder)), p.stat().st_size if p.is_file() else -1))
        except OSError:
            continue
    return found


def names_in(folder: Path) -> set[str]:
    """The names directly in ``folder`` (the checkout's top level and ``runs/``: what a command writing into the
    checkout would add)."""
    try:
        return {p.name for p in folder.iterdir()}
    except OSError:
        return set()


class Snapshot:
    """What a case may write into: its folder (whole), the shared fixtures (whole), the checkout's top level and
    ``runs/`` (names)."""

    def __init__(self, tmp: Path, fix: Path):
        self.tmp, self.fix = tmp, fix
        self.state = self.take()

    def take(self):
        return listing(self.tmp), listing(self.fix), names_in(ROOT), names_in(ROOT / "runs")

    def written(self) -> list[str]:
        now = self.take()
        where = (str(self.tmp), str(self.fix), str(ROOT), str(ROOT / "runs"))
        new = []
        for base, before, after in zip(where, self.state, now):
            for item in sorted(set(after) - set(before), key=str):
                new.append(f"{base}/{item[0] if isinstance(item, tuple) else item}")
        return new


def run_process(argv: list[str], env: dict[str, str], snapshot: Snapshot, timeout: float, logs: Path) -> dict:
    """Run ``python ARGV`` from the checkout, stopped (with its children) once it writes anything or after
    ``timeout`` seconds; its exit status, stdout and stderr, what it wrote."""
    stdout, stderr = logs / "stdout.txt", logs / "stderr.txt"
    start = time.monotonic()
    with stdout.open("w") as so, stderr.open("w") as se:
        proc = subprocess.Popen(
            [sys.executable, *argv], cwd=ROOT, env=env, stdout=so, stderr=se, start_new_session=True
        )
        wrote: list[str] = []
        stopped = None
        while proc.poll() is None:
            time.sleep(0.25)
            if not wrote:
                wrote = snapshot.written()
                if wrote:  # work started: let it say a little more, then stop it
                    try:
                        proc.wait(timeout=2.0)
                    except subprocess.TimeoutExpired:
                        stopped = "stopped once it had written"
            if proc.poll() is None and time.monotonic() - start > timeout:
                stopped = f"still running after {timeout:.0f} s"
            if stopped and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # children left behind (worker pools)
        except (ProcessLookupError, PermissionError):
            pass
    wrote = wrote or snapshot.written()
    return {
        "exit": proc.returncode,
        "stdout": stdout.read_text(errors="replace"),
        "stderr": stderr.read_text(errors="replace"),
        "wrote": wrote,
        "stopped": stopped,
        "seconds": round(time.monotonic() - start, 1),
    }


RESULT_MARK = "AUDIT-RESULT "

RUNNER = """
import json as _json
def _report():
    try:
        value = RESULT()
    except BaseException as e:  # noqa: BLE001 - what the user would see
        row = {"outcome": "raised", "type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
               "message": str(e)}
    else:
        row = {"outcome": "accepted", "value": repr(value)[:400]}
    print("AUDIT-RESULT " + _json.dumps(row), flush=True)
_report()
"""


def named(text: str, names: tuple[str, ...]) -> list[str]:
    """The items of ``names`` that ``text`` does not hold (``a|b``: either)."""
    return [n for n in names if not any(alt in text for alt in n.split("|"))]


def judge_command(case: Case, done: dict) -> tuple[str, str]:
    stderr = done["stderr"]
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if done["wrote"]:
        return "bad", f"work started: wrote {', '.join(done['wrote'][:4])}" + (
            f" ({done['stopped']})" if done["stopped"] else f" (exit {done['exit']})"
        )
    if done["stopped"]:
        return "bad", f"accepted: {done['stopped']}"
    if done["exit"] == 0:
        return "bad", "accepted: exit 0"
    if "Traceback" in stderr:
        return "bad", f"a traceback (exit {done['exit']})"
    problems = []
    if done["exit"] != 2:
        problems.append(f"exit {done['exit']}")
    if len(lines) != 1:
        problems.append(f"{len(lines)} lines on stderr")
    last = lines[-1] if lines else ""
    if not last.startswith("error: "):
        problems.append("the line does not start with 'error: '")
    missing = named(last, case.names)
    if missing:
        problems.append(f"does not name {' and '.join(m.replace('|', ' or ') for m in missing)}")
    return ("unclear", "; ".join(problems)) if problems else ("clean", "refused as promised")


def judge_python(case: Case, done: dict, row: dict | None) -> tuple[str, str]:
    if done["wrote"]:
        return "bad", f"wrote {', '.join(done['wrote'][:4])}"
    if row is None:
        tail = " | ".join(done["stderr"].strip().splitlines()[-2:])
        return (
            "bad",
            f"the process ended without a result (exit {done['exit']}{', ' + done['stopped'] if done['stopped'] else ''}): {tail}",
        )
    if row["outcome"] == "accepted":
        return "bad", "accepted silently"
    problems = []
    if not {"ValueError", "TypeError"} & set(row["mro"]):
        problems.append(f"{row['type']} is neither a ValueError nor a TypeError")
    if "\n" in row["message"].strip():
        problems.append("the message is on several lines")
    missing = named(row["message"], case.names)
    if missing:
        problems.append(f"does not name {' and '.join(m.replace('|', ' or ') for m in missing)}")
    return ("unclear", "; ".join(problems)) if problems else ("clean", "refused as promised")


def render(text: str, places: dict[str, str]) -> str:
    for key, value in places.items():
        text = text.replace("{" + key + "}", value)
    return text


def run_case(case: Case, fix: Path) -> dict:
    """Run ``case`` in a fresh folder; its record."""
    with tempfile.TemporaryDirectory(prefix=f"audit-{case.id}-") as tmp, tempfile.TemporaryDirectory() as logs:
        tmp = Path(tmp)
        places = {"tmp": str(tmp), "out": str(tmp / "out"), "fix": str(fix), "repo": str(ROOT)}
        for name, text in case.files.items():
            (tmp / name).write_text(render(text, places))
        if case.setup:
            make_checkpoint(tmp / "out", case.setup)
        env = {**base_environment(), "AUDIT_OUT": places["out"], **case.env}
        snapshot = Snapshot(tmp, fix)
        if case.argv is not None:
            argv = [render(a, places) for a in case.argv]
        else:
            argv = ["-c", case.code + RUNNER]
        done = run_process(argv, env, snapshot, case.timeout, Path(logs))
    record = {
        "id": case.id,
        "class": case.cls,
        "way_in": CLASSES[case.cls],
        "how": case.way,
        "input": case.input,
        "expected": case.expected,
        "must_name": list(case.names),
        "seconds": done["seconds"],
        "wrote": done["wrote"],
    }
    if case.env:
        record["environment"] = case.env
    if case.files:
        record["files"] = case.files
    if case.setup:
        record["checkpoint"] = case.setup
    if case.argv is not None:
        record["command"] = " ".join(
            [f"{k}={v!r}" for k, v in case.env.items()] + ["python", *(a if a else "''" for a in case.argv)]
        )
        record["exit"] = done["exit"]
        record["stderr_last_lines"] = done["stderr"].strip().splitlines()[-3:]
        record["stopped"] = done["stopped"]
        verdict, why = judge_command(case, done)
    else:
        record["code"] = case.code.strip().splitlines()[-1].removeprefix("RESULT = lambda: ")
        rows = [line[len(RESULT_MARK) :] for line in done["stdout"].splitlines() if line.startswith(RESULT_MARK)]
        row = json.loads(rows[-1]) if rows else None
        record["result"] = row
        if row is None:
            record["stderr_last_lines"] = done["stderr"].strip().splitlines()[-3:]
        verdict, why = judge_python(case, done, row)
    record["verdict"], record["why"] = verdict, why
    return record


# ---------------------------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------------------------
def summarise(results: list[dict]) -> dict:
    verdicts = ("clean", "unclear", "bad")
    counts = {v: sum(r["verdict"] == v for r in results) for v in verdicts}
    per_class = {}
    for number, name in CLASSES.items():
        rows = [r for r in results if r["class"] == number]
        if rows:
            per_class[f"{number}. {name}"] = {
                "cases": len(rows),
                **{v: sum(r["verdict"] == v for r in rows) for v in verdicts},
            }
    return {"cases": len(results), **counts, "per_class": per_class}


def main(argv: list[str] | None = None) -> dict:
    from atr_llm.cli_types import Text, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=WriteFile(), default=str(OUT.relative_to(ROOT)), help="where the records go (JSON)")
    ap.add_argument(
        "--only", type=Text(), default=None, help="run only the cases whose id starts with this (comma list)"
    )
    args = ap.parse_args(argv)
    selected = cases()
    if args.only:
        prefixes = tuple(p.strip() for p in args.only.split(",") if p.strip())
        selected = [c for c in selected if c.id.startswith(prefixes)]
        if not selected:
            from atr_llm.command_line import refuse

            raise refuse("--only", args.only, "no case id starts with it")
    out = Path(args.out)
    if not out.is_absolute():
        out = ROOT / out
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="audit-fixtures-") as fix:
        fix = Path(fix)
        make_fixtures(fix, selected)
        for case in selected:
            record = run_case(case, fix)
            results.append(record)
            said = record.get("stderr_last_lines") or [json.dumps(record.get("result"))]
            print(
                f"{case.id} {record['verdict']:8s} {record['seconds']:6.1f}s  {case.input}\n    {record['why']}\n    {said[-1][:300] if said else ''}",
                flush=True,
            )
    summary = {
        "command": " ".join(["python -m tools.audit_one_way_in", *(sys.argv[1:] if argv is None else argv)]),
        "seconds": round(time.monotonic() - started),
        "counts": summarise(results),
        "not_clean": [r["id"] for r in results if r["verdict"] != "clean"],
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    counts = summary["counts"]
    print(
        f"{counts['cases']} cases: {counts['clean']} clean, {counts['unclear']} unclear, {counts['bad']} bad; wrote {out}"
    )
    return summary


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
