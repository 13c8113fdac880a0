"""atr_llm.data: the generated arithmetic task, the benchmark files and their schema, malformed rows."""

import json

import pytest

pytest.importorskip("math_verify")

from atr_llm import data  # noqa: E402


@pytest.mark.parametrize("terms", [2, 3, 4])
def test_arithmetic_answers_are_correct(terms):
    """Python's own evaluation (precedence included) as the oracle."""
    for row in data.arithmetic_dataset(300, ops="+-*", terms=terms, max_operand=12):
        expr = row["problem"][len("What is ") : -1]
        assert len(expr.split()) == 2 * terms - 1
        assert str(eval(expr)) == row["answer"]  # noqa: S307 - our own generated digits
    with pytest.raises(ValueError, match="ops from"):
        data.arithmetic_problem(__import__("random").Random(0), ops="/")


def test_step_by_step_solutions_chain_to_the_answer():
    """Each line ``x op y = z`` is checked by Python's eval; lines chain left to right from the first operand
    and the last result is the answer (itself checked by eval of the whole expression)."""
    for row in data.arithmetic_dataset(300, terms=4, ops="+-", steps=True, seed=2):
        expr = row["problem"][len("What is ") : -1]
        lines = row["solution"].split("\n")
        assert len(lines) == 3 and str(eval(expr)) == row["answer"]  # noqa: S307 - our own generated digits
        acc = expr.split()[0]
        for line, (op, y) in zip(lines, zip(expr.split()[1::2], expr.split()[2::2])):
            lhs, rhs = line.split(" = ")
            assert lhs == f"{acc} {op} {y}" and str(eval(lhs)) == rhs  # noqa: S307
            acc = rhs
        assert acc == row["answer"]
    with pytest.raises(ValueError, match="steps=True.*'\\+-'"):
        data.arithmetic_problem(__import__("random").Random(0), ops="+*", steps=True)


def test_dapo_rows_are_stripped_and_deduplicated(tmp_path):
    text = (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nWhat is $1+1$?\n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )
    row = {"prompt": [{"role": "user", "content": text}], "reward_model": {"ground_truth": "2", "style": "rule"}}
    f = tmp_path / "dapo.jsonl"
    f.write_text("\n".join(json.dumps(row) for _ in range(100)) + "\n")
    ds = data.load_source("dapo-math-17k", f)
    assert len(ds) == 1 and ds[0]["problem"] == "What is $1+1$?" and ds[0]["answer"] == "2"


def test_local_benchmark_files_map_to_one_schema(tmp_path):
    f = tmp_path / "aime25.jsonl"
    f.write_text(json.dumps({"question": "Find x.", "answer": 70}) + "\n")
    ds = data.load_source("aime25", f)
    assert ds[0] == {"problem": "Find x.", "answer": "70"}
    prompt = data.to_grpo_dataset(ds)[0]["prompt"]
    assert prompt[0]["role"] == "system" and "\\boxed{}" in prompt[0]["content"]


def test_a_malformed_row_names_the_file_the_row_and_the_column(tmp_path):
    f = tmp_path / "amc.jsonl"
    f.write_text(
        json.dumps({"question": "ok", "answer": "1"}) + "\n" + json.dumps({"question": "", "answer": "2"}) + "\n"
    )
    with pytest.raises(ValueError, match=r"amc.jsonl: line 2, column 'question' must be a non-empty string"):
        data.load_source("amc23-40", f)
    g = tmp_path / "amc2.jsonl"
    g.write_text(json.dumps({"problem": "x", "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"amc2.jsonl: line 1 has no column 'question'"):
        data.load_source("amc23-40", g)


def test_amc23_is_the_papers_83_problem_set_in_its_real_schema(tmp_path):
    """AI-MO/aimo-validation-amc: id, problem, answer (a float), url; 83 rows. The paper's AMC percentages are
    multiples of 1/83; the 40-problem math-ai/amc23 stays available as amc23-40."""
    rows = [
        {"id": i, "problem": f"Problem {i}?", "answer": float(i * 7), "url": f"https://example.org/{i}"}
        for i in range(83)
    ]
    f = tmp_path / "amc.parquet"
    import pandas as pd

    pd.DataFrame(rows).to_parquet(f)
    ds = data.load_source("amc23", f)
    assert len(ds) == data.SOURCES["amc23"].n_problems == 83
    assert ds[3] == {"problem": "Problem 3?", "answer": "21"}  # 21.0 -> "21"
    assert data.SOURCES["amc23"].hub_id == "AI-MO/aimo-validation-amc"
    assert data.SOURCES["amc23-40"].n_problems == 40
    for paper_percent in (48.19, 60.24, 69.88, 80.72):  # Table 2's AMC numbers: k/83, not k/40
        assert min(abs(100 * k / 83 - paper_percent) for k in range(84)) < 0.006
        assert min(abs(100 * k / 40 - paper_percent) for k in range(41)) > 0.1  # 20x the rounding
    g = tmp_path / "amc-short.parquet"
    pd.DataFrame(rows[:80]).to_parquet(g)
    with pytest.warns(UserWarning, match="amc23 has 83 problems, this file/hub copy has 80"):
        data.load_source("amc23", g)
