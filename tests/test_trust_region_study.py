"""The trust-region study's page says what its committed data say: the pilot's numbers on
docs/experiments/trust-region.md are recomputed from ``figures/experiments/pilots/trust_region_pilot.json``, and the
pre-registration names the setting the pilot chose and runs the driver can run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PILOT = ROOT / "figures" / "experiments" / "pilots" / "trust_region_pilot.json"
PAGE = ROOT / "docs" / "experiments" / "trust-region.md"
PREREG = ROOT / "docs" / "experiments" / "trust-region-preregistration.md"


@pytest.fixture(scope="module")
def arms() -> dict[str, dict]:
    return {row["arm"]: row for row in json.loads(PILOT.read_text())["arms"]}


def test_the_pilot_numbers_on_the_page_are_the_files(arms):
    page = PAGE.read_text()
    rising = [r for r in arms.values() if r["reward_rises"]]
    best = max(rising, key=lambda r: r["acted_pct_mean"])
    flat = " ".join(page.split())
    assert f"Over {len(arms)} arms" in flat
    assert f"at most **{best['acted_pct_mean']:.1f}%**" in flat
    assert f"own setting it is {arms['iter2']['acted_pct_mean']:.2f}%" in flat
    collapsing = [r for r in arms.values() if r["acted_pct_mean"] > 2]
    assert collapsing and all(r["learning_rate"] == 1e-3 and not r["reward_rises"] for r in collapsing)
    worst = min(collapsing, key=lambda r: r["reward_last_fifth"])
    assert len(collapsing) == 1 and f"one arm above 2% ({worst['acted_pct_mean']:.1f}%" in flat
    assert f"({worst['reward_first_fifth']:.2f} -> {worst['reward_last_fifth']:.2f})" in flat
    low_sft = [r for r in arms.values() if r["sft_steps"] < 600]
    assert max(r["reward_last_fifth"] for r in low_sft) <= 0.06 and max(r["acted_pct_mean"] for r in low_sft) < 1.45
    assert not any(r["in_band"] for r in arms.values())  # "cannot be made to bind on 5% of tokens"


def test_the_preregistered_setting_is_the_pilots_choice_and_the_driver_knows_its_runs(arms):
    from experiments import cpu_table

    text = PREREG.read_text()
    chosen = arms["lr3e-4-spg16-iter2"]
    assert chosen["reward_rises"] and chosen["acted_pct_mean"] >= 1.0  # the pre-registered regime check
    assert "learning rate **3e-4**, `num_iterations` **2**, `steps_per_generation` **16**" in text
    commands = [line for line in text.splitlines() if line.startswith("python -m experiments.cpu_table")]
    assert len(commands) == 5
    for line in commands:
        runs = re.search(r"--runs (.*?) --seeds", line).group(1).split()
        assert set(runs) <= set(cpu_table.CPU_RUNS), runs


def test_the_landed_parts_on_the_page_are_the_table():
    import csv

    table = ROOT / "figures" / "experiments" / "trust_region" / "table" / "cpu_llm_table.csv"
    with table.open() as f:
        rows = [r for r in csv.DictReader(f) if r["benchmark"] == "steps-test-T1"]
    clip = sorted((int(r["seed"]), float(r["acted_frac_masked"])) for r in rows if r["method"] == "clip")
    flat = " ".join(PAGE.read_text().split())
    low, high = min(frac for _, frac in clip), max(frac for _, frac in clip)
    assert f"gradient of between {100 * low:.1f}% and {100 * high:.1f}% of tokens" in flat
    assert low >= 0.01  # the pre-registered regime check, per run so far
    seeds = [seed for seed, _ in clip]
    assert seeds == list(range(200, max(seeds) + 1)) and f"on seeds 200-{max(seeds)}" in flat
