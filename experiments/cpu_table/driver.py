"""The CPU table's driver: one SFT model per seed, every run trained from it through ``python -m atr_llm.train``'s
entry point and evaluated, in a pool of worker processes; the command line (``python -m experiments.cpu_table``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path

from tqdm.auto import tqdm

from atr_llm.cli_types import SEED, AtMost, Holds, Integer, Real, WriteDir
from atr_llm.command_line import Parser, existing_directory, refuse
from atr_llm.files import atomic_write_text, directory_written_whole

from .protocol import (
    _RUN_PROTOCOL_KEYS,
    BASE_CONFIG,
    BENCHMARKS,
    CPU_RUNS,
    CURVE_KEYS,
    EVAL_SAMPLING,
    FULL,
    MACHINE_FILE,
    OFF_POLICY_KNOBS,
    QUICK,
    REGIME_KNOBS,
    TASK,
    _result_of,
    _started_from,
    acted_summary,
    base_config_value,
    evaluation_problems,
    grpo_learning_rate,
    machine_kind,
    off_policy_knob,
    refuse_other_protocol,
    regime_knob,
    result_at_step,
    run_directory,
    sft_machine,
    train_argv,
    weights_id,
)
from .report import rewrite_outputs, write_outputs

OUT_ROOT = Path("figures") / "experiments" / "cpu_table"
"""Where the driver writes its tables by default: ``table/`` (the full table) and ``at_step<S>/`` (``--at-step``)."""


def train_sft(seed: int, sft_steps: int, runs_dir: Path) -> Path:
    """The seed's SFT model (tiny Qwen3, toy tokenizer; lr 3e-3, batch 32 as ``python -m atr_llm.train
    --sft_steps``), saved to ``runs_dir/sft-s{seed}``; reused if there."""
    from atr_llm.data import load_source
    from atr_llm.sft import run_sft
    from atr_llm.tiny import build_tokenizer_and_model

    out = run_directory(runs_dir, "sft", seed)
    if (out / "config.json").exists():
        recorded = (
            json.loads((out / MACHINE_FILE).read_text()).get("sft_steps") if (out / MACHINE_FILE).exists() else None
        )
        if recorded is not None and recorded != sft_steps:
            raise ValueError(
                f"{out} is an SFT model of {recorded} steps, this invocation asks for {sft_steps}: "
                "use another --runs-dir for another SFT length"
            )
        return out
    # trained into a partial folder and renamed into place whole: a kill leaves no folder that looks finished
    with directory_written_whole(out) as partial:
        tok, model = build_tokenizer_and_model("toy", seed=seed)
        ds = load_source(TASK, None, 4000, seed=seed + 1)
        run_sft(model, tok, ds, partial, max_steps=sft_steps, learning_rate=3e-3, batch_size=32, seed=seed)
        (partial / MACHINE_FILE).write_text(json.dumps({"machine": machine_kind(), "sft_steps": sft_steps}))
    return out


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
    sampling_seed: int = 0,
) -> dict:
    """Mean@1/Pass@1 and Mean@k/Pass@k (%) on ``task``'s test split (its first ``test_problems`` problems of seed
    12345), ``samples`` completions per problem; ``max_tokens`` defaults to the training cap of cpu-table.yaml and
    ``sampling`` to ``EVAL_SAMPLING``. ``sampling_seed``: the generator's seed (the table's evaluations use 0)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atr_llm.evaluate import HFGenerator, evaluate_benchmarks, summarise_samples

    test = evaluation_problems(test_problems, task)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).to(device)
    if max_tokens is None:
        max_tokens = base_config_value("max_completion_length")  # as in training
    gen = HFGenerator(
        model, tok, max_tokens=max_tokens, batch_size=512, seed=sampling_seed, **(sampling or EVAL_SAMPLING)
    )
    rows = evaluate_benchmarks(gen, {"test": test}, out_dir, n=samples, chunk_problems=test_problems, workers=1)
    return summarise_samples(rows, [1, samples])["test"]


def evaluate_every_benchmark(model_dir: Path, tokenizer_dir: Path, job: dict, out_dir: Path) -> dict:
    """``{benchmark: evaluate_model(...)}`` for every sampling of ``BENCHMARKS`` (samples in ``out_dir/<name>``)."""
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


