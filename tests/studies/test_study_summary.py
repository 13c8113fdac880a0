"""The summary of every CPU study (experiments.study_summary): the pages' blocks and summary.json are what the
committed tables give, its numbers equal the studies' own analyses, and the pages' sentences about it count right."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

from experiments import study_summary as ss  # noqa: E402

T03, T1 = ss.PRIMARY, ss.SECONDARY


@pytest.fixture(scope="module")
def rows():
    return ss.summary()


def test_the_pages_blocks_and_summary_json_are_current(rows):
    assert ss.stale_pages() == []
    assert json.loads(ss.OUT.read_text()) == json.loads(json.dumps(rows))


def test_the_range_effect_at_n40_is_the_range_x_form_analysis(rows):
    analysis = json.loads((ss.FIGURES / "range_form" / "analysis.json").read_text())
    tests = analysis["range_within_min_equivalence_n40"]["tests"]
    (row,) = [r for r in rows if r["table"].endswith("range_form/table")]
    for ours, theirs in ((row["range_effect"][T03], tests["T0.3"]), (row["range_effect"][T1], tests["T1"])):
        assert ours["n"] == theirs["n"] == 40
        assert (ours["mean"], ours["low"], ours["high"]) == pytest.approx(
            (theirs["mean"], theirs["low"], theirs["high"])
        )


def test_the_form_effect_per_depth_is_the_mask_mechanism_analysis_with_its_sign_turned(rows):
    gaps = json.loads((ss.FIGURES / "mask_mechanism" / "analysis.json").read_text())["form_gap"]
    for benchmark, label in ((T03, "T0.3"), (T1, "T1")):
        for depth, gap in gaps[label].items():
            (row,) = [r for r in rows if r["table"].endswith(f"mask_mechanism/{depth}")]
            ours = row["form_effect"][benchmark]  # clip-mask - clip; the analysis gives clip - clip-mask
            assert (ours["mean"], ours["low"], ours["high"]) == pytest.approx((-gap["mean"], -gap["high"], -gap["low"]))


def test_the_pages_count_the_studies_where_clip_ended_below_its_sft_model(rows):
    earlier = [r for r in rows if not r["table"].startswith("figures/experiments/learning_regime")]
    below = sum(r["clip_minus_sft"][T03]["mean"] < 0 for r in earlier)
    surely_below = sum(r["clip_minus_sft"][T03]["high"] < 0 for r in earlier)
    above_at_t1 = sum(r["clip_minus_sft"][T1]["low"] > 0 for r in earlier)
    assert below == len(earlier)  # what "all" says
    assert not any(r["shuffled_minus_sft"][T03] for r in earlier)  # "none ran a no-signal control"
    index = (ss.ROOT / "docs" / "index.md").read_text()
    experiments = (ss.ROOT / "docs" / "experiments" / "index.md").read_text()
    assert f"in all {len(earlier)} of their tables (the 95% interval below 0 in {surely_below})" in " ".join(
        index.split()
    )
    text = " ".join(experiments.split())
    assert f"in all {len(earlier)} of their tables; the 95% interval below 0 in {surely_below}" in text
    assert f"interval lies above its SFT model in {above_at_t1} of the {len(earlier)}" in text


def test_a_study_without_a_table_is_left_out_and_the_regime_reads_the_yaml_defaults():
    assert ss.study_row("x", "no/such/table", "x.md") is None
    g = ss.regime({"max_steps": 400, "sft_steps": 600, "steps_per_generation": 16})
    assert (g["learning_rate"], g["reuse"], g["prompts_per_step"], g["warmup_steps"]) == (1e-4, 32, 32, 0)


@pytest.mark.parametrize(
    "page,study",
    [
        ("cpu-table.md", "CPU study, start C"),
        ("trust-region.md", "Trust region"),
        ("mask-mechanism.md", "Mask mechanism, D = 32"),
    ],
)
def test_each_earlier_studys_first_screen_says_grpo_lowered_its_endpoint(rows, page, study):
    (row,) = [r for r in rows if r["study"] == study]
    d = row["clip_minus_sft"][T03]
    assert d["high"] < 0  # what the sentence says: below the SFT model
    text = " ".join((ss.ROOT / "docs" / "experiments" / page).read_text().split())
    first_screen = text[: text.index("## ", text.index("## The answer") + 3)]
    assert "Where it ran: GRPO lowered the evaluated endpoint here." in first_screen
    assert f"{ss._cell(d)}, n {d['n']})" in first_screen
