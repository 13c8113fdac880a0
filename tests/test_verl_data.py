"""atr_llm.verl.data: our loaders -> verl's parquet schema, and the verl reward function (math-verify)."""

import json
import re

import pyarrow.parquet as pq
import pytest

from atr_llm.verl import data as verl_data


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_export_writes_verls_schema_from_local_files(tmp_path):
    dapo = {
        "prompt": [{"role": "user", "content": "What is $1+1$?"}],
        "reward_model": {"ground_truth": "2", "style": "rule"},
    }
    dapo2 = {"prompt": [{"role": "user", "content": "What is $2+3$?"}], "reward_model": {"ground_truth": "5"}}
    local = {
        "dapo-math-17k": _write(tmp_path / "dapo.jsonl", [dapo] * 50 + [dapo2] * 7),
        "aime24": _write(tmp_path / "a24.jsonl", [{"problem": "Find x.", "answer": "70"}]),
        "aime25": _write(tmp_path / "a25.jsonl", [{"question": "Find y.", "answer": 3}]),
        "amc23": _write(tmp_path / "amc.jsonl", [{"problem": "Find z.", "answer": 142.0}]),
    }
    with pytest.warns(UserWarning):  # the benchmarks' known sizes (30 / 83) differ from these one-row files
        paths = verl_data.export(tmp_path / "out", local)
    assert sorted(p.name for p in paths) == ["aime24.parquet", "aime25.parquet", "amc23.parquet", "train.parquet"]
    train = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert len(train) == 2  # deduplicated
    row = train[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "atr_grpo/dapo-math-17k" and row["ability"] == "math"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "2"}
    assert row["prompt"][-1] == {"role": "user", "content": "What is $1+1$?"} and "boxed" in row["prompt"][0]["content"]
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0
    amc = pq.read_table(tmp_path / "out" / "amc23.parquet").to_pylist()
    assert amc[0]["reward_model"]["ground_truth"] == "142" and amc[0]["extra_info"]["split"] == "test"


def test_export_refuses_a_local_file_for_a_source_it_does_not_write(tmp_path):
    with pytest.raises(ValueError, match="gsm8k"):
        verl_data.export(tmp_path, {"gsm8k": "x.jsonl"})


@pytest.mark.parametrize(
    "solution, gold, score",
    [
        ("so the answer is \\boxed{70}", "70", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{71}", "70", 0.0),
        ("no answer here", "70", 0.0),
        ("\\boxed{\\frac{1}{0", "70", 0.0),
    ],
)
def test_verl_reward_grades_like_our_grader(solution, gold, score):
    got = verl_data.compute_score(
        data_source="atr_grpo/aime24", solution_str=solution, ground_truth=gold, extra_info={"index": 0}
    )
    assert got == score


@pytest.mark.parametrize(
    "solution, gold, score",
    [
        ("\\boxed{ is\\boxed{4}", "4", 1.0),  # a rollout of verl's CPU test, scored 0 from a thread before
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ],
)
def test_verl_reward_grades_the_same_from_verls_reward_threads(solution, gold, score):
    """verl's reward loop calls compute_score in a thread pool, where math-verify's signal-based timeout cannot
    run; the grade there equals the main thread's."""
    from concurrent.futures import ThreadPoolExecutor

    main = verl_data.compute_score("atr_grpo/arithmetic", solution, gold)
    with ThreadPoolExecutor(2) as pool:
        threaded = pool.submit(verl_data.compute_score, "atr_grpo/arithmetic", solution, gold).result()
    assert main == threaded == score


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--local", "aime24"], "--local aime24: expected NAME=FILE"),
        (["--local", "aime24=/nonexistent.jsonl"], "--local aime24=/nonexistent.jsonl: no such file"),
        (["--train", "nope"], "--train: invalid choice: 'nope'"),
        (["--tests", "aime2x"], "--tests: invalid choice: 'aime2x'"),
        (["--train", "arithmetic", "--local", "arithmetic=README.md"], "--local arithmetic: an offline task"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, argv, message, capsys):
    from atr_llm.verl import data as verl_data

    out = tmp_path / "out"
    with pytest.raises((ValueError, SystemExit)) as refused:
        verl_data.main(["--out", str(out), *argv])
    text = str(refused.value) if isinstance(refused.value, ValueError) else capsys.readouterr().err
    assert re.search(message, text), text
    assert not out.exists()


def test_a_local_file_for_a_source_not_exported_is_refused(tmp_path):
    from atr_llm.verl import data as verl_data

    f = tmp_path / "x.jsonl"
    f.write_text("{}\n")
    with pytest.raises(ValueError, match="--local nope: not exported here"):
        verl_data.main(["--out", str(tmp_path / "out"), "--local", f"nope={f}"])