def train_and_evaluate(job: dict) -> dict:
    """Train one (run, seed) from the seed's SFT model with ``python -m atr_llm.train``'s entry point, then
    evaluate every saved checkpoint and the final model; the result is also written to ``result.json``."""
    from atr_llm import train
    from atr_llm.evaluate import checkpoints_every

    run_dir = run_directory(job["runs_dir"], job["run"], job["seed"])
    done = run_dir / "result.json"
    if finished_result(done) is not None:
        return _started_from(finished_result(done), job, done)
    run_dir.mkdir(parents=True, exist_ok=True)
    _send_output_to(run_dir / "train.log")
    argv = train_argv(job, run_dir, job["max_steps"], job["save_steps"])
    ckpts = checkpoints_every(run_dir, 1)
    if ckpts and not (run_dir / "final" / "config.json").exists():
        argv += ["--resume_from_checkpoint", str(ckpts[-1][1])]
    if not (run_dir / "final" / "config.json").exists():
        train.main(argv)
    evals = {}
    for step, path in [*checkpoints_every(run_dir, 1), (job["max_steps"], run_dir / "final")]:
        if step not in evals:  # the checkpoint at max_steps holds the final weights too: evaluated once
            evals[step] = evaluate_every_benchmark(path, job["sft_dir"], job, path / "eval")
    history = json.loads((run_dir / "log_history.json").read_text())
    result = _result_of(job["run"], job)
    result.update({key: job.get(key) for key in _RUN_PROTOCOL_KEYS})
    result["evals"] = {str(k): v for k, v in evals.items()}
    result["curves"] = [{k: h.get(k) for k in CURVE_KEYS} for h in history if "reward" in h and "step" in h]
    result["acted"] = acted_summary(history)
    atomic_write_text(done, json.dumps(result))
    return result


def evaluate_sft(job: dict) -> dict:
    """The SFT model's own row (step 0 of every run of that seed)."""
    sft_dir = Path(job["sft_dir"])
    done = sft_dir / "result.json"
    if finished_result(done) is not None:
        return _started_from(finished_result(done), job, done)
    res = evaluate_every_benchmark(sft_dir, sft_dir, job, sft_dir / "eval")
    result = {**_result_of("sft", job), "evals": {"0": res}, "curves": []}
    atomic_write_text(done, json.dumps(result))
    return result


def finished_result(path: Path) -> dict | None:
    """A finished run's ``result.json``, or None when there is none or it is cut (written by an older version
    without the atomic rename and killed mid-write): such a run is redone, not read."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


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
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    settings = ((_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, trim_threshold), (_M_TOP_PAD, top_pad))
    return all(mallopt(param, int(value)) == 1 for param, value in settings)


def _libc_function(name: str):
    """The C library's function ``name`` through ctypes, or None where there is no such library or function."""
    import ctypes
    import ctypes.util

    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def worker_init() -> None:
    """Initialiser of the driver's worker processes (and of scripts that must reduce like them): one torch thread,
    freed memory kept for re-use (``keep_freed_memory``; allocation only, the same numbers), and death with the
    driver (``die_with_parent``)."""
    import torch

    torch.set_num_threads(1)  # one core per worker: the tiny model is launch-bound, two workers beat two threads
    keep_freed_memory()
    die_with_parent()


def die_with_parent() -> bool:
    """Ask Linux to SIGKILL this process when the driver that started it dies (``prctl(PR_SET_PDEATHSIG)``): a driver
    killed mid-run leaves no worker training on into the run directory that the next invocation resumes. Returns
    False, changing nothing, where there is no ``prctl``."""
    import signal

    prctl = _libc_function("prctl")
    if prctl is None:
        return False
    pr_set_pdeathsig = 1
    return prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) == 0


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


def run_max_steps(value) -> int:
    """The steps the runs will have: ``--max-steps``, else those of ``--quick``'s settings or of the full ones
    (``value(dest)``: the parsed arguments)."""
    return value("max_steps") or (QUICK if value("quick") else FULL)["max_steps"]


def save_steps_beyond_the_runs(value) -> str:
    """Why a ``--save-steps`` above the runs' steps is refused, naming where those steps come from."""
    steps = run_max_steps(value)
    if value("max_steps"):
        return f"exceeds {{max_steps}} {steps}: a run of {steps} steps would save no checkpoint"
    settings = "{quick}'s runs" if value("quick") else "the full runs"
    return (
        f"exceeds the {steps} steps of {settings}: a run of {steps} steps would save no checkpoint (give "
        "{max_steps} for longer runs)"
    )


