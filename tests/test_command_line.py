"""Every command refuses bad input before it works: one line naming the argument, exit status 2, no traceback, and
nothing written into its output folder (atr_llm.command_line's convention)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from atr_llm import evaluate, train, training_run
from atr_llm.command_line import UsageError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "atr_llm" / "configs"


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.exists() else {}


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {
        "empty": tmp_path / "empty.jsonl",
        "garbage": tmp_path / "garbage.jsonl",
        "not_object": tmp_path / "list.jsonl",
        "wrong_columns": tmp_path / "columns.jsonl",
        "bad_suffix": tmp_path / "data.txt",
        "bad_line_3": tmp_path / "line3.jsonl",
        "parquet_garbage": tmp_path / "broken.parquet",
        "binary": tmp_path / "binary.jsonl",
    }
    files["empty"].write_text("")
    files["garbage"].write_text("this is not json\n")
    files["not_object"].write_text("[1, 2]\n")
    files["wrong_columns"].write_text(json.dumps({"q": "1 + 1", "a": "2"}) + "\n")
    files["bad_suffix"].write_text("x\n")
    good = json.dumps({"prompt": [{"content": "What is 1 + 1?"}], "reward_model": {"ground_truth": "2"}})
    files["bad_line_3"].write_text(good + "\n" + good + "\n{broken\n")
    files["parquet_garbage"].write_bytes(b"PAR1 not really parquet")
    files["binary"].write_bytes(b"\xff\xfe\x00\x01")
    return files


# ---------------------------------------------------------------------------------------------------------------
# python -m atr_llm.train
# ---------------------------------------------------------------------------------------------------------------
TRAIN_CASES = [
    (["--dataset_path", "{garbage}"], "--dataset_path .*garbage.jsonl: dataset 'arithmetic' is generated offline"),
    (["--dataset_name", "dapo-math-17k", "--dataset_path", "{garbage}"], "--dataset_path .*: line 1 is not JSON"),
    (["--dataset_name", "dapo-math-17k", "--dataset_path", "{bad_line_3}"], "line 3 is not JSON"),
    (["--dataset_name", "dapo-math-17k", "--dataset_path", "{empty}"], "the file is empty"),
    (["--dataset_name", "dapo-math-17k", "--dataset_path", "{not_object}"], "line 1 is not a JSON object"),
    (
        ["--dataset_name", "dapo-math-17k", "--dataset_path", "{wrong_columns}"],
        "^--dataset_path .*: line 1 has no column 'prompt.0.content'",
    ),
    (  # named as typed: the flag, not the field (a bad row used to say "dataset_path")
        ["--dataset_name", "dapo-math-17k", "--dataset-path", "{wrong_columns}"],
        "^--dataset-path .*: line 1 has no column 'prompt.0.content'",
    ),
    (["--dataset_name", "dapo-math-17k", "--dataset_path", "{bad_suffix}"], "expected a .jsonl, .json or .parquet"),
    (["--dataset_name", "dapo-math-17k", "--dataset_path", "{parquet_garbage}"], "cannot be read as parquet"),
    (["--dataset_name", "dapo-math-17k", "--dataset_path", "{binary}"], "not UTF-8 text"),
    (["--dataset_name", "dapo-math-17k", "--dataset_path", "{missing}"], "no such file"),
    (["--dataset_name", "dapo-math-17k", "--dataset_path", "{tmp}"], "not a file"),
    (["--dataset_name", "nope"], "--dataset_name nope: expected one of arithmetic"),
    (["--sft_steps", "-1"], "--sft_steps -1: expected an integer >= 0"),
    (["--sft_batch_size", "0"], "--sft_batch_size 0: expected an integer >= 1"),
    (["--sft_learning_rate", "nan"], "--sft_learning_rate nan: expected a finite number > 0"),
    (["--sft_learning_rate", "-0.1"], "--sft_learning_rate -0.1"),
    (["--dataset_limit", "0"], "--dataset_limit 0"),
    (["--reward_timeout_seconds", "0"], "--reward_timeout_seconds 0"),
    (["--tiny_vocab", "big"], "--tiny_vocab big"),
    (["--backend", "jax"], "--backend jax"),
    (["--resume_from_checkpoint", "{missing}"], "--resume_from_checkpoint .*: no such checkpoint folder"),
    (["--resume_from_checkpoint", "{tmp}"], "not a complete checkpoint"),
    (["--resume_from_checkpoint", "latest"], "--resume_from_checkpoint latest: no complete checkpoint"),
    (["--method", "atr", "--divergence_delta", "0"], "--divergence_delta 0: expected a finite number > 0"),
    (["--method", "atr", "--divergence_delta", "inf"], "--divergence_delta inf: expected a finite number > 0"),
    (["--method", "nope"], "unknown method 'nope'"),
    (["--no_such_option", "1"], "not used by the HfArgumentParser|no_such_option"),
    # what TRL / transformers / torch would refuse only after the SFT stage: refused before it, by flag
    (["--learning_rate=-1e-4"], "--learning_rate -1e-4: expected a finite number >= 0"),
    (["--max_completion_length", "0"], "--max_completion_length 0: expected an integer >= 1"),
    (["--seed", "-5"], r"--seed -5: expected an integer in \[0, 4294967295\]"),
    (["--seed", "4294967296"], r"--seed 4294967296: expected an integer in \[0, 4294967295\]"),
    (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size 0: expected an integer >= 1"),
    (["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps 0"),
    (["--num_iterations", "0"], "--num_iterations 0"),
    (["--temperature", "0"], "--temperature 0: expected a finite number >= 1e-05"),
    (["--temperature", "1e-320"], "--temperature 1e-320: expected a finite number >= 1e-05"),
    (["--top_p", "1.5"], "--top_p 1.5: expected a finite number > 0 and <= 1"),
    (["--weight_decay=-0.1"], "--weight_decay -0.1"),
    (["--beta=-0.1"], "--beta -0.1"),
    (["--max_steps", "0"], "--max_steps 0"),
    # TRL's and transformers' own fields whose domain they check only once training runs: refused by their names
    (
        ["--importance_sampling_level", "tokens"],
        "--importance_sampling_level tokens: did you mean 'token'\\? expected one of",
    ),
    (["--top_entropy_quantile", "1.5"], "--top_entropy_quantile 1.5: expected a finite number >= 0 and <= 1"),
    (["--report_to", "nosuchlogger"], "--report_to nosuchlogger: expected one of none, all, "),
    (["--true_kl_delta", "0"], "--true_kl_delta 0: expected a finite number > 0"),
    (["--kl_chunk_size", "0"], "--kl_chunk_size 0: expected an integer >= 1"),
    # trl.ModelConfig's loading options: honoured (tests below) or refused by name
    (["--load_in_4bit", "true"], "--load_in_4bit true: not supported: atr_llm.train loads models unquantised"),
    (["--load_in_8bit", "true"], "--load_in_8bit true: not supported"),
    (["--attn_implementation", "flashy"], "--attn_implementation flashy: one of eager, .*sdpa or a hub kernel"),
    (
        ["--fast_generation_attention", "packed_gqa", "--attn_implementation", "eager"],
        "--attn_implementation eager: 'sdpa' or unset with fast_generation_attention packed_gqa",
    ),
]


@pytest.mark.parametrize("extra,match", TRAIN_CASES, ids=[" ".join(c[0]) for c in TRAIN_CASES])
def test_train_refuses_bad_input_before_any_model_or_file(tmp_path, monkeypatch, extra, match):
    from atr_llm import tiny

    def boom(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(training_run, "load_model_and_tokenizer", boom)
    monkeypatch.setattr(tiny, "build_tiny_model", boom)
    files = {k: str(v) for k, v in _bad_files(tmp_path).items()}
    files |= {"missing": str(tmp_path / "missing.jsonl"), "tmp": str(tmp_path)}
    out = tmp_path / "out"
    argv = ["--config", str(CONFIGS / "cpu-tiny.yaml"), "--output_dir", str(out)] + [a.format(**files) for a in extra]
    with pytest.raises(ValueError, match=match):
        train.main(argv)
    assert not out.exists()


@pytest.mark.parametrize(
    "config,match",
    [
        ("{tmp}/missing.yaml", "--config .*missing.yaml: no such file"),
        ("{tmp}", "--config .*: expected a YAML file, got a folder"),
        ("/dev/null", "--config /dev/null: expected a YAML file, got no regular file \\(a device, pipe or socket\\)"),
        ("{tmp}/broken.yaml", "--config .*broken.yaml: not a readable YAML file"),
        ("{tmp}/list.yaml", "--config .*list.yaml: expected a YAML mapping of option: value, got a list"),
        ("{tmp}/unknown.yaml", "--config .*unknown.yaml: unknown key\\(s\\) max_stepz: not an option"),
        ("{tmp}/wrong_type.yaml", "--config .*wrong_type.yaml: key warmup_steps: often: expected 0, a fraction of the run"),
        ("{tmp}/binary.yaml", r"--config .*binary.yaml: key output_dir: a YAML bytes \(b'run'\); options take text"),
        ("{tmp}/date.yaml", r"--config .*date.yaml: key run_name: a YAML date \(datetime.date\(2026, 11, 29\)\)"),
    ],
)
@pytest.mark.parametrize("spelling", ["--config FILE", "--config=FILE"])
def test_train_refuses_a_bad_config_file_in_one_line(tmp_path, config, match, spelling):
    (tmp_path / "broken.yaml").write_text("method: [atr\n")
    (tmp_path / "list.yaml").write_text("- method\n- atr\n")
    tiny = (CONFIGS / "cpu-tiny.yaml").read_text()
    (tmp_path / "unknown.yaml").write_text(tiny + "max_stepz: 3\n")
    (tmp_path / "wrong_type.yaml").write_text(tiny + "warmup_steps: often\n")
    no_output = "".join(line for line in tiny.splitlines(keepends=True) if not line.startswith("output_dir"))
    (tmp_path / "binary.yaml").write_text(no_output + "output_dir: !!binary cnVu\n")  # trained into "b'run'"
    (tmp_path / "date.yaml").write_text(tiny + "run_name: 2026-11-29\n")
    path = config.format(tmp=tmp_path)
    argv = ["--config", path] if spelling == "--config FILE" else [f"--config={path}"]
    with pytest.raises(UsageError, match=match):
        train.main(argv + ["--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_train_refuses_to_clobber_a_finished_run_unless_asked(tmp_path, monkeypatch):
    out = tmp_path / "run"
    (out / "final").mkdir(parents=True)
    (out / "final" / "config.json").write_text("{}")
    before = _snapshot(out)
    with pytest.raises(UsageError, match=r"--output_dir .*run: holds a finished run .*--overwrite true"):
        train.main(["--config", str(CONFIGS / "cpu-tiny.yaml"), "--output_dir", str(out)])
    assert _snapshot(out) == before


# ---------------------------------------------------------------------------------------------------------------
# python -m atr_llm.evaluate
# ---------------------------------------------------------------------------------------------------------------
EVALUATE_CASES = [
    (["--tiny-model", "{missing}"], "--tiny-model .*missing.jsonl: no such directory"),
    (["--tiny-model", "{tmp}"], "not a saved model folder: it has no config.json"),
    (["--tiny-model", "{model}", "--n", "2", "--k", "4"], "--k 4: exceeds --n 2: Pass@k needs k <= n"),
    (["--tiny-model", "{model}", "--n", "0"], "--n 0: expected an integer >= 1"),
    (["--tiny-model", "{model}", "--k", "0"], "--k 0"),
    (["--tiny-model", "{model}", "--temperature", "-1"], "--temperature -1: expected 0 \\(greedy\\) or a finite number >= 1e-05"),
    (["--tiny-model", "{model}", "--temperature", "1e-320"], "--temperature 1e-320: expected 0 \\(greedy\\)"),
    (["--tiny-model", "{model}", "--temperature", "nan"], "--temperature nan"),
    (["--tiny-model", "{model}", "--top_p", "0"], "--top_p 0: expected a finite number > 0 and <= 1"),
    (["--tiny-model", "{model}", "--top_p", "1.5"], "--top_p 1.5"),
    (["--tiny-model", "{model}", "--max_tokens", "0"], "--max_tokens 0"),
    (["--tiny-model", "{model}", "--every", "0"], "--every 0"),
    (["--tiny-model", "{model}", "--workers", "0"], "--workers 0"),
    (["--tiny-model", "{model}", "--benchmarks", ","], "--benchmarks ,"),
    (["--tiny-model", "{model}", "--benchmark_path", "arith"], "--benchmark_path arith: expected NAME=FILE"),
    (
        ["--tiny-model", "{model}", "--benchmarks", "a", "--benchmark_path", "b={model}/config.json"],
        "benchmark 'b' is not in",
    ),
    (["--tiny-model", "{model}", "--checkpoints", "{tmp}"], "holds no complete checkpoint"),
    (["--tiny-model", "{model}", "--adapter", "{tmp}"], "not a LoRA adapter folder"),
    (["--tiny-model", "{untemplated}"], "--tiny-model .*untemplated: its tokenizer has no chat template"),
    (["--tiny-model", "{model}", "--checkpoints", "{other_run}"], "--checkpoints .*checkpoint-2: another architecture"),
    (["--tiny-model", "{model}", "--output_dir", "{afile}/eval"], "--output_dir .*afile/eval: .*afile is a file"),
    (["--model", "x", "--n", "two"], "--n two: expected an integer >= 1"),
    (
        ["--tiny-model", "{model}", "--benchmarks", "aime42"],
        "--benchmarks aime42: unknown benchmark; did you mean 'aime25'",
    ),
    (
        ["--tiny-model", "{model}", "--benchmarks", "arith"],
        "--benchmarks arith: unknown benchmark; known: .*benchmark_path",
    ),
]


@pytest.mark.parametrize("extra,match", EVALUATE_CASES, ids=[" ".join(c[0]) for c in EVALUATE_CASES])
def test_evaluate_refuses_bad_input_before_any_model_or_file(tmp_path, extra, match, capsys):
    model, untemplated = tmp_path / "model", tmp_path / "untemplated"
    for folder in (model, untemplated):
        folder.mkdir()
        (folder / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 64}')
        (folder / "tokenizer.json").write_text("{}")  # present: what the checks read before anything loads
    (model / "chat_template.jinja").write_text("{{ messages }}")
    other = tmp_path / "other_run" / "checkpoint-2"  # a run of another model: its own config.json
    other.mkdir(parents=True)
    (other / "trainer_state.json").write_text("{}")
    (other / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 128}')
    (tmp_path / "afile").write_text("")
    names = {"missing": str(tmp_path / "missing.jsonl"), "tmp": str(tmp_path / "empty_dir"), "model": str(model)}
    names |= {"untemplated": str(untemplated), "other_run": str(other.parent), "afile": str(tmp_path / "afile")}
    (tmp_path / "empty_dir").mkdir()
    out = tmp_path / "out"
    argv = [a.format(**names) for a in extra]
    argv += [] if "--output_dir" in extra else ["--output_dir", str(out)]
    with pytest.raises((ValueError, SystemExit)) as refused:
        evaluate.parse_args(argv)
    text = str(refused.value) if isinstance(refused.value, ValueError) else capsys.readouterr().err
    import re

    assert re.search(match, text), text
    assert not out.exists()


@pytest.mark.parametrize(
    "benchmark_file,match", [("garbage", "line 1 is not JSON"), ("wrong_columns", "has no column")]
)
def test_evaluate_names_the_bad_line_of_a_benchmark_file(tmp_path, benchmark_file, match):
    from atr_llm import tiny

    model = tiny.save_tiny(tmp_path / "tiny")
    files = _bad_files(tmp_path)
    argv = ["--tiny-model", str(model), "--benchmarks", "arith", "--benchmark_path", f"arith={files[benchmark_file]}"]
    with pytest.raises(ValueError, match=rf"--benchmark_path arith=.*{match}"):
        evaluate.main([*argv, "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------------
# the experiment driver and the sims scripts
# ---------------------------------------------------------------------------------------------------------------
DRIVER_CASES = [
    (["--seeds", "-1"], r"--seeds -1: expected an integer in \[0, 4294967295\]"),
    (["--seeds", "1", "1"], "--seeds 1 1: lists a seed twice"),
    (["--max-steps", "0"], "--max-steps 0"),
    (["--save-steps", "0"], "--save-steps 0"),
    (["--workers", "0"], "--workers 0"),
    (["--learning-rate", "nan"], "--learning-rate nan"),
    (["--learning-rate=-1e-4"], "--learning-rate -1e-4: expected a finite number > 0"),
    (["--learning-rate", "-1e-4"], "--learning-rate -1e-4: expected a finite number > 0"),  # a value, not an option
    (["--learning-rate", "-inf"], "--learning-rate -inf: expected a finite number > 0"),
    (["--at-step", "3"], "--at-step 3: the runs save checkpoints every"),
    (["--runs", "nope"], "--runs: invalid choice"),
    (["--rewrite", "--out", "{tmp}"], "--out .*: not a written table"),
    (["--rewrite"], "--rewrite without --out"),
    (["--rewrite", "--seeds", "1", "--out", "{tmp}"], "--rewrite --seeds: takes only --out"),
    (["--device", "cuda"], "--device cuda: no CUDA device"),
]


@pytest.mark.parametrize("extra,match", DRIVER_CASES, ids=[" ".join(c[0]) for c in DRIVER_CASES])
def test_the_experiment_driver_refuses_bad_input_before_any_worker(tmp_path, extra, match, capsys):
    import re

    import torch

    from experiments.cpu_table import driver

    if "cuda" in extra and torch.cuda.is_available():
        pytest.skip("a CUDA device is available here")
    runs = tmp_path / "runs"
    argv = [a.format(tmp=str(tmp_path)) for a in extra]
    if "--rewrite" not in extra:
        argv += ["--runs-dir", str(runs), "--out", str(tmp_path / "table")]
    with pytest.raises((ValueError, SystemExit)) as refused:
        driver.main(argv)
    text = str(refused.value) if isinstance(refused.value, ValueError) else capsys.readouterr().err
    assert re.search(match, text), text
    assert not runs.exists() and not (tmp_path / "table").exists()


@pytest.mark.parametrize(
    "module,argv,match",
    [
        ("sims.clip_ranges", ["--delta", "0"], "--delta 0.0: expected a finite number > 0"),
        ("sims.clip_ranges", ["--seed", "-3"], "--seed -3"),
        ("sims.verify_theorems", ["--n", "0"], "--n 0"),
        ("sims.entropy_diff", ["--out", "{file}"], "--out .*: not a directory"),
        ("sims.delta_sweep", ["--quick", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_the_sims_scripts_refuse_bad_input(tmp_path, module, argv, match):
    import importlib
    import re

    target = tmp_path / "a_file"
    target.write_text("x")
    args = [a.format(file=str(target)) for a in argv]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    with pytest.raises((ValueError, SystemExit)) as refused:
        importlib.import_module(module).main(args)
    if isinstance(refused.value, ValueError):
        assert re.search(match, str(refused.value))
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------------
# the one-line convention, end to end (real processes)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command",
    [
        [
            "-m",
            "atr_llm.train",
            "--config",
            "atr_llm/configs/cpu-tiny.yaml",
            "--sft_steps",
            "-1",
            "--output_dir",
            "{out}",
        ],
        ["-m", "atr_llm.evaluate", "--tiny-model", "{out}/none", "--output_dir", "{out}"],
        ["-m", "atr_llm.evaluate", "--model", "x", "--n", "2", "--k", "4", "--output_dir", "{out}"],
        ["-m", "experiments.cpu_table", "--seeds", "-1", "--runs-dir", "{out}/runs", "--out", "{out}/t"],
        ["-m", "sims.clip_ranges", "--delta", "-1", "--out", "{out}"],
        ["-m", "sims.verify_theorems", "--n", "x"],
        ["-m", "atr_llm.train", "--config", "{out}/missing.yaml"],
        ["-m", "atr_llm.train", "--config", "atr_llm/configs/cpu-tiny.yaml", "--learning_rate", "-1e-4"],
        ["-m", "atr_llm.train", "--config", "atr_llm/configs/cpu-tiny.yaml", "--max_steps", "abc"],
        ["-m", "atr_llm.verl.data", "--out", "{out}", "--local", "aime24=/nonexistent.jsonl"],
        ["-m", "sims.entropy_diff", "--quick", "--seed", "99999999999999999999", "--out", "{out}"],
        ["sims/clip_ranges.py", "--delta", "-1", "--out", "{out}"],
        ["-m", "benchmarks.loss_overhead", "--device", "gpu", "--out", "{out}/b.json"],
        ["-m", "benchmarks.loss_overhead", "--methods", "nope", "--out", "{out}/b.json"],
        ["-m", "benchmarks.bandit_throughput", "--out", "{out}/b.json", "--device", "cuda:7"],
        ["-m", "benchmarks.trainer_step", "--out", "README.md/b.json"],
        ["-m", "benchmarks.gpu_step", "--tiny", "--steps", "0", "--out", "{out}/g.json"],
        ["-m", "benchmarks.gpu_step", "--tiny", "--kinds", "atr,foo", "--out", "{out}/g.json"],
        ["-m", "benchmarks.gpu_step", "--tiny", "--kinds", "atr+compiled:0", "--out", "{out}/g.json"],
        ["-m", "benchmarks.gpu_step", "--tiny", "--kinds", "atr+turbo", "--out", "{out}/g.json"],
        pytest.param(
            ["-m", "benchmarks.gpu_step", "--out", "{out}/g.json"],
            marks=pytest.mark.skipif(_has_cuda(), reason="with a GPU this would run the benchmark"),
        ),
        ["-m", "tools.docs_shots", "{out}/no-site", "{out}/shots"],
        ["-m", "tools.mutation_fresh_process", "--timeout", "0", "--out", "{out}/m.txt"],
        ["-m", "tools.check_site", "{out}/no-site"],
        ["-m", "atr_llm.tiny", "--out", "README.md/tiny"],
        ["-m", "atr_llm.tiny", "--vocab", "qwen4", "--out", "{out}"],
        ["-m", "atr_llm.train", "--config", "atr_llm/configs/cpu-tiny.yaml", "--output_dir", "README.md"],
        ["-m", "atr_llm.train", "--config", "atr_llm/configs/cpu-tiny.yaml", "--output_dir", "README.md/run"],
        ["-m", "atr_llm.train", "--config", "atr_llm/configs/cpu-tiny.yaml", "--output_dir", "{out}/" + "x" * 300],
        ["-m", "sims.verify_theorems", "--quick", "--out", "README.md/report"],
        ["-m", "sims.verify_theorems", "--quick", "--seed", "99999999999999999999", "--out", "{out}"],
        ["-m", "tools.pack_runs", "{out}/missing", "{out}/pack"],
        ["-m", "tools.pack_runs", "atr_llm/configs", "{out}/pack", "--part-mib", "0"],
        ["-m", "experiments.trust_region_analysis", "--table", "README.md", "--out", "{out}"],
        ["-m", "atr_llm.presets", "--model", "qwen9"],
    ],
)
def test_a_refusal_is_one_line_exit_2_and_no_traceback(tmp_path, command):
    """``--x -1e-4`` reaches the check as ``--x=-1e-4`` does; a value argparse cannot read is one line too."""
    out = tmp_path / "out"
    args = [a.format(out=out) for a in command]
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    lines = [line for line in res.stderr.splitlines() if line.strip()]  # no library warning before a refusal either
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert not out.exists()


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "sims").glob("[a-z]*.py")))
def test_every_sims_script_runs_as_a_file_from_anywhere(tmp_path, script):
    """The spec's usage, ``python sims/<name>.py``, from another folder: its --help works (no ModuleNotFoundError)."""
    res = subprocess.run(
        [sys.executable, str(ROOT / "sims" / script), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 0 and res.stdout.startswith("usage:"), res.stderr[-2000:]


@pytest.mark.parametrize("spelling", [["--config", "{c}"], ["--config={c}"]])
def test_both_spellings_of_config_apply_the_file(spelling):
    """TRL's parser reads only ``--config FILE``; ``--config=FILE`` used to leave the file unread, silently."""
    import yaml

    path = CONFIGS / "cpu-tiny.yaml"
    content = yaml.safe_load(path.read_text())
    training_args = train.parse([a.format(c=path) for a in spelling]).training
    assert training_args.max_steps == content["max_steps"] and training_args.use_cpu is True


def test_train_honours_attn_implementation_for_a_local_model_and_the_tiny_one(tmp_path):
    """--attn_implementation reaches transformers: a model saved to a folder and loaded by path, and the tiny model,
    attend with what was asked (TRL's ModelConfig option; dropped silently before)."""
    from types import SimpleNamespace

    from trl import ModelConfig

    from atr_llm import tiny

    tok, model = tiny.build_tokenizer_and_model("toy", seed=0)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    for attention in ("eager", "sdpa"):
        args = ModelConfig(model_name_or_path=str(tmp_path / "m"), attn_implementation=attention)
        script = SimpleNamespace(tiny=False, tiny_vocab="toy")
        loaded, _ = training_run.load_model_and_tokenizer(script, args, SimpleNamespace(seed=0))
        assert loaded.config._attn_implementation == attention
        small, _ = training_run.load_model_and_tokenizer(
            SimpleNamespace(tiny=True, tiny_vocab="toy"), args, SimpleNamespace(seed=0)
        )
        assert small.config._attn_implementation == attention


def test_train_honours_the_model_configs_dtype_for_the_tiny_model_too():
    """trl.ModelConfig's dtype reached transformers for a hub or folder model only; the tiny model was float32
    whatever it said (found by tools/audit_one_way_in, cases C08 and P16)."""
    from types import SimpleNamespace

    import torch
    from trl import ModelConfig

    script = SimpleNamespace(tiny=True, tiny_vocab="toy")
    model, _ = training_run.load_model_and_tokenizer(script, ModelConfig(dtype="bfloat16"), SimpleNamespace(seed=0))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model, _ = training_run.load_model_and_tokenizer(script, ModelConfig(), SimpleNamespace(seed=0))
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # ModelConfig's default


def test_the_unsloth_backend_refuses_a_model_option_its_loader_does_not_take():
    from trl import ModelConfig

    from atr_llm.config.run import check_model_options

    check_model_options(ModelConfig(model_name_or_path="m", lora_r=8, use_peft=True), None, backend="unsloth")
    with pytest.raises(ValueError, match="use_dora=True: not honoured by backend 'unsloth'"):
        check_model_options(ModelConfig(model_name_or_path="m", use_dora=True), None, backend="unsloth")
    with pytest.raises(ValueError, match="lora_dropout=0.1: not honoured by backend 'unsloth'"):
        check_model_options(ModelConfig(lora_dropout=0.1), None, backend="unsloth")
    check_model_options(ModelConfig(use_dora=True, lora_dropout=0.1), None, backend="trl")  # TRL takes them


def test_the_unsloth_loader_sizes_its_sequences_from_a_config_without_max_prompt_length(tmp_path, monkeypatch):
    """TRL 1.15 / 1.16's GRPOConfig has no max_prompt_length: the loader reads 512 prompt tokens + the completion
    (it raised AttributeError before), and passes the ModelConfig's LoRA on."""
    from trl import ModelConfig

    from atr_llm import unsloth_backend
    from atr_llm.trainer import ATRGRPOConfig

    seen = {}
    monkeypatch.setattr(unsloth_backend, "unsloth_lora_model", lambda path, **kw: seen.update(kw, path=path) or (1, 2))
    cfg = ATRGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_completion_length=300)
    assert not hasattr(cfg, "max_prompt_length")
    args = ModelConfig(model_name_or_path="m", lora_r=8, lora_alpha=16, use_peft=True)
    assert unsloth_backend.load_unsloth_model(args, cfg) == (1, 2)
    assert (seen["path"], seen["max_seq_length"], seen["r"], seen["lora_alpha"]) == ("m", 512 + 300, 8, 16)
    assert args.use_peft is False  # the adapter is attached by Unsloth already


def test_check_site_answers_help_with_its_usage():
    res = subprocess.run(
        [sys.executable, "-m", "tools.check_site", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert res.returncode == 0 and res.stdout.startswith("usage: python -m tools.check_site [-h] SITE_DIR"), res.stderr


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "sims").glob("[a-z]*.py")))
def test_a_sims_script_runs_by_its_path_with_nothing_installed(script, tmp_path):
    """``python sims/<name>.py --help`` from another folder, with site-packages off in the first process (``-S``: no
    installed or editable package is importable there), reruns itself as ``python -m sims.<name>``."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "sims" / script), "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m sims.{script[:-3]} ")


@pytest.mark.parametrize("writer", ["output_directory", "output_file"])
def test_a_place_to_write_is_checked_by_writing_there(tmp_path, writer):
    """/proc passes a check by name (root may write anything by os.access) but not a probe file; a dangling symlink,
    as the path or on the way to it, is refused; a writable folder passes and keeps no probe."""
    from atr_llm import command_line

    check = getattr(command_line, writer)
    if Path("/proc/self").exists():
        with pytest.raises(command_line.UsageError, match="/proc is not writable"):
            check("--out", "/proc/atr-probe-test/x")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    with pytest.raises(command_line.UsageError, match="a symlink to a missing target"):
        check("--out", str(tmp_path / "dangling"))
    with pytest.raises(command_line.UsageError, match="dangling is a symlink to a missing target"):
        check("--out", str(tmp_path / "dangling" / "below"))
    assert check("--out", str(tmp_path / "new" / "out")) == tmp_path / "new" / "out"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling"]  # no probe left, nothing made
