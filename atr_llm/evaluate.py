"""Mean@K and Pass@K on AMC 2023, AIME 2024 and AIME 2025, in the paper's Table 2 layout.

    python -m atr_llm.evaluate --model Qwen/Qwen3-1.7B --adapter runs/qwen3-1.7b-atr/final \\
        --benchmarks amc23,aime24,aime25 --n 8 --temperature 0.3 --top_p 0.95 --max_tokens 32768
    python -m atr_llm.evaluate --checkpoints runs/qwen3-1.7b-atr --every 1 --model Qwen/Qwen3-1.7B ...
    python -m atr_llm.evaluate --tiny-model runs/cpu-tiny/final --benchmarks arith \\
        --benchmark_path arith=atr_llm/data/arithmetic_bench.jsonl --n 8 --max_tokens 12   # offline

Generation: vLLM when it is installed and a GPU is present, else transformers' ``generate`` in batches.
Grading: math-verify in a process pool (its timeouts need a main thread; each worker grades on its own);
a completion without a parsable answer, or whose grading times out, is graded wrong (and counted).
Every sample goes to ``samples.jsonl`` (benchmark, problem id, sample index, completion, extracted
answer, correct, status); a rerun skips the samples already written, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from pathlib import Path

from tqdm.auto import tqdm

from .evaluation_checks import (  # noqa: F401  (part of this module's API)
    PAPER_BENCHMARKS,
    SETTINGS_FILE,
    check_args,
    checkpoints_every,
    generation_settings,
)
from .evaluation_generators import HFGenerator, VLLMGenerator, vllm_available  # noqa: F401  (part of this module's API)
from .rewards import grade_many


# ---------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------
def _check_nck(n: int, c: int, k: int) -> None:
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise ValueError(f"n, c, k must be integers, got n={n!r}, c={c!r}, k={k!r}")
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need n >= 1, 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    r"""Unbiased Pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021, Eq. 1):
    ``1 - C(n - c, k) / C(n, k)``, computed as ``1 - prod_{i = n-c+1}^{n} (1 - k / i)`` -- no large
    binomials, stable for any n.

    Examples
    --------
    >>> pass_at_k(8, 1, 8), round(pass_at_k(10, 3, 2), 6)
    (1.0, 0.533333)
    """
    _check_nck(n, c, k)
    if n - c < k:
        return 1.0
    log_fail = sum(math.log1p(-k / i) for i in range(n - c + 1, n + 1))
    return float(-math.expm1(log_fail))


def mean_at_k(n: int, c: int, k: int) -> float:
    r"""Mean@k: the expected accuracy of k samples drawn without replacement from the n generated,
    ``c / n`` (unbiased; with n = k it is the plain average over the k samples, the paper's Mean@8)."""
    _check_nck(n, c, k)
    return c / n


# ---------------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
# the evaluation loop (resumable)
# ---------------------------------------------------------------------------------------------
def load_benchmark(name: str, path: str | None, argument: str = "benchmark file"):
    from atr_llm.data import SOURCES, load_source

    benchmarks = (*PAPER_BENCHMARKS, "amc23-40")
    source = name if name in benchmarks else "amc23-40"  # any other name: a local file with columns question, answer
    if path is None and name not in benchmarks:
        raise ValueError(
            f"benchmark {name!r} needs a local file: --benchmark_path {name}=FILE (columns question, answer)"
        )
    ds = load_source(source, path, argument=argument, published=name in benchmarks)  # a file of the user's: no count
    known = SOURCES[source].n_problems if name in benchmarks else None
    print(f"benchmark {name}: {len(ds)} problems" + (f" (the published set has {known})" if known else ""))
    return ds


def read_samples(path: Path) -> list[dict]:
    """The samples of ``samples.jsonl``, each (benchmark, problem, sample) once; a line cut by a kill is not read
    (``drop_torn_tail`` removes it before anything is appended)."""
    if not path.exists():
        return []
    rows, seen = [], set()
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut by an interruption: regenerated
                continue
            key = (row.get("benchmark"), row.get("problem_id"), row.get("sample_index"))
            if key not in seen:
                seen.add(key)
                rows.append(row)
    return rows


def drop_torn_tail(path: Path) -> int:
    """Cut ``path`` after its last newline: a process killed mid-line leaves a partial last line, and a line
    appended after it would join it (both lost). Returns the bytes removed."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with path.open("r+b") as f:
            f.truncate(keep)
    return len(data) - keep


def evaluate_benchmarks(
    generate,
    benchmarks: dict,
    out_dir: Path,
    *,
    n: int,
    timeout_seconds: int = 5,
    chunk_problems: int = 8,
    workers: int = 2,
) -> list[dict]:
    """Generate ``n`` samples per problem (skipping the ones in ``samples.jsonl``), grade, append."""
    from atr_llm.data import format_prompt

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "samples.jsonl"
    drop_torn_tail(path)
    done = {(r["benchmark"], r["problem_id"], r["sample_index"]) for r in read_samples(path)}
    todo = []
    for bench, ds in benchmarks.items():
        for pid, row in enumerate(ds):
            for s in range(n):
                if (bench, pid, s) not in done:
                    todo.append((bench, pid, s, row["problem"], row["answer"]))
    bar = tqdm(total=len(todo), desc=f"samples ({len(done)} already done)", disable=not todo)
    step = max(1, chunk_problems * n)
    for i in range(0, len(todo), step):
        chunk = todo[i : i + step]
        completions = generate([format_prompt(t[3]) for t in chunk])
        graded = grade_many([(c, t[4]) for c, t in zip(completions, chunk)], timeout_seconds, workers)
        with path.open("a") as f:
            for t, c, (status, extracted) in zip(chunk, completions, graded):
                f.write(
                    json.dumps(
                        {
                            "benchmark": t[0],
                            "problem_id": t[1],
                            "sample_index": t[2],
                            "completion": c,
                            "extracted_answer": extracted,
                            "correct": status == "correct",
                            "status": status,
                        }
                    )
                    + "\n"
                )
        bar.update(len(chunk))
    bar.close()
    return read_samples(path)


def summarise_samples(rows: list[dict], ks: list[int]) -> dict:
    """Per benchmark and averaged: Mean@k and Pass@k (%) for each k, plus status counts."""
    by = defaultdict(lambda: defaultdict(list))
    status = defaultdict(lambda: defaultdict(int))
    for r in rows:
        by[r["benchmark"]][r["problem_id"]].append(bool(r["correct"]))
        status[r["benchmark"]][r["status"]] += 1
    out = {}
    for bench, problems in by.items():
        res = {}
        for k in ks:
            valid = [(len(v), sum(v)) for v in problems.values() if len(v) >= k]
            if not valid:
                continue
            res[f"mean@{k}"] = 100 * sum(mean_at_k(n, c, k) for n, c in valid) / len(valid)
            res[f"pass@{k}"] = 100 * sum(pass_at_k(n, c, k) for n, c in valid) / len(valid)
        res["problems"] = len(problems)
        res["status"] = dict(status[bench])
        out[bench] = res
    benches = [b for b in out if b != "average"]
    avg = {}
    for key in {k for b in benches for k in out[b] if "@" in k}:
        vals = [out[b][key] for b in benches if key in out[b]]
        if len(vals) == len(benches):
            avg[key] = sum(vals) / len(vals)
    out["average"] = avg
    return out


# ---------------------------------------------------------------------------------------------
# tables and figures
# ---------------------------------------------------------------------------------------------
def table2(results_by_step: dict[int, dict], k: int, label: str) -> tuple[list[str], list[str]]:
    """One row in the paper's Table 2 layout, "final (best)" over checkpoints; Markdown and CSV cells."""
    steps = sorted(results_by_step)
    final = results_by_step[steps[-1]]
    benches = [b for b in final if b != "average"] + ["average"]
    md, cs = [label], [label]
    for b in benches:
        for metric in (f"mean@{k}", f"pass@{k}"):
            vals = [results_by_step[s].get(b, {}).get(metric) for s in steps]
            vals = [v for v in vals if v is not None]
            f = final.get(b, {}).get(metric)
            best = max(vals) if vals else None
            md.append("-" if f is None else f"{f:.2f} ({best:.2f})")
            cs.append("" if f is None else f"{f:.4f}")
            cs.append("" if best is None else f"{best:.4f}")
    return md, cs


def write_reports(results_by_step: dict[int, dict], out_dir: Path, k: int, label: str, ks: list[int]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(results_by_step)
    final = results_by_step[steps[-1]]
    benches = [b for b in final if b != "average"] + ["average"]
    names = [PAPER_BENCHMARKS.get(b, b) if b != "average" else "Average" for b in benches]
    md_row, csv_row = table2(results_by_step, k, label)
    header = "| Method | " + " | ".join(f"{n} Mean@{k} (%) | {n} Pass@{k} (%)" for n in names) + " |"
    sep = "|---" * (1 + 2 * len(names)) + "|"
    md = "\n".join(
        [f"final (best over {len(steps)} checkpoint(s))", "", header, sep, "| " + " | ".join(md_row) + " |", ""]
    )
    paths = [
        out_dir / "table2.md",
        out_dir / "table2.csv",
        out_dir / "pass_mean_at_k.png",
        out_dir / "pass_mean_at_k.json",
    ]
    paths[0].write_text(md)
    with paths[1].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["method"] + [f"{n}_{m}@{k}_{fb}" for n in names for m in ("mean", "pass") for fb in ("final", "best")]
        )
        w.writerow(csv_row)
    curve = {b: {kk: (final[b].get(f"mean@{kk}"), final[b].get(f"pass@{kk}")) for kk in ks} for b in benches}
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for b, name in zip(benches, names):
        xs = [kk for kk in ks if curve[b][kk][0] is not None]
        axes[0].plot(xs, [curve[b][kk][0] for kk in xs], marker="o", label=name)
        axes[1].plot(xs, [curve[b][kk][1] for kk in xs], marker="o", label=name)
    for ax, t in zip(axes, ("Mean@K (%)", "Pass@K (%)")):
        ax.set(xscale="log", xlabel="K (samples per problem)", ylabel=t, title=f"{t} vs K ({label}, final checkpoint)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=150)
    fig.savefig(out_dir / "pass_mean_at_k.pdf")
    plt.close(fig)
    paths[3].write_text(
        json.dumps({"label": label, "by_step": {str(s): results_by_step[s] for s in steps}, "curve": curve}, indent=1)
    )
    return paths


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def build_generator(args, checkpoint: Path | None):
    """(generate function) for the base model + optional adapter / checkpoint."""
    if vllm_available() and not args.no_vllm and not args.tiny_model:  # pragma: no cover
        adapter = str(checkpoint) if checkpoint is not None else args.adapter
        return VLLMGenerator(
            args.model,
            adapter,
            temperature=args.temperature,
            top_p=args.top_p,
            max_tokens=args.max_tokens,
            seed=args.seed,
            thinking=THINKING[args.thinking],
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = (
        str(checkpoint)
        if checkpoint is not None and (checkpoint / "config.json").exists()
        else (args.tiny_model or args.model)
    )
    tok = AutoTokenizer.from_pretrained(args.tiny_model or args.model)
    model = AutoModelForCausalLM.from_pretrained(src)
    adapter = (
        str(checkpoint) if checkpoint is not None and (checkpoint / "adapter_config.json").exists() else args.adapter
    )
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    return HFGenerator(
        model,
        tok,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        batch_size=args.batch_size,
        seed=args.seed,
        thinking=THINKING[args.thinking],
    )


THINKING = {"on": True, "off": False, "template": None}


def parse_args(argv=None):
    """The declaration of ``python -m atr_llm.evaluate``: each value's domain is checked while parsing
    (atr_llm.command_line's types), the combinations by ``check_args``; both before a model loads or a file is written."""
    from .cli_types import (
        SEED,
        AtMost,
        Exclusive,
        Integer,
        NamedFile,
        ReadDir,
        Real,
        Requires,
        Temperature,
        Text,
        WriteDir,
    )
    from .command_line import Parser, options_given

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Text(), default=None, help="base model: hub id or local folder")
    ap.add_argument(
        "--tiny-model",
        "--tiny_model",
        dest="tiny_model",
        type=ReadDir(holding="config.json", what="a saved model folder"),
        default=None,
        help="a saved tiny model folder (offline)",
    )
    ap.add_argument(
        "--adapter",
        type=ReadDir(holding="adapter_config.json", what="a LoRA adapter folder"),
        default=None,
        help="LoRA adapter folder",
    )
    ap.add_argument(
        "--checkpoints", type=ReadDir(), default=None, help="a training run folder: evaluate its checkpoint-* folders"
    )
    ap.add_argument(
        "--every", type=Integer(1), default=1, help="with --checkpoints: every Nth checkpoint (the last always)"
    )
    ap.add_argument("--benchmarks", type=Text(), default="amc23,aime24,aime25")
    ap.add_argument(
        "--benchmark_path",
        type=NamedFile(),
        action="append",
        default=[],
        help="NAME=FILE: load a benchmark from a local file",
    )
    ap.add_argument("--n", type=Integer(1), default=8, help="samples per problem")
    ap.add_argument("--k", type=Integer(1), default=None, help="K of the table (default: n)")
    ap.add_argument("--temperature", type=Temperature(greedy=True), default=0.3)
    ap.add_argument("--top_p", type=Real(0, 1, open_low=True), default=0.95)
    ap.add_argument("--max_tokens", type=Integer(1), default=32768)
    ap.add_argument(
        "--thinking",
        choices=("on", "off", "template"),
        default="template",
        help="Qwen3's enable_thinking switch of the chat template (template: the template's own default, on for Qwen3)",
    )
    ap.add_argument("--batch_size", type=Integer(1), default=16)
    ap.add_argument("--grading_timeout", type=Integer(1), default=5)
    ap.add_argument("--workers", type=Integer(1, 1024), default=2)
    ap.add_argument("--no_vllm", action="store_true")
    ap.add_argument("--label", type=Text(), default=None, help="row label of the table (default: the model/run name)")
    ap.add_argument("--output_dir", type=WriteDir(), default="runs/eval")
    ap.add_argument("--seed", type=SEED, default=0)
    ap.relate(
        Exclusive("model", "tiny_model", why="each names the base model"),
        Exclusive("adapter", "checkpoints", why="each names the weights to evaluate on the base model"),
        Requires(
            "every", "checkpoints", why="it picks every Nth checkpoint of a run; without {checkpoints} it is ignored"
        ),
        AtMost("k", "n", why="Pass@k needs k <= n samples per problem"),
    )
    args = ap.parse_args(argv)
    check_args(args, given=options_given(ap, ap.typed))
    return args


def loaded_generator(args, checkpoint: Path | None):
    """``build_generator``, a model or tokenizer that does not load (a hub id that cannot be fetched, a folder the
    checks above passed but transformers refuses) refused in one line naming the argument, not a traceback."""
    from .command_line import refuse

    try:
        return build_generator(args, checkpoint)
    except (OSError, ValueError) as e:
        flag, value = ("--tiny-model", args.tiny_model) if args.tiny_model else ("--model", args.model)
        if checkpoint is not None:
            flag, value = "--checkpoints", str(checkpoint)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise refuse(flag, value, f"cannot be loaded ({type(e).__name__}: {first[:200]})") from None


def table_ks(n: int, k: int) -> list[int]:
    """The K at which Mean@K and Pass@K are computed: the powers of two up to ``n`` (the figure's curve), the table's
    ``k`` and ``n`` itself, in order.

    >>> table_ks(8, 8), table_ks(4, 3), table_ks(6, 6)
    ([1, 2, 4, 8], [1, 2, 3, 4], [1, 2, 4, 6])
    """
    return sorted({2**i for i in range(int(math.log2(n)) + 1)} | {k, n})


def trained_rule(checkpoints: str | None, runs: list[tuple[int, Path | None]]) -> str | None:
    """The rule and form the evaluated run trained, as its last checkpoint (or its ``final/``) recorded it
    (``atr_llm.checkpoints.recorded_method``; a run from before forms were recorded is named by the form it trained),
    or None when nothing says."""
    from .checkpoints import describe_recorded_method, recorded_method

    if not checkpoints:
        return None
    folders = [ckpt for _, ckpt in runs if ckpt is not None][::-1] + [Path(checkpoints) / "final"]
    for folder in folders:
        record = recorded_method(folder)
        if record is not None:
            return describe_recorded_method(record)
    return None


def main(argv=None) -> dict:
    args = parse_args(argv)
    from .huge_pages import enable_huge_pages_for_large_cpu_tensors

    enable_huge_pages_for_large_cpu_tensors()  # before any model is built: torch reads it once
    paths = dict(p.split("=", 1) for p in args.benchmark_path)
    names = [b for b in args.benchmarks.split(",") if b]
    benchmarks = {b: load_benchmark(b, paths.get(b), argument=f"--benchmark_path {b}=") for b in names}
    k = args.k or args.n
    ks = table_ks(args.n, k)
    out = Path(args.output_dir)
    runs = checkpoints_every(Path(args.checkpoints), args.every) if args.checkpoints else [(0, None)]
    if args.checkpoints and not runs:
        raise ValueError(f"no checkpoint-* folders in {args.checkpoints}")
    first = loaded_generator(args, runs[0][1])  # before anything is written: a model that does not load writes nothing
    out.mkdir(parents=True, exist_ok=True)
    if not (out / SETTINGS_FILE).is_file():  # check_args compared a rerun's settings with these
        (out / SETTINGS_FILE).write_text(json.dumps(generation_settings(args), indent=1))
    results_by_step = {}
    for i, (step, ckpt) in enumerate(runs):
        sub = out / (f"step-{step}" if ckpt is not None else "model")
        gen = first if i == 0 else loaded_generator(args, ckpt)
        rows = evaluate_benchmarks(
            gen, benchmarks, sub, n=args.n, timeout_seconds=args.grading_timeout, workers=args.workers
        )
        results_by_step[step] = summarise_samples(rows, ks)
        (sub / "summary.json").write_text(json.dumps(results_by_step[step], indent=1))
    label = args.label or Path(args.checkpoints or args.adapter or args.tiny_model or args.model).name
    trained = trained_rule(args.checkpoints, runs)
    if trained is not None and not args.label:
        label = f"{label} ({trained})"
    written = write_reports(results_by_step, out, k, label, ks)
    print((out / "table2.md").read_text())
    print("wrote", *written)
    return results_by_step


if __name__ == "__main__":
    from .command_line import run_command

    run_command(main)