def main(argv=None) -> dict:
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 runs x 1 seed x a few steps (CI)")
    ap.add_argument("--runs", nargs="+", choices=sorted(CPU_RUNS), help="subset of runs (default: all)")
    ap.add_argument("--seeds", nargs="+", type=SEED)
    ap.add_argument("--max-steps", type=Integer(1))
    ap.add_argument("--save-steps", type=Integer(1), help="steps between evaluated checkpoints (default 250)")
    ap.add_argument(
        "--at-step",
        type=Integer(1),
        help="write the table of runs that stop at this step, read from each run's checkpoint there "
        "(a multiple of save_steps, <= max-steps; runs not yet trained are trained to max-steps first)",
    )
    ap.add_argument(
        "--learning-rate",
        type=Real(0, open_low=True),
        help="GRPO's learning rate when not cpu-table.yaml's (a protocol of its own: its rows never join another's)",
    )
    ap.add_argument(
        "--sft-steps",
        type=Integer(1),
        help="SFT steps of each seed's start model (default 600; another count is a protocol of its own, and its "
        "SFT models live in their own --runs-dir)",
    )
    ap.add_argument(
        "--num-iterations",
        type=Integer(1),
        help="updates per generated batch (TRL num_iterations) when not cpu-table.yaml's 2 (a protocol of its own)",
    )
    ap.add_argument(
        "--steps-per-generation",
        type=Integer(1),
        help="optimizer steps each generated batch is split over (TRL steps_per_generation) when not 1 (a protocol "
        "of its own)",
    )
    ap.add_argument(
        "--prompts-per-step",
        type=Integer(1),
        help="prompts per GRPO step, each with 8 completions, when not cpu-table.yaml's 32 (a protocol of its own)",
    )
    ap.add_argument(
        "--warmup-steps",
        type=Integer(1),
        help="steps of linear learning-rate warmup, then constant (none in cpu-table.yaml; a protocol of its own)",
    )
    ap.add_argument(
        "--measure-true-kl",
        action="store_true",
        help="log the full-vocabulary KL(pi_old || pi) of every update (atr_llm.true_kl; training unchanged): the "
        "table's acted_true_kl_* columns",
    )
    ap.add_argument("--workers", type=Integer(1, 256), default=2, help="parallel training processes (one thread each)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where SFT, GRPO and evaluation run")
    ap.add_argument("--runs-dir", type=WriteDir(), default="runs/cpu_table_steps")
    ap.add_argument(
        "--out",
        type=WriteDir(),
        help="where the table goes (default: figures/experiments/cpu_table/table/, with --at-step S .../at_stepS/)",
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
    ap.relate(
        Holds(  # the steps the runs will have: --max-steps, or --quick's or the full settings' when it is not given
            "save_steps",
            "max_steps",
            "quick",
            holds=lambda value, is_set: value("save_steps") is None or value("save_steps") <= run_max_steps(value),
            why=save_steps_beyond_the_runs,
        ),
        AtMost("at_step", "max_steps", why="the runs stop at --max-steps, with no checkpoint beyond"),
    )
    args = ap.parse_args(argv)
    if args.rewrite:
        given = [
            a
            for a in (sys.argv[1:] if argv is None else argv)
            if a.startswith("--") and a.split("=")[0] not in ("--rewrite", "--out")
        ]
        if given or not args.out:
            raise refuse("--rewrite", " ".join(given) or "without --out", "takes only --out DIR (the table to rewrite)")
        existing_directory("--out", args.out, holding="cpu_llm_table.json", what="a written table")
        summary = rewrite_outputs(Path(args.out))
        print((Path(args.out) / "cpu_llm_table.md").read_text())
        return summary
    settings = dict(QUICK if args.quick else FULL)
    if args.runs:
        twice = [run for i, run in enumerate(args.runs) if run in args.runs[:i]]
        if twice:
            raise refuse("--runs", " ".join(args.runs), f"lists {twice[0]} twice")
        settings["runs"] = args.runs
    if args.seeds is not None:
        if len(set(args.seeds)) != len(args.seeds):
            raise refuse("--seeds", " ".join(map(str, args.seeds)), "lists a seed twice")
        settings["seeds"] = args.seeds
    if args.max_steps is not None:
        settings["max_steps"] = args.max_steps
    if args.save_steps is not None:
        settings["save_steps"] = args.save_steps
    if args.sft_steps is not None:
        settings["sft_steps"] = args.sft_steps
    settings["learning_rate"] = grpo_learning_rate(args.learning_rate)
    for knob in OFF_POLICY_KNOBS:
        settings[knob] = off_policy_knob(knob, getattr(args, knob))
    for knob in REGIME_KNOBS:
        settings[knob] = regime_knob(knob, getattr(args, knob))
    if args.at_step is not None and not (
        0 < args.at_step <= settings["max_steps"] and args.at_step % settings["save_steps"] == 0
    ):
        raise refuse(
            "--at-step",
            args.at_step,
            f"the runs save checkpoints every {settings['save_steps']} steps up to {settings['max_steps']}; "
            "expected one of those steps",
        )
    out = Path(args.out or OUT_ROOT / ("table" if args.at_step is None else f"at_step{args.at_step}"))
    runs_dir = Path(args.runs_dir)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise refuse("--device", "cuda", "no CUDA device is available here (run on a GPU machine, or --device cpu)")
    settings.update(task=TASK, base_config=str(BASE_CONFIG.name), benchmarks=BENCHMARKS, device=args.device)
    runs_dir.mkdir(parents=True, exist_ok=True)  # after every check: a refused invocation writes nothing

    for run in settings["runs"]:  # a finished run of another protocol is refused before any model is trained
        for seed in settings["seeds"]:
            done = run_directory(runs_dir, run, seed) / "result.json"
            if finished_result(done) is not None:
                refuse_other_protocol(finished_result(done), settings, done)

    import multiprocessing as mp

    from atr_llm.huge_pages import enable_huge_pages_for_large_cpu_tensors

    enable_huge_pages_for_large_cpu_tensors()  # the spawned workers inherit it

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
                **{knob: settings[knob] for knob in (*OFF_POLICY_KNOBS, *REGIME_KNOBS)},
                "measure_true_kl": args.measure_true_kl,
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
    from atr_llm.command_line import run_command

    run_command(main)
