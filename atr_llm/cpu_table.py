"""The paper's Tables 2-3 and Figs. 3-4 at the scale of a 2-core CPU (Fig. 5, Pass@K against K, is read from the
samples its evaluations leave in ``--runs-dir`` by :mod:`atr_llm.pass_at_k_curves`).

    python -m atr_llm.cpu_table                  # every run x 3 seeds, resumable (see the README for the cost)
    python -m atr_llm.cpu_table --device cuda --workers 8   # the same table on one GPU, 8 runs at a time
    python -m atr_llm.cpu_table --quick          # 2 runs x 1 seed x a few steps (CI)
    python -m atr_llm.cpu_table --at-step 250        # the table of 250-step runs, read from finished runs' checkpoints
    python -m atr_llm.cpu_table --learning-rate 3e-4 --max-steps 400 --save-steps 100 \
        --runs clip atr atr-min clip-mask --runs-dir runs/cpu_table_lr3e-4 --out figures/cpu_table_lr3e-4
                                                     # another protocol: its own runs directory and table

Per seed: a tiny Qwen3 (``atr_llm.tiny``) gets a formatting SFT (600 steps) on three-term arithmetic answered
step by step (``a +- b +- c`` over digits, ``atr_llm.data.OFFLINE_TASKS["arithmetic-3step-steps"]``); then every
run of :data:`CPU_RUNS` (Table 2's methods, Table 3's estimators and matched baselines, an ATR delta ablation)
trains GRPO from that same SFT model with ``atr_llm/configs/cpu-table.yaml`` (dr_grpo, G = 8, 32 prompts per step,
1,000 steps, ``num_iterations: 2`` so that clipping acts) through ``python -m atr_llm.train``'s own entry point.
Each run and the SFT model are evaluated on the task's test split (:func:`atr_llm.data.is_held_out`: no training
row of any seed is a test problem) with 8 samples under two samplings, each its own benchmark of the table:
T = 0.3, top-p 0.95 (the paper's evaluation sampling) and T = 1 (the training sampling). Mean@8 and Pass@8 at
the final step and the best over the saved checkpoints, as in Table 2's "final (best)".

Writes into ``--out`` (default ``figures/``): ``cpu_llm_table.csv`` (one row per run x seed x benchmark),
``cpu_llm_table.md`` (means over seeds, paired differences against clip and atr with 95% t intervals, the
difference each line's seeds would detect with 80% power, and the seeds a comparison between rules needs at the
table's pooled spread: :func:`detectable_difference`, :func:`between_rule_noise`; when clip, clip-mask, atr-min
and atr ran on the same seeds, Eq. 5's form crossed with the ratio range as a 2 x 2: :func:`forms_factorial`;
training reward, entropy and length over each run's last 100 steps, paired: :func:`curve_tails`),
``cpu_llm_curves.csv`` + ``cpu_llm_curves.png`` (training reward, entropy, completion length: Fig. 3's
quantities), ``cpu_llm_delta_ablation.csv`` + ``.png`` (Mean@8 against ATR's delta: Fig. 4's question) and
``cpu_llm_table.json`` (settings, versions, paired statistics, each run's change from its own SFT model). Runs live in ``--runs-dir``; a finished run
(``result.json``) is not trained again, so an interrupted table resumes. The table in ``--out`` accumulates:
rows of an earlier invocation with the same protocol stay (a re-run (run, seed, SFT model) replaces its own), so
rows can be added in later sessions even when their ``--runs-dir`` is gone (``--replace-table`` starts over;
``--rewrite`` writes a table again from its own rows, training nothing, after a change to its statistics).

Every row records the SFT model it started from (``sft_model``: :func:`weights_id`, a hash of its weights) and
the invocation that wrote it. The same command trains different SFT models on different kinds of CPU (kernels
round differently and 600 steps amplify it), so rows are only paired when they started from the same model, and
SFT models trained on one kind of machine form one *start* (:func:`start_labels`; each SFT model records the machine
that trained it, :func:`machine_kind`, so seeds added in a later invocation join their start); with more than one
start in a table every row is named with its start (``atr [B]``) and the table lists which models each start holds.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import statistics
import sys
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path

from tqdm.auto import tqdm

from .presets import RUNS

BASE_CONFIG = Path(__file__).parent / "configs" / "cpu-table.yaml"


def base_config_value(key: str):
    """``key`` of :data:`BASE_CONFIG` (cpu-table.yaml), the training settings every run starts from."""
    import yaml

    return yaml.safe_load(BASE_CONFIG.read_text())[key]


def run_directory(runs_dir: Path | str, run: str, seed: int) -> Path:
    """Where (``run``, ``seed``) trains and writes its checkpoints and ``result.json``."""
    return Path(runs_dir) / f"{run}-s{seed}"


TASK = "arithmetic-3step-steps"
EVAL_SAMPLING = dict(temperature=0.3, top_p=0.95)  # the paper's evaluation sampling (Sec. 5)
BENCHMARKS: dict[str, dict] = {
    "steps-test-T0.3": EVAL_SAMPLING,
    "steps-test-T1": dict(temperature=1.0, top_p=1.0),  # the training sampling: what GRPO's reward measures
}
"""Benchmark name -> sampling; every benchmark is the same held-out problems of :data:`TASK`."""

TABLE2 = ["clip", "clip-higher", "dual-clip", "dcpo", "clip-cov", "sapo", "atr"]
TABLE3 = ["kl1", "kl2", "is-kl3", "clip-eps0.329", "clip-eps0.422", "clip-higher-0.329-0.422"]
PAPER_CLIP_HIGHER = ["clip-higher-0.329-0.5", "clip-higher-0.329-0.6"]
"""The paper's own Table 3 clip-higher rows (eps_low 0.329, eps_high 0.5 / 0.6; :data:`atr_llm.presets.RUNS`); the
default table has clip-higher at ATR's range (0.329, 0.422) instead, as issue 15 asks, so these run on request."""
DELTA_ABLATION = ["atr-delta0.03", "atr-delta0.05", "atr-delta0.1", "atr-delta0.15"]
FORM_CONTROL = ["clip-mask", "atr-min"]
"""Each rule in the other form of Eq. 5 (not in the default table): clip as a mask (both signs frozen outside
[0.8, 1.2]) and atr in PPO's min form (its exact range [0.671, 1.422], frozen only where the advantage's sign
makes the clipped objective the smaller one)."""

_NOT_PRESETS: dict[str, dict] = {
    # ATR's ratio range at delta = 0.07 is [0.671, 1.422]: clip-higher with exactly that range is the matched control
    "clip-higher-0.329-0.422": {"method": "clip_higher", "epsilon_low": 0.329, "epsilon_high": 0.422},
    "atr-delta0.03": {"method": "atr", "delta": 0.03},
    "atr-delta0.15": {"method": "atr", "delta": 0.15},
    "clip-mask": {"method": "clip", "form": "mask"},
    "atr-min": {"method": "atr", "form": "min"},
}
CPU_RUNS: dict[str, dict] = {
    run: RUNS[run] if run in RUNS else _NOT_PRESETS[run]
    for run in TABLE2 + TABLE3 + PAPER_CLIP_HIGHER + DELTA_ABLATION + FORM_CONTROL
}
"""Run name -> method and parameters (the paper's presets where it has one: :data:`atr_llm.presets.RUNS`), in the
table's order: Table 2, Table 3, the paper's other clip-higher rows, the ablation, the form controls."""
ABLATION_DELTAS: dict[str, float] = {run: CPU_RUNS[run]["delta"] for run in ["atr", *DELTA_ABLATION]}
"""Run name -> ATR's delta for the delta ablation: ``atr`` (the paper's 0.07) and :data:`DELTA_ABLATION`."""

FULL = dict(
    runs=TABLE2 + TABLE3 + DELTA_ABLATION,
    seeds=[0, 1, 2],
    sft_steps=600,
    max_steps=1000,
    save_steps=250,
    test_problems=200,
    samples=8,
)
QUICK = dict(runs=["clip", "atr"], seeds=[0], sft_steps=20, max_steps=4, save_steps=2, test_problems=16, samples=8)


def run_args(run: str) -> list[str]:
    """``python -m atr_llm.train`` arguments that select ``run``'s method and parameters."""
    from .trainer import config_field

    spec = CPU_RUNS[run]
    args = ["--method", spec["method"]]
    for k, v in spec.items():
        if k != "method":
            args += [f"--{config_field(k)}", str(v)]
    return args


# ---------------------------------------------------------------------------------------------
# one seed's SFT model, one run, one evaluation (each runs in a worker process)
# ---------------------------------------------------------------------------------------------
def train_sft(seed: int, sft_steps: int, runs_dir: Path) -> Path:
    """The seed's SFT model (tiny Qwen3, toy tokenizer; lr 3e-3, batch 32 as ``python -m atr_llm.train
    --sft_steps``), saved to ``runs_dir/sft-s{seed}``; reused if there."""
    from .data import load_source
    from .sft import run_sft
    from .tiny import build_tokenizer_and_model

    out = run_directory(runs_dir, "sft", seed)
    if (out / "config.json").exists():
        return out
    tok, model = build_tokenizer_and_model("toy", seed=seed)
    ds = load_source(TASK, None, 4000, seed=seed + 1)
    run_sft(model, tok, ds, out, max_steps=sft_steps, learning_rate=3e-3, batch_size=32, seed=seed)
    (out / MACHINE_FILE).write_text(json.dumps({"machine": machine_kind()}))
    return out


MACHINE_FILE = "machine.json"
"""Written beside an SFT model by :func:`train_sft`: the :func:`machine_kind` that trained it."""


def machine_kind() -> str:
    """The kind of machine this process computes on, as far as it decides an SFT model's bits beyond seed and
    protocol: the CPU's model name and the vector instruction set torch dispatches to, the CUDA device when one is
    available (TRL's trainers use it), and torch's version -- e.g. ``"AMD EPYC | cpu AVX2 | torch 2.13.0+cpu"``.
    Two machines that agree here are taken to train the same SFT model from the same seed (kernels of one ISA and
    torch build round alike); the cpu-table's starts are these kinds (:func:`start_labels`)."""
    import platform

    import torch

    name = ""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    name = name or platform.processor() or platform.machine()
    parts = [name, f"cpu {torch.backends.cpu.get_cpu_capability()}"]
    if torch.cuda.is_available():
        parts.append(f"cuda {torch.cuda.get_device_name(0)}")
    return " | ".join([*parts, f"torch {torch.__version__}"])


def sft_machine(model_dir: Path | str) -> str | None:
    """The machine kind recorded beside an SFT model (:data:`MACHINE_FILE`), or None for a model trained before
    it was recorded."""
    path = Path(model_dir) / MACHINE_FILE
    return json.loads(path.read_text())["machine"] if path.exists() else None


def weights_id(model_dir: Path | str) -> str:
    """Identity of a saved model's weights: the first 16 hex digits of SHA-256 over every tensor of its
    ``*.safetensors`` files in name order (name, dtype, shape, then the raw bytes). File metadata and
    shard layout do not enter, so two saves of equal weights agree and a change of one bit in one weight does not."""
    import torch
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {model_dir}: not a saved model directory")
    tensors = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # the raw bits, any dtype (bfloat16 too)
    return digest.hexdigest()[:16]


def evaluation_problems(test_problems: int, task: str = TASK):
    """The first ``test_problems`` problems of ``task``'s test split, seed 12345: the problems every evaluation of
    the table grades (their row index is the ``problem_id`` of the samples it writes)."""
    from .data import OFFLINE_TASKS, arithmetic_dataset

    return arithmetic_dataset(test_problems, seed=12345, **{**OFFLINE_TASKS[task], "split": "test"})


def evaluate_model(
    model_dir: Path,
    tokenizer_dir: Path,
    test_problems: int,
    samples: int,
    out_dir: Path,
    *,
    task: str = TASK,
    max_tokens: int | None = None,
    sampling: dict | None = None,
    device: str = "cpu",
) -> dict:
    """Mean@1/Pass@1 and Mean@k/Pass@k (%) on ``task``'s test split (its first ``test_problems`` problems of seed
    12345), ``samples`` completions per problem; ``max_tokens`` defaults to the training cap of cpu-table.yaml and
    ``sampling`` to :data:`EVAL_SAMPLING`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .evaluate import HFGenerator, evaluate_benchmarks, summarise_samples

    test = evaluation_problems(test_problems, task)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).to(device)
    if max_tokens is None:
        max_tokens = base_config_value("max_completion_length")  # as in training
    gen = HFGenerator(model, tok, max_tokens=max_tokens, batch_size=512, seed=0, **(sampling or EVAL_SAMPLING))
    rows = evaluate_benchmarks(gen, {"test": test}, out_dir, n=samples, chunk_problems=test_problems, workers=1)
    return summarise_samples(rows, [1, samples])["test"]


def evaluate_every_benchmark(model_dir: Path, tokenizer_dir: Path, job: dict, out_dir: Path) -> dict:
    """``{benchmark: evaluate_model(...)}`` for every sampling of :data:`BENCHMARKS` (samples in ``out_dir/<name>``)."""
    return {
        name: evaluate_model(
            model_dir,
            tokenizer_dir,
            job["test_problems"],
            job["samples"],
            out_dir / name,
            sampling=sampling,
            device=job.get("device", "cpu"),
        )
        for name, sampling in BENCHMARKS.items()
    }


def grpo_learning_rate(requested: float | None) -> float | None:
    """The ``learning_rate`` setting of a table: ``None`` for cpu-table.yaml's own rate (so tables written before
    the option existed keep their rows), else the requested rate (> 0, finite), which makes a protocol of its own."""
    if requested is None:
        return None
    if not (math.isfinite(requested) and requested > 0):
        raise ValueError(f"--learning-rate must be a finite number > 0, got {requested}")
    if requested == float(base_config_value("learning_rate")):
        return None
    return requested


def train_argv(job: dict, output_dir: Path | str, max_steps: int, save_steps: int) -> list[str]:
    """``python -m atr_llm.train`` arguments of ``job``'s run (``run``, ``seed``, ``sft_dir``, optionally
    ``learning_rate`` and ``device``) from its seed's SFT model into ``output_dir``: cpu-table.yaml, then the run's
    method and parameters (:func:`run_args`)."""
    argv = ["--config", str(BASE_CONFIG), "--model_name_or_path", str(job["sft_dir"]), "--seed", str(job["seed"])]
    argv += ["--output_dir", str(output_dir), "--max_steps", str(max_steps), "--save_steps", str(save_steps)]
    argv += run_args(job["run"])
    if job.get("learning_rate") is not None:  # a protocol other than cpu-table.yaml's rate (``--learning-rate``)
        argv += ["--learning_rate", repr(float(job["learning_rate"]))]
    if job.get("device", "cpu") != "cpu":
        argv += ["--use_cpu", "false"]
    return argv


def train_and_evaluate(job: dict) -> dict:
    """Train one (run, seed) from the seed's SFT model with ``python -m atr_llm.train``'s entry point, then
    evaluate every saved checkpoint and the final model; the result is also written to ``result.json``."""
    from . import train
    from .evaluate import _checkpoints

    run_dir = run_directory(job["runs_dir"], job["run"], job["seed"])
    done = run_dir / "result.json"
    if done.exists():
        return _started_from(json.loads(done.read_text()), job, done)
    run_dir.mkdir(parents=True, exist_ok=True)
    _send_output_to(run_dir / "train.log")
    argv = train_argv(job, run_dir, job["max_steps"], job["save_steps"])
    ckpts = _checkpoints(run_dir, 1)
    if ckpts and not (run_dir / "final" / "config.json").exists():
        argv += ["--resume_from_checkpoint", str(ckpts[-1][1])]
    if not (run_dir / "final" / "config.json").exists():
        train.main(argv)
    evals = {}
    for step, path in [*_checkpoints(run_dir, 1), (job["max_steps"], run_dir / "final")]:
        if step not in evals:  # the checkpoint at max_steps holds the final weights too: evaluated once
            evals[step] = evaluate_every_benchmark(path, job["sft_dir"], job, path / "eval")
    history = json.loads((run_dir / "log_history.json").read_text())
    result = _result_of(job["run"], job)
    result.update({key: job.get(key) for key in _RUN_PROTOCOL_KEYS})
    result["evals"] = {str(k): v for k, v in evals.items()}
    result["curves"] = [{k: h.get(k) for k in CURVE_KEYS} for h in history if "reward" in h and "step" in h]
    done.write_text(json.dumps(result))
    return result


def result_at_step(result: dict, step: int) -> dict:
    """``result`` as a run of ``step`` training steps would have written it: its evaluations at checkpoints <= ``step``
    and its training curves up to ``step`` (the SFT model's own result, step 0, unchanged). With the constant learning
    rate of cpu-table.yaml a run's checkpoint at ``step`` holds the weights of a ``step``-step run of the same seed
    (``tests/test_cpu_table.py`` trains both and compares), so this is that shorter run's result without training it.
    One exception, in the curves only: a run also logs its last step when that is off the logging interval (10 steps
    in cpu-table.yaml), a point the longer run never logged; at multiples of 10 the curves agree too."""
    if result["run"] == "sft":
        return result
    steps = sorted(int(s) for s in result["evals"])
    if step not in steps:
        raise ValueError(
            f"{result['run']} seed {result['seed']} has no evaluated checkpoint at step {step} (it has {steps}): "
            "--at-step must be a step at which the runs saved a checkpoint (a multiple of save_steps, <= max_steps)"
        )
    return {
        **result,
        "evals": {s: v for s, v in result["evals"].items() if int(s) <= step},
        "curves": [c for c in result["curves"] if c["step"] <= step],
    }


def evaluate_sft(job: dict) -> dict:
    """The SFT model's own row (step 0 of every run of that seed)."""
    sft_dir = Path(job["sft_dir"])
    done = sft_dir / "result.json"
    if done.exists():
        return _started_from(json.loads(done.read_text()), job, done)
    res = evaluate_every_benchmark(sft_dir, sft_dir, job, sft_dir / "eval")
    result = {**_result_of("sft", job), "evals": {"0": res}, "curves": []}
    done.write_text(json.dumps(result))
    return result


def _result_of(run: str, job: dict) -> dict:
    """The head of a finished result: which run, which seed, and the SFT model (and its machine) it started from."""
    return {"run": run, "seed": job["seed"], "sft_model": job["sft_model"], "sft_machine": job.get("sft_machine")}


def _started_from(result: dict, job: dict, path: Path) -> dict:
    """A finished result read back, checked to have started from the job's SFT model (results written before
    the SFT model was recorded take the job's, and its machine kind with it) and, for a GRPO run, to have been
    trained and saved as the job asks (:func:`refuse_other_protocol`)."""
    recorded = result.setdefault("sft_model", job["sft_model"])
    result.setdefault("sft_machine", job.get("sft_machine"))
    if recorded != job["sft_model"]:
        raise ValueError(
            f"{path} started from SFT model {recorded}, but {job['sft_dir']} now holds {job['sft_model']}: "
            "the SFT model was trained again; move the run away (or use another --runs-dir) to train it anew"
        )
    if result["run"] != "sft":
        refuse_other_protocol(result, job, path)
    return result


def refuse_other_protocol(result: dict, job: dict, path: Path) -> None:
    """Raise if the finished GRPO run ``result`` (read from ``path``) was trained with another learning rate or step
    count, or saved its evaluated checkpoints at another interval, than ``job`` asks for. A result written before
    these were recorded was trained at cpu-table.yaml's rate (the only one then) for as many steps as its last
    evaluation's, with a checkpoint at its first evaluation's step; those values are filled into ``result``."""
    evaluated = sorted(int(step) for step in result["evals"])
    result.setdefault("learning_rate", None)
    result.setdefault("max_steps", evaluated[-1])
    result.setdefault("save_steps", evaluated[0])
    for key in _RUN_PROTOCOL_KEYS:
        if result[key] != job.get(key):
            raise ValueError(
                f"{path} was trained with {key} = {result[key]}, this invocation asks for {job.get(key)} "
                "(None: cpu-table.yaml's): use another --runs-dir for another protocol"
            )


_RUN_PROTOCOL_KEYS = ("learning_rate", "max_steps", "save_steps")
"""What a finished GRPO run records of how it was trained and saved, beyond its method, seed and SFT model."""


CURVE_KEYS = (
    "step",
    "reward",
    "entropy",
    "completions/mean_length",
    "completions/clipped_ratio",
    "clip/frac_masked",
    "clip/ratio_max",
)


def _send_output_to(path: Path) -> None:
    """This worker's stdout and stderr (trainer logs, progress bars) go to ``path`` from now on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory(mmap_threshold: int = 256 << 20, trim_threshold: int = 1 << 30, top_pad: int = 256 << 20) -> bool:
    """Make glibc's allocator keep freed memory for re-use: blocks below ``mmap_threshold`` come from the heap, and
    up to ``trim_threshold`` of freed heap stays mapped (``mallopt(M_MMAP_THRESHOLD / M_TRIM_THRESHOLD /
    M_TOP_PAD)``, as the ``MALLOC_*_`` environment variables would set them at start-up).

    By default glibc maps blocks above its (adaptive, at most 32 MiB) threshold afresh and returns freed heap above a
    small threshold, so every step's few-MiB tensors (TRL's log-prob tiles, the attention's buffers) fault their
    pages in again. Allocation only: the numbers are unchanged (a GRPO run of the table's setting gave the same
    weights either way). Measured on this 2-core machine, two processes side by side, 100 steps of cpu-table.yaml:
    6.5-9.5% less time (three pairs). Returns False, changing nothing, where the C library has no ``mallopt``."""
    import ctypes
    import ctypes.util

    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    settings = ((_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, trim_threshold), (_M_TOP_PAD, top_pad))
    return all(mallopt(param, int(value)) == 1 for param, value in settings)


def worker_init() -> None:
    """Initialiser of the driver's worker processes (and of scripts that must reduce like them): one torch thread,
    and freed memory kept for re-use (:func:`keep_freed_memory`; allocation only, the same numbers)."""
    import torch

    torch.set_num_threads(1)  # one core per worker: the tiny model is launch-bound, two workers beat two threads
    keep_freed_memory()


def _seed_job(seed: int, settings: dict, runs_dir: Path) -> dict:
    sft_dir = train_sft(seed, settings["sft_steps"], runs_dir)
    return {
        "seed": seed,
        "sft_dir": str(sft_dir),
        "sft_model": weights_id(sft_dir),
        "sft_machine": sft_machine(sft_dir),
        "test_problems": settings["test_problems"],
        "samples": settings["samples"],
        "device": settings["device"],
    }


def _sft_and_evaluate(seed: int, settings: dict, runs_dir: str) -> dict:
    _send_output_to(Path(runs_dir) / f"sft-s{seed}.log")
    job = _seed_job(seed, settings, Path(runs_dir))
    return {"job": job, "result": evaluate_sft(job)}


# ---------------------------------------------------------------------------------------------
# tables and statistics
# ---------------------------------------------------------------------------------------------
def table_rows(results: list[dict], k: int) -> list[dict]:
    """One row per run x seed x benchmark: final and best Mean@k / Pass@k and the last logged training values."""
    rows = []
    for r in results:
        by_step = {int(s): v for s, v in r["evals"].items()}
        last = r["curves"][-1] if r["curves"] else {}
        for benchmark in BENCHMARKS:
            evals = {s: v[benchmark] for s, v in by_step.items()}
            rows.append(_table_row(r, benchmark, evals, last, k))
    return rows


def _table_row(r: dict, benchmark: str, evals: dict[int, dict], last: dict, k: int) -> dict:
    final_step = max(evals)
    best_step = max(evals, key=lambda s: (evals[s][f"mean@{k}"], s))
    return {
        "method": r["run"],
        "seed": r["seed"],
        "benchmark": benchmark,
        "sft_model": r.get("sft_model"),
        "sft_machine": r.get("sft_machine"),
        "invocation": r.get("invocation"),
        f"mean_at_{k}": round(evals[final_step][f"mean@{k}"], 3),
        f"pass_at_{k}": round(evals[final_step][f"pass@{k}"], 3),
        f"best_mean_at_{k}": round(evals[best_step][f"mean@{k}"], 3),
        f"best_pass_at_{k}": round(max(v[f"pass@{k}"] for v in evals.values()), 3),
        "best_step": best_step,
        "final_step": final_step,
        "problems": evals[final_step]["problems"],
        "train_reward_last": last.get("reward"),
        "entropy_last": last.get("entropy"),
        "length_last": last.get("completions/mean_length"),
        "frac_masked_mean": mean_of_present([c.get("clip/frac_masked") for c in r["curves"]]),
    }


def mean_of_present(xs: Iterable[float | None]) -> float | None:
    """Mean of the values that are not None (None if there are none)."""
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def paired_difference(rows: list[dict], run: str, reference: str, key: str) -> dict | None:
    """Mean over pairs of ``key``(run) - ``key``(reference) on the same seed started from the same SFT model
    (``sft_model``; same data order) and its 95% Student-t interval; ``significant`` when the interval excludes 0.
    None with < 2 pairs: rows of one seed that started from different SFT models are never paired.
    The contrast {run: +1, reference: -1} of :func:`paired_contrast`."""
    if run == reference:
        return None
    return paired_contrast(rows, {run: 1.0, reference: -1.0}, key)


def paired_contrast(rows: list[dict], weights: dict[str, float], key: str) -> dict | None:
    """A within-seed contrast of runs: on every start (seed and SFT model, :func:`pairing_key`) that all runs of
    ``weights`` share, c = sum over runs of weight * ``key``(run); the mean of c over starts with its 95% Student-t
    interval (n - 1 degrees of freedom), two-sided p, ``significant`` when the interval excludes 0, the sd of c and
    the difference detectable with 80% power (:func:`detectable_difference`). Rows of one benchmark only. None with
    < 2 shared starts; a start where some run lacks ``key`` (None: e.g. a curve that did not log it) is left out.
    A difference of two runs is {run: +1, reference: -1}; an interaction of a 2 x 2 design
    (a1b1 - a1b0 - a0b1 + a0b0) is the one-sample t test of a repeated-measures ANOVA's interaction (t^2 = F)."""
    from scipy import stats

    benchmarks = {r.get("benchmark") for r in rows}
    if len(benchmarks) > 1:
        raise ValueError(f"paired statistics need the rows of one benchmark, got {sorted(map(str, benchmarks))}")
    by = {(r["method"], pairing_key(r)): r[key] for r in rows if r.get(key) is not None}  # a value not logged: no pair
    shared = set.intersection(*({s for name, s in by if name == run} for run in weights)) if weights else set()
    starts = sorted(shared, key=str)
    if len(starts) < 2:
        return None
    d = [sum(w * by[(run, start)] for run, w in weights.items()) for start in starts]
    n, mean, sd = len(d), statistics.fmean(d), statistics.stdev(d)
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    if sd > 0:
        p = float(2 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
    else:  # every start gives the same contrast: certain if it is not 0
        p = 0.0 if mean != 0 else 1.0
    return {
        "mean": mean,
        "low": mean - half,
        "high": mean + half,
        "n": n,
        "p": p,
        "significant": bool(half < abs(mean)),
        "sd": sd,
        "detectable_80": detectable_difference(sd, n),
    }


def paired_t_power(difference: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t test at level ``alpha`` with ``n`` pairs whose differences have standard
    deviation ``sd``, when the true mean difference is ``difference``: with df = n - 1, the noncentrality
    nc = difference sqrt(n) / sd and the critical value c = t_{1 - alpha/2, df},
    power = P(T' > c) + P(T' < -c) for T' ~ noncentral t(df, nc) (e.g. Cohen 1988, ch. 2)."""
    from scipy import stats

    if n < 2 or not sd > 0:
        raise ValueError(f"paired_t_power needs n >= 2 pairs and sd > 0, got n = {n}, sd = {sd}")
    df, nc = n - 1, difference * math.sqrt(n) / sd
    c = float(stats.t.ppf(1 - alpha / 2, df))
    # P(T' < -c) written as P(T'' > c) for T'' ~ noncentral t(df, -nc): the same number, and scipy 1.17's
    # nct.cdf returns NaN for it at df = 1 and nc ~ 8 where nct.sf does not
    return float(stats.nct.sf(c, df, nc) + stats.nct.sf(c, df, -nc))


def detectable_difference(sd: float, n: int, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest true mean difference that a two-sided paired t test (level ``alpha``, ``n`` pairs, standard
    deviation ``sd`` of the differences) detects with probability ``power``: the root in d >= 0 of
    :func:`paired_t_power` (d) = ``power``. With the observed ``sd`` plugged in it says how large a difference a
    "not significant" line of the table still leaves open (0 when every pair differs by the same amount)."""
    from scipy.optimize import brentq

    if not 0 < alpha < power < 1:
        raise ValueError(f"detectable_difference needs 0 < alpha < power < 1, got alpha = {alpha}, power = {power}")
    if n < 2:
        raise ValueError(f"detectable_difference needs n >= 2 pairs, got {n}")
    if sd == 0:
        return 0.0
    high = sd
    while paired_t_power(high, sd, n, alpha) < power:  # power rises with the difference: bracket the root
        high *= 2
    return float(brentq(lambda d: paired_t_power(d, sd, n, alpha) - power, 0.0, high, xtol=1e-12 * sd))


def seeds_needed(sd: float, difference: float, power: float = 0.8, alpha: float = 0.05) -> int:
    """The fewest seeds (pairs, >= 2) with which a two-sided paired t test at level ``alpha`` detects a true mean
    difference ``difference`` with probability >= ``power`` when the paired differences have standard deviation
    ``sd``: the smallest n with :func:`paired_t_power` (difference, sd, n) >= ``power`` (power rises with n)."""
    if not (sd > 0 and difference != 0):
        raise ValueError(
            f"seeds_needed needs sd > 0 and a nonzero difference, got sd = {sd}, difference = {difference}"
        )
    n = 2
    while paired_t_power(abs(difference), sd, n, alpha) < power:
        n += 1
    return n


def pooled_sd(differences: list[dict]) -> tuple[float, int] | None:
    """Pooled standard deviation of paired differences, each of :func:`paired_difference` (its ``sd`` over ``n``
    pairs): sqrt(sum (n_i - 1) sd_i^2 / sum (n_i - 1)), with its degrees of freedom sum (n_i - 1); one noise level
    for a table whose lines each rest on few seeds. None without differences."""
    df = sum(d["n"] - 1 for d in differences)
    if df == 0:
        return None
    return math.sqrt(sum((d["n"] - 1) * d["sd"] ** 2 for d in differences) / df), df


REFERENCES = ("clip", "atr")  # the table's reference rules: each line's paired difference against each of them


def holm_adjusted(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (Holm 1979, "A simple sequentially rejective multiple test
    procedure"), in their order: with the p-values sorted ascending p_(1) <= ... <= p_(m),
    adjusted p_(i) = max over j <= i of min(1, (m - j + 1) p_(j)). Rejecting where adjusted p < alpha keeps the
    family-wise error rate at alpha over the m tests."""
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def paired_against_references(
    rows: list[dict], runs: list[str], key: str, references: tuple[str, ...] = REFERENCES
) -> dict[str, dict[str, dict | None]]:
    """For each table line of ``runs`` (:func:`_units`; rows of one benchmark) and each of ``references``, the
    :func:`unit_minus_reference` difference, with ``p_holm``: its p-value adjusted by Holm over every difference
    of this table (:func:`holm_adjusted`), so ``p_holm < 0.05`` is significant for the table as a family."""
    table = {
        name: {ref: unit_minus_reference(unit, rows, ref, key) for ref in references}
        for name, unit in _units(rows, runs, start_labels(rows)).items()
    }
    tested = [d for by_ref in table.values() for d in by_ref.values() if d is not None]
    for d, p_holm in zip(tested, holm_adjusted([d["p"] for d in tested])):
        d["p_holm"] = p_holm
    return table


def unit_minus_reference(unit: list[dict], rows: list[dict], reference: str, key: str) -> dict | None:
    """:func:`paired_difference` of one table line's rows (``unit``: one run, one start) against every row of
    ``reference`` in ``rows``; pairs form only where the reference ran the same seed from the same SFT model."""
    return paired_difference(unit + [r for r in rows if r["method"] == reference], unit[0]["method"], reference, key)


def between_rule_noise(rows: list[dict], runs: list[str], k: int) -> dict | None:
    """How noisy a comparison of two GRPO rules is in this table (rows of one benchmark): the :func:`pooled_sd` of
    every paired Mean@k difference between ``runs`` (the SFT line left out: GRPO against its starting model is
    another spread) and the seeds :func:`seeds_needed` for 80% power at 2, 5 and 10 points. None without any
    difference of nonzero spread."""
    paired = paired_against_references(rows, [r for r in runs if r != "sft"], f"mean_at_{k}")
    pooled = pooled_sd([d for by_ref in paired.values() for d in by_ref.values() if d is not None and d["sd"] > 0])
    if pooled is None:
        return None
    sd, df = pooled
    return {"sd": sd, "df": df, "seeds_needed_80": {str(x): seeds_needed(sd, x) for x in (2, 5, 10)}}


def start_labels(rows: list[dict]) -> dict[str, str]:
    """SFT model id -> the letter of its *start* ("A", "B", ...), or "" for every id when the rows have one start.

    A start is the set of SFT models trained on one kind of machine: models with the same recorded
    ``sft_machine`` (:func:`machine_kind`) are one start, whichever invocation wrote their rows. Rows without a
    recorded machine (written before it was recorded) are grouped by invocation instead (the seeds of one machine),
    and groups that share a model id are joined. Letters follow the earliest invocation of each start. Rows without
    a recorded model (``sft_model`` None) count as one model."""
    parent: dict = {}

    def root(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    first_seen: dict = {}
    for r in sorted(rows, key=lambda r: str(r.get("invocation") or "")):
        first_seen.setdefault(r.get("sft_model"), str(r.get("invocation") or ""))
        # an invocation stamps the results it reads back too, which may have been trained elsewhere: it groups only
        # the rows whose machine was not recorded
        by = ("machine", r["sft_machine"]) if r.get("sft_machine") else ("invocation", r.get("invocation"))
        parent[root(r.get("sft_model"))] = root(by)
    groups: dict = {}
    for model in first_seen:
        groups.setdefault(root(model), []).append(model)
    if len(groups) == 1:
        return {model: "" for model in first_seen}
    ordered = sorted(groups.values(), key=lambda ids: min(first_seen[m] for m in ids))
    return {model: chr(ord("A") + i) for i, ids in enumerate(ordered) for model in ids}


def pairing_key(row: dict) -> tuple:
    """What a row is paired on: its seed and the SFT model it started from."""
    return row["seed"], row.get("sft_model")


def _of_start(rows: list[dict], labels: dict[str, str], letter: str) -> list[dict]:
    """The rows that started from an SFT model of start ``letter`` (:func:`start_labels`)."""
    return [r for r in rows if labels[r.get("sft_model")] == letter]


def display_name(row: dict, labels: dict[str, str]) -> str:
    """``method`` when the table has one start, else ``method [letter]`` (:func:`start_labels`)."""
    letter = labels.get(row.get("sft_model"), "")
    return f"{row['method']} [{letter}]" if letter else row["method"]


def sampling_label(benchmark: str) -> str:
    """How a benchmark of :data:`BENCHMARKS` samples, for a table: "T = 0.3", "T = 1" (shortest form, as the README
    writes it; the benchmark's name when it is not one of them)."""
    sampling = BENCHMARKS.get(benchmark, {})
    return f"T = {sampling['temperature']:g}" if "temperature" in sampling else benchmark


def markdown_tables(rows: list[dict], runs: list[str], k: int) -> str:
    """One :func:`markdown_table` per benchmark, each under its own heading, then which SFT models each start
    holds when there is more than one."""
    parts = []
    for benchmark, sampling in BENCHMARKS.items():
        mine = [r for r in rows if r["benchmark"] == benchmark]
        if mine:
            head = f"### {benchmark} ({sampling_label(benchmark)}, top-p {sampling['top_p']})"
            parts.append(f"{head}\n\n{markdown_table(mine, runs, k)}")
    labels = start_labels(rows)
    if any(labels.values()):
        lines = ["### Starts (the SFT models a row started from; only rows of one start are paired)", ""]
        for letter in sorted(set(labels.values())):
            of_start = _of_start(rows, labels, letter)
            models = sorted({(r["seed"], r.get("sft_model")) for r in of_start})
            invocations = sorted({str(r.get("invocation")) for r in of_start})
            machines = sorted({r["sft_machine"] for r in of_start if r.get("sft_machine")})
            listed = ", ".join(f"seed {seed}: {model}" for seed, model in models)
            trained_on = f"trained on: {'; '.join(machines)}; " if machines else ""
            lines.append(f"- **{letter}**: {listed} ({trained_on}written by: {'; '.join(invocations)})")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def masks_tokens(run: str) -> bool:
    """Whether ``run``'s method masks or clips tokens at all: a soft gate (sapo) or no clipping has no masked
    fraction to report (its logged ``clip/frac_masked`` is 0 by construction, not a measurement)."""
    from atr_theory.methods import get_method

    spec = CPU_RUNS.get(run)
    if spec is None:  # "sft": no GRPO step
        return False
    return spec.get("form", get_method(spec["method"]).default_form) not in ("soft", "none")


def difference_cell(d: dict, places: int = 1) -> str:
    """A paired difference as a table cell: "mean [low, high]" with ``places`` decimals, then " *" where the 95%
    interval excludes 0 and " †" where its Holm-adjusted p (``p_holm``) is < 0.05."""
    mark = (" *" if d["significant"] else "") + (" †" if d["p_holm"] < 0.05 else "")
    return f"{d['mean']:+.{places}f} [{d['low']:+.{places}f}, {d['high']:+.{places}f}]{mark}"


def markdown_table(rows: list[dict], runs: list[str], k: int) -> str:
    """Means (and standard deviations) over seeds, with paired differences against clip and atr (rows of one
    benchmark); one line per run and start (:func:`start_labels`), paired only within a start ("other start"
    where the reference ran those seeds from other SFT models only; "*" where the 95% interval excludes 0, "†"
    where Holm's adjustment over the table's differences keeps p < 0.05: :func:`paired_against_references`); the
    masked fraction is "-" for a run that masks nothing by construction (:func:`masks_tokens`)."""
    key, pkey, bkey = f"mean_at_{k}", f"pass_at_{k}", f"best_mean_at_{k}"
    labels = start_labels(rows)

    units = _units(rows, ["sft", *runs], labels)
    paired = paired_against_references(rows, ["sft", *runs], key)

    def fmt(name, ref):
        mine, theirs = units[name], [r for r in rows if r["method"] == ref]
        d = paired[name][ref]
        if d is None:
            same_seed = {r["seed"] for r in mine} & {r["seed"] for r in theirs}
            same_start = {pairing_key(r) for r in mine} & {pairing_key(r) for r in theirs}
            return "other start" if same_seed and not same_start and mine[0]["method"] != ref else "-"
        return difference_cell(d)

    def detectable(name):
        found = [paired[name][ref] for ref in REFERENCES]
        return " / ".join("-" if d is None else f"{d['detectable_80']:.1f}" for d in found)

    lines = [
        f"| run | seeds | Mean@{k} final (best) | Pass@{k} final | "
        + "".join(f"Mean@{k}: run - {ref} [95% CI] | " for ref in REFERENCES)
        + f"detectable vs {' / '.join(REFERENCES)} | masked/clipped tokens |",
        "|---|---|---|---|" + "---|" * len(REFERENCES) + "---|---|",
    ]
    for name, mine in units.items():
        m, p, b = (mean_of_present([r[x] for r in mine]) for x in (key, pkey, bkey))
        sd = statistics.stdev([r[key] for r in mine]) if len(mine) > 1 else 0.0
        fm = mean_of_present([r["frac_masked_mean"] for r in mine]) if masks_tokens(mine[0]["method"]) else None
        lines.append(
            f"| {name} | {len(mine)} | {m:.1f} ± {sd:.1f} ({b:.1f}) | {p:.1f} | "
            + "".join(f"{fmt(name, ref)} | " for ref in REFERENCES)
            + f"{detectable(name)} | "
            + ("-" if fm is None else f"{100 * fm:.2f}%")
            + " |"
        )
    tested = [d for by_ref in paired.values() for d in by_ref.values() if d is not None]
    lines += [
        "",
        f"{len(tested)} paired differences in this table. *: the 95% t interval excludes 0 (one test alone; about "
        f"{len(tested) / 20:.1f} such are expected by chance when no method differs); †: Holm-adjusted p < 0.05 over "
        f"the {len(tested)} (significant for the table as a whole). Detectable: the true difference a paired t test "
        "over these seeds would find (5% level, one test alone) with 80% power, taking the line's observed spread of "
        "the differences as the true one (`atr_llm.cpu_table.detectable_difference`); a difference that is not "
        "significant may still be this large.",
    ]
    noise = between_rule_noise(rows, runs, k)
    if noise:
        needed = ", ".join(f"{x} points: {n}" for x, n in noise["seeds_needed_80"].items())
        lines[-1] += (
            f" Pooled over the differences between rules, a paired difference has sd {noise['sd']:.1f} (sum of n - 1: "
            f"{noise['df']}, fewer independent, as lines share runs; a line's own sd rests on its n - 1 alone); seeds "
            f"needed for 80% power at that spread: {needed}."
        )
    return "\n".join(lines) + "\n"


def _by_benchmark_and_start(rows: list[dict]):
    """(benchmark, start letter, the rows of that benchmark and start) for every benchmark of :data:`BENCHMARKS` and
    start of ``rows`` (:func:`start_labels`), in that order: what is paired within."""
    labels = start_labels(rows)
    for benchmark in BENCHMARKS:
        for letter in sorted(set(labels.values())):
            yield benchmark, letter, [r for r in _of_start(rows, labels, letter) if r["benchmark"] == benchmark]


def delta_ablation(rows: list[dict], k: int) -> list[dict]:
    """The ATR delta ablation (the paper's Fig. 4 at this scale): per benchmark and start, one point per delta
    (``atr`` is delta 0.07) with Mean@k over seeds and its paired difference to delta 0.07 on the same SFT models
    (:func:`paired_difference`); only starts where atr and at least one other delta ran."""
    key = f"mean_at_{k}"
    points = []
    for benchmark, letter, mine in _by_benchmark_and_start(rows):
        ran = [run for run in ABLATION_DELTAS if any(r["method"] == run for r in mine)]
        if "atr" not in ran or len(ran) < 2:
            continue
        for run in sorted(ran, key=ABLATION_DELTAS.get):
            scores = [r[key] for r in mine if r["method"] == run]
            d = paired_difference(mine, run, "atr", key)
            points.append(
                {
                    "benchmark": benchmark,
                    "start": letter,
                    "delta": ABLATION_DELTAS[run],
                    "run": run,
                    "seeds": len(scores),
                    key: statistics.fmean(scores),
                    f"sd_{key}": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                    "minus_delta0.07": None if d is None else d["mean"],
                    "ci_low": None if d is None else d["low"],
                    "ci_high": None if d is None else d["high"],
                }
            )
    return points


def delta_optimum(rows: list[dict], k: int) -> list[dict]:
    """Is ATR's delta 0.07 the best of the deltas that ran (the paper's Fig. 4: an interior optimum near 0.07)?
    Per benchmark and start where atr and at least two other deltas of :data:`DELTA_ABLATION` ran on shared seeds:
    for each other delta, the paired difference d = Mean@k(0.07) - Mean@k(delta) (:func:`paired_difference`) with
    its one-sided p for d > 0 (from the paired t: p/2 when d > 0, else 1 - p/2) and the two-sided p Holm-adjusted
    over these comparisons (:func:`holm_adjusted`); ``iut_p``, the intersection-union p of "0.07 is above every
    other delta" = the largest of the one-sided p (Berger 1982, Technometrics 24: the claim needs every comparison,
    so no multiplicity correction, and it holds at level alpha when iut_p < alpha); and, when deltas below and above
    0.07 both ran, ``peak``: the paired contrast 0.07 - (smallest + largest delta) / 2 (:func:`paired_contrast`).
    ``best_delta``: the delta with the highest mean over seeds (descriptive)."""
    key = f"mean_at_{k}"
    deltas, at_atr = ABLATION_DELTAS, ABLATION_DELTAS["atr"]
    out = []
    for benchmark, letter, mine in _by_benchmark_and_start(rows):
        against = {run: paired_difference(mine, "atr", run, key) for run in DELTA_ABLATION}
        against = {run: d for run, d in sorted(against.items(), key=lambda kv: deltas[kv[0]]) if d is not None}
        if len(against) < 2:
            continue
        comparisons = [
            {
                "delta": deltas[run],
                "run": run,
                "n": d["n"],
                "minus_delta": d["mean"],
                "low": d["low"],
                "high": d["high"],
                "p": d["p"],
                "p_one_sided": d["p"] / 2 if d["mean"] > 0 else 1 - d["p"] / 2,
            }
            for run, d in against.items()
        ]
        for c, p_holm in zip(comparisons, holm_adjusted([c["p"] for c in comparisons])):
            c["p_holm"] = p_holm
        below = [run for run in against if deltas[run] < at_atr]
        above = [run for run in against if deltas[run] > at_atr]
        peak = paired_contrast(mine, {"atr": 1.0, below[0]: -0.5, above[-1]: -0.5}, key) if below and above else None
        means = {deltas[run]: mean_of_present(r[key] for r in mine if r["method"] == run) for run in ["atr", *against]}
        out.append(
            {
                "benchmark": benchmark,
                "start": letter,
                "comparisons": comparisons,
                "iut_p": max(c["p_one_sided"] for c in comparisons),
                "peak": None
                if peak is None
                else {"low_delta": deltas[below[0]], "high_delta": deltas[above[-1]], **peak},
                "best_delta": max(means, key=means.get),
            }
        )
    return out


def markdown_delta_optimum(optima: list[dict], k: int) -> str:
    """:func:`delta_optimum` as a short section ("" when there is nothing to show)."""
    if not optima:
        return ""
    lines = [
        f"### Is delta 0.07 the best delta? (the paper's Fig. 4; `delta_optimum`, Mean@{k})",
        "",
    ]
    for o in optima:
        where = sampling_label(o["benchmark"])
        start = f", start {o['start']}" if o["start"] else ""
        cells = "; ".join(
            f"- {c['delta']:g}: {c['minus_delta']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}] (Holm {_p_value(c['p_holm'])})"
            for c in o["comparisons"]
        )
        peak = o["peak"]
        peak_text = (
            ""
            if peak is None
            else f"; 0.07 - mean of {peak['low_delta']:g} and {peak['high_delta']:g}: {peak['mean']:+.1f} "
            f"[{peak['low']:+.1f}, {peak['high']:+.1f}], p {_p_value(peak['p'])}"
        )
        lines.append(
            f"- {where}{start}: 0.07 {cells}; all above at once: intersection-union p {_p_value(o['iut_p'])}"
            f"{peak_text}; highest mean at delta {o['best_delta']:g}"
        )
    lines += [
        "",
        "0.07 - delta paired over seeds with its 95% t interval; Holm over this line's comparisons; the "
        "intersection-union p (the largest one-sided p of 0.07 - delta > 0) is below 0.05 only when 0.07 beats every "
        "other delta; peak: 0.07 against the mean of the smallest and largest delta, paired.",
    ]
    return "\n".join(lines) + "\n"


FORMS_2X2_EFFECTS: dict[str, dict[str, float]] = {
    "range": {"atr": 0.5, "atr-min": 0.5, "clip": -0.5, "clip-mask": -0.5},
    "form": {"atr": 0.5, "clip-mask": 0.5, "atr-min": -0.5, "clip": -0.5},
    "interaction": {"atr": 1.0, "atr-min": -1.0, "clip-mask": -1.0, "clip": 1.0},
}
"""Eq. 5's two forms crossed with two ratio ranges (clip's [0.8, 1.2], atr's [0.671, 1.422] at delta = 0.07):
``range``: atr's range minus clip's, averaged over the two forms; ``form``: the mask form minus PPO's min form,
averaged over the two ranges; ``interaction``: the form's effect at atr's range minus that at clip's
((atr - atr-min) - (clip-mask - clip)). Contrast weights over the four runs, for :func:`paired_contrast`."""


def forms_factorial(rows: list[dict], k: int) -> dict[str, dict[str, dict]] | None:
    """Per benchmark, the :data:`FORMS_2X2_EFFECTS` of Mean@k as :func:`paired_contrast` s over the seeds (and SFT
    models) on which all four of clip, clip-mask, atr, atr-min ran, each with ``p_holm``: Holm over the three
    (:func:`holm_adjusted`). None unless some benchmark has >= 2 such seeds."""
    key = f"mean_at_{k}"
    out = {}
    for benchmark in BENCHMARKS:
        mine = [r for r in rows if r["benchmark"] == benchmark]
        effects = {name: paired_contrast(mine, weights, key) for name, weights in FORMS_2X2_EFFECTS.items()}
        if any(e is None for e in effects.values()):
            continue
        for e, p_holm in zip(effects.values(), holm_adjusted([e["p"] for e in effects.values()])):
            e["p_holm"] = p_holm
        out[benchmark] = effects
    return out or None


def _p_value(p: float) -> str:
    """A p-value for a table: three decimals, or "< 0.001"."""
    return f"{p:.3f}" if p >= 0.001 else "< 0.001"


def markdown_forms_factorial(factorial: dict[str, dict[str, dict]], k: int) -> str:
    """The :func:`forms_factorial` effects as one Markdown table (a line per benchmark and effect)."""
    lines = [
        "### The forms as a 2 x 2: ratio range x form of Eq. 5 (clip, clip-mask, atr-min, atr)",
        "",
        f"| benchmark | effect on Mean@{k} | seeds | mean [95% CI] | p | p (Holm over 3) | detectable (80%) |",
        "|---|---|---|---|---|---|---|",
    ]
    for benchmark, effects in factorial.items():
        for name, e in effects.items():
            lines.append(
                f"| {benchmark} | {name} | {e['n']} | {e['mean']:+.1f} [{e['low']:+.1f}, {e['high']:+.1f}] | "
                f"{_p_value(e['p'])} | {_p_value(e['p_holm'])} | {e['detectable_80']:.1f} |"
            )
    lines += [
        "",
        "range: atr's [0.671, 1.422] minus clip's [0.8, 1.2], averaged over the two forms; form: the mask form "
        "(freeze outside the range whatever the advantage's sign) minus PPO's min form, averaged over the two ranges; "
        "interaction: (atr - atr-min) - (clip-mask - clip), the form's effect at atr's range minus at clip's. Each is "
        "a within-seed contrast with a paired t interval (`atr_llm.cpu_table.paired_contrast`).",
    ]
    return "\n".join(lines) + "\n"


TAIL_STEPS = 100
TAIL_KEYS = {
    "reward": "reward",
    "entropy": "entropy",
    "length": "completions/mean_length",
    # the largest token ratio w = pi / pi_old of a loss call, averaged over the step's calls: how far the rule let
    # ratios go in fact, whatever its nominal bound (kl1 has none above; sapo none at all)
    "ratio_max": "clip/ratio_max",
}
"""Where a run ends, in its training curves: name -> logged key, averaged over the last :data:`TAIL_STEPS` steps."""


def curve_tails(rows: list[dict], curve_sets: list[dict], last_steps: int = TAIL_STEPS) -> list[dict]:
    """One row per GRPO run, seed and SFT model of ``curve_sets`` (``{"run", "seed", "sft_model", "curves"}``) that
    has a table row in ``rows``: for each of :data:`TAIL_KEYS` (``<name>_tail``) the mean over its logged points with
    step > final step - ``last_steps`` (less noisy than the last point alone), with the table row's seed, SFT model,
    machine and invocation, so that :func:`paired_against_references` pairs and groups it as the table does."""
    identity = {(r["method"], *pairing_key(r)): r for r in rows}
    tails = []
    for c in sorted(curve_sets, key=lambda c: (c["run"], c["seed"], str(c.get("sft_model")))):
        row = identity.get((c["run"], c["seed"], c.get("sft_model")))
        if row is None or not c["curves"]:
            continue
        end = max(point["step"] for point in c["curves"])
        tail = [point for point in c["curves"] if point["step"] > end - last_steps]
        tails.append(
            {key: row.get(key) for key in ("method", "seed", "sft_model", "sft_machine", "invocation")}
            | {"final_step": end, "points": len(tail)}
            | {
                f"{name}_tail": mean_of_present(point.get(logged) for point in tail)
                for name, logged in TAIL_KEYS.items()
            }
        )
    return tails


def curve_tail_differences(tails: list[dict], runs: list[str]) -> dict[str, dict]:
    """Per paired quantity ("reward", "entropy"): :func:`paired_against_references` of its ``<name>_tail`` over the
    :func:`curve_tails` rows (Holm over that quantity's differences)."""
    return {name: paired_against_references(tails, runs, f"{name}_tail") for name in ("reward", "entropy")}


ASSOCIATED_TAILS = ("ratio_max", "entropy", "reward")
"""The curve tails :func:`outcome_association` relates to the final Mean@k."""


def outcome_association(
    rows: list[dict], tails: list[dict], k: int, names: tuple[str, ...] = ASSOCIATED_TAILS
) -> dict[str, dict[str, dict | None]]:
    """Per benchmark and per curve quantity ``name`` of ``names``: how a GRPO run's final Mean@k moves with where its
    training curve ends (``<name>_tail`` of :func:`curve_tails`), within starts. Over the runs of every rule that have
    both, x = the tail and y = ``mean_at_<k>``, each minus the mean of its start (seed and SFT model; starts with one
    run are left out): the least-squares slope b = sum(x y) / sum(x^2), its 95% t interval and two-sided p with
    n - g - 1 degrees of freedom (n runs, g starts), and Pearson's r of the centred values -- the slope, standard
    error and p of an OLS of y on x with one indicator per start (a fixed-effects regression). None where fewer than
    three degrees of freedom remain or x does not vary. A run whose (x, y) equals another run's on the same start
    counts once (``copies`` says how many were dropped on the starts kept): the same tail to the last bit and the same Mean@k is the
    same training run under two names (the dual clip where its floor never acted, :func:`where_curves_part`), one
    observation, not two.

    Exploratory: the rules were not assigned a ratio, runs of one start share its SFT model, and a quantity chosen
    after looking at the table has no multiple-testing protection; it says which curve quantity tracks the outcome
    across rules, not what causes it."""
    from scipy import stats

    tail_of = {(t["method"], *pairing_key(t)): t for t in tails}
    out: dict[str, dict[str, dict | None]] = {}
    for benchmark in sorted({r["benchmark"] for r in rows}):
        out[benchmark] = {}
        for name in names:
            groups: dict[tuple, list[tuple[float, float]]] = {}
            copies_in: dict[tuple, int] = {}
            for r in rows:
                t = tail_of.get((r["method"], *pairing_key(r)))
                if r["benchmark"] != benchmark or t is None:
                    continue
                x, y = t.get(f"{name}_tail"), r.get(f"mean_at_{k}")
                if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
                    pairs = groups.setdefault(pairing_key(r), [])
                    if (x, y) in pairs:
                        copies_in[pairing_key(r)] = copies_in.get(pairing_key(r), 0) + 1
                    else:
                        pairs.append((x, y))
            centred = []
            for pairs in (g for g in groups.values() if len(g) > 1):
                mx, my = statistics.fmean(p[0] for p in pairs), statistics.fmean(p[1] for p in pairs)
                centred += [(x - mx, y - my) for x, y in pairs]
            starts = sum(len(g) > 1 for g in groups.values())
            copies = sum(n for start, n in copies_in.items() if len(groups[start]) > 1)  # of the starts kept
            df = len(centred) - starts - 1
            sxx = sum(x * x for x, _ in centred)
            if df < 3 or sxx == 0:
                out[benchmark][name] = None
                continue
            sxy, syy = sum(x * y for x, y in centred), sum(y * y for _, y in centred)
            slope = sxy / sxx
            se = math.sqrt(max(syy - slope * sxy, 0.0) / df / sxx)
            half = stats.t.ppf(0.975, df) * se
            p = 2 * stats.t.sf(abs(slope / se), df) if se > 0 else 0.0
            out[benchmark][name] = {
                "n": len(centred),
                "copies": copies,
                "starts": starts,
                "df": df,
                "slope": slope,
                "low": slope - half,
                "high": slope + half,
                "p": p,
                "r": sxy / math.sqrt(sxx * syy) if syy > 0 else 0.0,
            }
    return out


def _same_value(a, b) -> bool:
    """Equal, or both NaN (a logged NaN is the same value twice)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def where_curves_part(curve_sets: list[dict], runs: list[str], reference: str = "clip") -> dict[str, list[dict]]:
    """Per run of ``runs`` other than ``reference``, one entry per start (seed and SFT model) it shares with
    ``reference``: ``{"seed", "sft_model", "parts_at"}``, where ``parts_at`` is the first logged step at which any
    value of :data:`CURVE_KEYS` differs from ``reference``'s, or None when every logged point is equal bit for bit
    (the same steps, every value). Training on one machine kind is deterministic (a rerun reproduces its curves), and
    two rules that give the same loss and gradient on every batch make the same updates, so None says the rule never
    changed an update on that start: e.g. the dual clip's floor c A (Ye et al. 2020) where no ratio of an A < 0
    token passed c. Runs without a shared start are left out."""
    by = {(c["run"], c["seed"], c.get("sft_model")): c["curves"] for c in curve_sets}
    parted: dict[str, list[dict]] = {}
    for run in runs:
        if run == reference:
            continue
        for run_, seed, model in sorted((k for k in by if k[0] == run and (reference, k[1], k[2]) in by), key=str):
            mine = {p["step"]: p for p in by[run_, seed, model]}
            theirs = {p["step"]: p for p in by[reference, seed, model]}
            steps = sorted(set(mine) | set(theirs))
            differ = [
                t
                for t in steps
                if t not in mine
                or t not in theirs
                or any(not _same_value(mine[t].get(k), theirs[t].get(k)) for k in CURVE_KEYS)
            ]
            parted.setdefault(run, []).append({"seed": seed, "sft_model": model, "parts_at": min(differ, default=None)})
    return parted


def markdown_curves_equal(
    parted: dict[str, list[dict]], labels: dict[str, str] | None = None, reference: str = "clip"
) -> str:
    """One line per run of :func:`where_curves_part` that equals ``reference`` on at least one start: on how many
    starts (which seeds, with their start letter from ``labels`` where the table has several:
    :func:`start_labels`) its curves are ``reference``'s bit for bit, and at which step they part on the others.
    "" when no run equals ``reference`` anywhere."""
    labels = labels or {}

    def names(starts: list[dict]) -> str:
        shown = [
            f"{s['seed']} [{labels[s['sft_model']]}]" if labels.get(s["sft_model"]) else str(s["seed"]) for s in starts
        ]
        return f"seed{'s' * (len(shown) > 1)} {', '.join(shown)}"

    lines = []
    for run, starts in parted.items():
        same = [s for s in starts if s["parts_at"] is None]
        if not same:
            continue
        by_step: dict[int, list[dict]] = {}
        for s in starts:
            if s["parts_at"] is not None:
                by_step.setdefault(s["parts_at"], []).append(s)
        elsewhere = "; ".join(f"step {t} ({names(v)})" for t, v in sorted(by_step.items()))
        lines.append(
            f"- {run}: every logged value equals {reference}'s on {len(same)} of {len(starts)} starts ({names(same)}):"
            " the rule never changed an update there"
            + (f"; elsewhere the curves part at {elsewhere}" if elsewhere else "")
        )
    if not lines:
        return ""
    return (
        f"Runs whose training curves equal {reference}'s bit for bit (`where_curves_part`; training on one machine kind"
        " is deterministic, so equal curves mean equal updates; where curves part at logged step t, the first changed"
        " update came no later than step t):\n\n" + "\n".join(lines) + "\n"
    )


def markdown_curve_tails(
    tails: list[dict], runs: list[str], last_steps: int = TAIL_STEPS, paired: dict[str, dict] | None = None
) -> str:
    """Training reward, entropy and completion length where the runs end (:func:`curve_tails`), mean over seeds,
    with the paired differences of reward and entropy against clip and atr (``paired``, by default
    :func:`curve_tail_differences`; * and † as in :func:`markdown_table`, Holm over each column family: one
    quantity's differences in this table)."""
    labels = start_labels(tails)
    units = _units(tails, runs, labels)
    paired = curve_tail_differences(tails, runs) if paired is None else paired
    places = {"reward": 3, "entropy": 4, "length": 1, "ratio_max": 3}

    def fmt(name, quantity, ref):
        d = paired[quantity][name][ref]
        return "-" if d is None else difference_cell(d, places[quantity])

    pairs = [(quantity, ref) for ref in REFERENCES for quantity in ("reward", "entropy")]
    lines = [
        f"### Where the runs end: training curves over the last {last_steps} steps",
        "",
        "| run | seeds | reward (T = 1) | entropy (nats) | length (tokens) | max ratio | "
        + " | ".join(f"{quantity}: run - {ref} [95% CI]" for quantity, ref in pairs)
        + " |",
        "|---|---|---|---|---|---|" + "---|" * len(pairs),
    ]
    for name, mine in units.items():
        means = {q: mean_of_present(r[f"{q}_tail"] for r in mine) for q in places}
        lines.append(
            f"| {name} | {len(mine)} | "
            + "".join("- | " if means[q] is None else f"{means[q]:.{places[q]}f} | " for q in places)
            + " | ".join(fmt(name, quantity, ref) for quantity, ref in pairs)
            + " |"
        )
    lines += [
        "",
        f"Each run's mean over its logged points in its last {last_steps} steps, then the mean over seeds; max ratio: "
        "the largest token ratio pi / pi_old of a loss call (`clip/ratio_max`), how far the rule let ratios go in "
        "fact. Differences paired over seeds from the same SFT model. *: the 95% t interval excludes 0; †: "
        "Holm-adjusted p < 0.05 over the column family (one quantity's differences in this table).",
    ]
    return "\n".join(lines) + "\n"


def markdown_outcome_association(association: dict[str, dict[str, dict | None]], k: int) -> str:
    """:func:`outcome_association` as one line per benchmark and quantity ("" when there is nothing to show)."""
    lines = []
    for benchmark, by_name in association.items():
        where = sampling_label(benchmark)
        for name, a in by_name.items():
            if a is not None:
                lines.append(
                    f"- {where}, {name}: r = {a['r']:+.2f}, slope {a['slope']:+.3g} points per unit "
                    f"[{a['low']:+.3g}, {a['high']:+.3g}], p {_p_value(a['p'])} ({a['n']} runs, {a['starts']} starts"
                    + (
                        f"; {a['copies']} runs equal to another on their start counted once)"
                        if a.get("copies")
                        else ")"
                    )
                )
    if not lines:
        return ""
    return (
        f"Final Mean@{k} against where the runs end, within starts (`outcome_association`: both centred on their "
        "start's mean, a fixed-effects regression over the runs of every rule; exploratory -- rules were not assigned "
        "these quantities, and no correction for choosing among them):\n\n" + "\n".join(lines) + "\n"
    )


def grpo_minus_own_sft(rows: list[dict], k: int) -> dict[str, dict]:
    """Per benchmark: each GRPO row's final Mean@k minus that of the SFT model it started from (same seed, same
    ``sft_model``), how many runs raise / lower / keep it, and every change by run (:func:`display_name`) and seed.
    A GRPO row whose SFT model has no ``sft`` row in ``rows`` is left out (``unmatched`` counts them)."""
    key = f"mean_at_{k}"
    labels = start_labels(rows)
    out = {}
    for benchmark in BENCHMARKS:
        mine = [r for r in rows if r["benchmark"] == benchmark]
        sft = {pairing_key(r): r[key] for r in mine if r["method"] == "sft"}
        grpo = [r for r in mine if r["method"] != "sft"]
        changes = [
            {"run": display_name(r, labels), "seed": r["seed"], "change": r[key] - sft[pairing_key(r)]}
            for r in grpo
            if pairing_key(r) in sft
        ]
        out[benchmark] = {
            "runs": len(changes),
            "raised": sum(c["change"] > 0 for c in changes),
            "lowered": sum(c["change"] < 0 for c in changes),
            "unchanged": sum(c["change"] == 0 for c in changes),
            "unmatched": len(grpo) - len(changes),
            "mean_change": mean_of_present(c["change"] for c in changes),
            "changes": sorted(changes, key=lambda c: c["change"]),
        }
    return out


def plot_delta_ablation(points: list[dict], k: int, path: Path) -> None:
    """Mean@k against delta per benchmark (log x), with the paired 95% interval of each delta's difference to
    0.07 drawn around delta 0.07's mean (:func:`delta_ablation`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benchmarks = list(dict.fromkeys(p["benchmark"] for p in points))
    fig, axes = plt.subplots(1, len(benchmarks), figsize=(5.5 * len(benchmarks), 4), squeeze=False)
    for ax, benchmark in zip(axes[0], benchmarks):
        for start in sorted({p["start"] for p in points if p["benchmark"] == benchmark}):
            mine = [p for p in points if p["benchmark"] == benchmark and p["start"] == start]
            x = [p["delta"] for p in mine]
            ax.errorbar(
                x,
                [p[f"mean_at_{k}"] for p in mine],
                yerr=[p[f"sd_mean_at_{k}"] for p in mine],
                marker="o",
                capsize=3,
                label=f"start {start}: mean +- sd over seeds" if start else "mean +- sd over seeds",
            )
            ref = next(p[f"mean_at_{k}"] for p in mine if p["run"] == "atr")
            paired = [p for p in mine if p["ci_low"] is not None]
            ax.vlines(
                [p["delta"] for p in paired],
                [ref + p["ci_low"] for p in paired],
                [ref + p["ci_high"] for p in paired],
                colors="gray",
                lw=6,
                alpha=0.35,
                label="0.07's mean + paired 95% CI of the difference",
            )
        ax.set_xscale("log")
        deltas = sorted({p["delta"] for p in points})
        ax.set_xticks(deltas, [f"{d:g}" for d in deltas])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylim(0, 100)  # a percentage: an interval of two seeds can reach past it
        ax.set_xlabel("delta")
        ax.set_ylabel(f"held-out Mean@{k} (%)")
        ax.set_title(benchmark)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_curves(results: list[dict], runs: list[str], path: Path) -> None:
    """Training reward, entropy and completion length against the step, mean over seeds (Fig. 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("reward", "training reward (T = 1)"), ("entropy", "entropy (nats)"), ("completions/mean_length", "length")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for run in runs:
        curves = [r["curves"] for r in results if r["run"] == run and r["curves"]]
        if not curves:
            continue
        steps = [c["step"] for c in curves[0]]
        for ax, (key, label) in zip(axes, keys):
            ys = [mean_of_present([cur[i].get(key) for cur in curves if i < len(cur)]) for i in range(len(steps))]
            ax.plot(steps, ys, label=run, lw=2.2 if run == "atr" else 1.2)
            ax.set_xlabel("step")
            ax.set_title(label)
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


_PROTOCOL_KEYS = (
    "sft_steps",
    "max_steps",
    "save_steps",
    "test_problems",
    "samples",
    "task",
    "base_config",
    "benchmarks",
    "learning_rate",
)
"""Settings that must agree for two invocations' rows to share one table (everything but runs, seeds, device)."""


def previous_outputs(
    out: Path, settings: dict, fresh: set[tuple[str, int, str | None]]
) -> tuple[list[dict], list[dict], str]:
    """The rows and training curves already written into ``out`` by an earlier invocation with the same protocol
    (:data:`_PROTOCOL_KEYS`), for the (run, seed, SFT model) triples that are not in ``fresh``; so the table
    accumulates over invocations (and sessions whose ``--runs-dir`` is gone) while a re-run triple replaces its
    old rows, and a run of the same seed from another SFT model (another machine kind) is kept beside it.

    Returns ``(rows, curve_sets, why)``: ``curve_sets`` are ``{"run", "seed", "sft_model", "curves"}`` dicts;
    ``why`` says what was kept or, when nothing is, why (no earlier output, or a different protocol, named)."""
    summary_path, curves_path = out / "cpu_llm_table.json", out / "cpu_llm_curves.csv"
    if not summary_path.exists():
        return [], [], "no earlier table in " + str(out)
    before = json.loads(summary_path.read_text())
    differ = protocol_differences(before.get("settings", {}), settings)
    if differ:
        return [], [], f"earlier table in {out} not kept: its settings differ in {differ}"
    rows = [r for r in before["rows"] if (r["method"], *pairing_key(r)) not in fresh]
    kept = {(r["method"], *pairing_key(r)) for r in rows}
    curves: dict[tuple[str, int, str | None], list[dict]] = {}
    if curves_path.exists():
        with curves_path.open(newline="") as f:
            for point in csv.DictReader(f):
                triple = (point["method"], int(point["seed"]), point.get("sft_model") or None)
                if triple in kept:
                    curves.setdefault(triple, []).append({k: _number_or_none(point[k]) for k in CURVE_KEYS})
    curve_sets = [{"run": run, "seed": seed, "sft_model": m, "curves": c} for (run, seed, m), c in curves.items()]
    return rows, curve_sets, f"kept {len(kept)} (run, seed, SFT model) triples of the earlier table in {out}"


def read_table(out: Path | str) -> tuple[dict, list[dict], list[dict]]:
    """A written table's ``(summary, rows, curve_sets)``: its ``cpu_llm_table.json`` and, through
    :func:`previous_outputs`, every row and training curve it holds. Raises when ``out`` has no table."""
    out = Path(out)
    summary_path = out / "cpu_llm_table.json"
    if not summary_path.exists():
        raise FileNotFoundError(f"no cpu table in {out}: {summary_path} is missing")
    summary = json.loads(summary_path.read_text())
    rows, curve_sets, _ = previous_outputs(out, summary["settings"], set())
    return summary, rows, curve_sets


def protocol_differences(settings: dict, other: dict) -> list[str]:
    """The :data:`_PROTOCOL_KEYS` in which two tables' settings differ: rows of tables that differ in none of them
    were trained and evaluated the same way, and may be compared (or pooled) across the tables."""
    return [key for key in _PROTOCOL_KEYS if settings.get(key) != other.get(key)]


def read_tables_of_one_protocol(
    first: Path | str, second: Path | str
) -> tuple[tuple[dict, list[dict], list[dict]], tuple[dict, list[dict], list[dict]]]:
    """:func:`read_table` of two tables whose rows may be compared or pooled: raises when their settings differ in a
    :data:`_PROTOCOL_KEYS` entry (:func:`protocol_differences`), naming the entries."""
    a, b = read_table(first), read_table(second)
    differ = protocol_differences(a[0]["settings"], b[0]["settings"])
    if differ:
        raise ValueError(f"{first} and {second} were written with different protocols: they differ in {differ}")
    return a, b


def _number_or_none(text: str) -> float | int | None:
    """A CSV cell back to the number ``csv.DictWriter`` wrote (``""`` was None)."""
    if text == "":
        return None
    value = float(text)
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def _table_order(runs: set[str]) -> list[str]:
    """Runs in the order of :data:`CPU_RUNS` (Table 2, Table 3, the ablation), unknown names last."""
    known = [r for r in CPU_RUNS if r in runs]
    return known + sorted(runs - set(known))


def write_outputs(
    results: list[dict], settings: dict, out: Path, keep_previous: bool = True, versions: dict | None = None
) -> dict:
    """Write the CSV / Markdown / JSON / curves of :func:`main` into ``out``; with ``keep_previous`` the rows of
    earlier invocations with the same protocol stay (:func:`previous_outputs`), and the table covers all of them.
    ``versions``: the library versions to record (default: this process's, :func:`_versions`)."""
    k = settings["samples"]
    fresh = {(r["run"], r["seed"], r.get("sft_model")) for r in results}
    old_rows, old_curves, why = previous_outputs(out, settings, fresh) if keep_previous else ([], [], "")
    if why:
        print(why)
    rows = old_rows + table_rows(results, k)
    curve_sets = old_curves + [
        {"run": r["run"], "seed": r["seed"], "sft_model": r.get("sft_model"), "curves": r["curves"]} for r in results
    ]
    runs = _table_order({r["method"] for r in rows} - {"sft"})
    labels = start_labels(rows)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "cpu_llm_table.csv").open("w", newline="") as f:
        # every row's keys: rows kept from an older table may lack a newer column (sft_machine), left empty there
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(key for r in rows for key in r)))
        w.writeheader()
        w.writerows(sorted(rows, key=lambda r: (r["method"], r["seed"], r["benchmark"], str(r.get("sft_model")))))
    with (out / "cpu_llm_curves.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["method", "seed", "sft_model", *CURVE_KEYS])
        w.writeheader()
        for r in sorted(curve_sets, key=lambda r: (r["run"], r["seed"], str(r.get("sft_model")))):
            for c in r["curves"]:
                w.writerow({"method": r["run"], "seed": r["seed"], "sft_model": r.get("sft_model"), **c})
    md = markdown_tables(rows, runs, k)
    factorial = forms_factorial(rows, k)
    if factorial:
        md += "\n" + markdown_forms_factorial(factorial, k)
    tails = curve_tails(rows, curve_sets)
    tail_differences = curve_tail_differences(tails, runs)
    if tails:
        md += "\n" + markdown_curve_tails(tails, runs, paired=tail_differences)
    association = outcome_association(rows, tails, k)
    association_lines = markdown_outcome_association(association, k)
    if association_lines:
        md += "\n" + association_lines
    parted = where_curves_part(curve_sets, runs)
    equal_lines = markdown_curves_equal(parted, labels)
    if equal_lines:
        md += "\n" + equal_lines
    optima = delta_optimum(rows, k)
    if optima:
        md += "\n" + markdown_delta_optimum(optima, k)
    (out / "cpu_llm_table.md").write_text(md)
    named = [{**c, "run": display_name({"method": c["run"], **c}, labels)} for c in curve_sets]
    shown = list(_units(rows, TABLE2 if set(TABLE2) <= set(runs) else runs, labels))
    plot_curves(named, shown, out / "cpu_llm_curves.png")
    ablation = delta_ablation(rows, k)
    if ablation:
        with (out / "cpu_llm_delta_ablation.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(ablation[0]))
            w.writeheader()
            w.writerows(ablation)
        plot_delta_ablation(ablation, k, out / "cpu_llm_delta_ablation.png")
    paired = {
        benchmark: paired_against_references(
            [r for r in rows if r["benchmark"] == benchmark], ["sft", *runs], f"mean_at_{k}"
        )
        for benchmark in BENCHMARKS
    }
    seeds = sorted({r["seed"] for r in rows})
    summary = {
        # a rewrite (no results) keeps the invocation that trained the rows
        "settings": {
            **settings,
            "runs": runs,
            "seeds": seeds,
            "this_invocation": sorted(map(list, fresh)) if results else settings.get("this_invocation", []),
        },
        "versions": versions or _versions(),
        "paired_mean_at_k": paired,
        "between_rule_noise": {
            benchmark: between_rule_noise([r for r in rows if r["benchmark"] == benchmark], runs, k)
            for benchmark in BENCHMARKS
        },
        "delta_ablation": ablation,
        "delta_optimum": optima,
        "forms_factorial": factorial,
        "curve_tails": {
            "last_steps": TAIL_STEPS,
            "paired": tail_differences,
            "rows": tails,
        },
        "outcome_association": association,
        "curves_part_from_clip": parted,
        "grpo_minus_own_sft": grpo_minus_own_sft(rows, k),
        "rows": rows,
    }
    (out / "cpu_llm_table.json").write_text(json.dumps(summary, indent=1))
    return summary


def rewrite_outputs(out: Path) -> dict:
    """Write ``out``'s table again from its own rows and curves (``cpu_llm_table.json``, ``cpu_llm_curves.csv``),
    training and evaluating nothing: for when the table's statistics or layout change after its runs are gone.
    Settings and library versions stay those of the invocations that trained the rows."""
    summary_path = out / "cpu_llm_table.json"
    if not summary_path.exists():
        raise FileNotFoundError(f"--rewrite: no table to rewrite in {out} (expected {summary_path})")
    before = json.loads(summary_path.read_text())
    settings = {k: v for k, v in before["settings"].items() if k not in ("runs", "seeds")}
    return write_outputs([], settings, out, keep_previous=True, versions=before.get("versions"))


def _units(rows: list[dict], runs: list[str], labels: dict[str, str]) -> dict[str, list[dict]]:
    """The rows of each of ``runs`` and start, by :func:`display_name`, in the order of ``runs`` then of starts."""
    units: dict[str, list[dict]] = {}
    for run in runs:
        mine = [r for r in rows if r["method"] == run]
        for r in sorted(mine, key=lambda r: labels[r.get("sft_model")]):
            units.setdefault(display_name(r, labels), []).append(r)
    return units


def _versions() -> dict:
    import platform

    import torch
    import transformers
    import trl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
    }


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 runs x 1 seed x a few steps (CI)")
    ap.add_argument("--runs", nargs="+", choices=sorted(CPU_RUNS), help="subset of runs (default: all)")
    ap.add_argument("--seeds", nargs="+", type=int)
    ap.add_argument("--max-steps", type=int)
    ap.add_argument("--save-steps", type=int, help="steps between evaluated checkpoints (default 250)")
    ap.add_argument(
        "--at-step",
        type=int,
        help="write the table of runs that stop at this step, read from each run's checkpoint there "
        "(a multiple of save_steps, <= max-steps; runs not yet trained are trained to max-steps first)",
    )
    ap.add_argument(
        "--learning-rate",
        type=float,
        help="GRPO's learning rate when not cpu-table.yaml's (a protocol of its own: its rows never join another's)",
    )
    ap.add_argument("--workers", type=int, default=2, help="parallel training processes (one thread each)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where SFT, GRPO and evaluation run")
    ap.add_argument("--runs-dir", default="runs/cpu_table_steps")
    ap.add_argument(
        "--out", help="where the table goes (default: figures/, with --at-step S figures/cpu_table_at_stepS/)"
    )
    ap.add_argument(
        "--replace-table",
        action="store_true",
        help="write only this invocation's rows (default: add them to the table already in --out, if its settings match)",
    )
    ap.add_argument(
        "--rewrite",
        action="store_true",
        help="write the table in --out again from its own rows (after a change to its statistics); trains nothing",
    )
    args = ap.parse_args(argv)
    if args.rewrite:
        given = [
            a
            for a in (sys.argv[1:] if argv is None else argv)
            if a.startswith("--") and a.split("=")[0] not in ("--rewrite", "--out")
        ]
        if given or not args.out:
            raise ValueError(f"--rewrite takes only --out DIR (the table to rewrite), got {given or 'no --out'}")
        summary = rewrite_outputs(Path(args.out))
        print((Path(args.out) / "cpu_llm_table.md").read_text())
        return summary
    settings = dict(QUICK if args.quick else FULL)
    if args.runs:
        settings["runs"] = args.runs
    if args.seeds:
        settings["seeds"] = args.seeds
    if args.max_steps:
        settings["max_steps"] = args.max_steps
    if args.save_steps is not None:
        if args.save_steps < 1:
            raise ValueError(f"--save-steps must be >= 1, got {args.save_steps}")
        settings["save_steps"] = args.save_steps
    settings["learning_rate"] = grpo_learning_rate(args.learning_rate)
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    if args.at_step is not None and not (
        0 < args.at_step <= settings["max_steps"] and args.at_step % settings["save_steps"] == 0
    ):
        raise ValueError(
            f"--at-step {args.at_step}: the runs save checkpoints every {settings['save_steps']} steps up to "
            f"{settings['max_steps']}; expected one of those steps"
        )
    out = Path(args.out or ("figures" if args.at_step is None else f"figures/cpu_table_at_step{args.at_step}"))
    runs_dir = Path(args.runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available here (run on a GPU machine, or --device cpu)")
    settings.update(task=TASK, base_config=str(BASE_CONFIG.name), benchmarks=BENCHMARKS, device=args.device)

    for run in settings["runs"]:  # a finished run of another protocol is refused before any model is trained
        for seed in settings["seeds"]:
            done = run_directory(runs_dir, run, seed) / "result.json"
            if done.exists():
                refuse_other_protocol(json.loads(done.read_text()), settings, done)

    import multiprocessing as mp

    invocation = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # when: rows of one machine
    results = []
    with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn"), initializer=worker_init) as pool:
        seed_jobs = {}
        futures = [pool.submit(_sft_and_evaluate, s, settings, str(runs_dir)) for s in settings["seeds"]]
        for f in tqdm(as_completed(futures), total=len(futures), desc="SFT per seed"):
            got = f.result()
            seed_jobs[got["job"]["seed"]] = got["job"]
            results.append(got["result"])
        jobs = [
            {
                **seed_jobs[s],
                "run": run,
                "runs_dir": str(runs_dir),
                "max_steps": settings["max_steps"],
                "save_steps": settings["save_steps"],
                "learning_rate": settings["learning_rate"],
            }
            for run in settings["runs"]  # run-major: the first runs of the list get every seed first
            for s in settings["seeds"]
        ]
        futures = [pool.submit(train_and_evaluate, j) for j in jobs]
        for f in tqdm(as_completed(futures), total=len(futures), desc="GRPO runs"):
            results.append(f.result())
    if args.at_step is not None:  # the table of shorter runs: its protocol says so (it never mixes with max_steps')
        results = [result_at_step(r, args.at_step) for r in results]
        settings["max_steps"] = args.at_step
    for r in results:
        r["invocation"] = invocation
    summary = write_outputs(results, settings, out, keep_previous=not args.replace_table)
    print((out / "cpu_llm_table.md").read_text())
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
