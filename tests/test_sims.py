"""The sims/ scripts run from a clean checkout in quick mode, write a figure with its numbers, and
are reproducible with the same seed."""

import csv
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    return importlib.import_module(f"sims.{name}")


def test_a_sim_script_runs_with_python_m_from_the_repository_root(tmp_path):
    """`python -m sims.clip_ranges` (the docs' command) works as well as `import sims.clip_ranges`."""
    cmd = [sys.executable, "-m", "sims.clip_ranges", "--quick", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, cwd=ROOT)
    assert (tmp_path / "clip_ranges.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    "script,figure",
    [
        ("clip_ranges", "clip_ranges"),
        ("entropy_diff", "entropy_diff"),
        ("bandit_training", "bandit_training"),
        ("delta_sweep", "delta_sweep"),
        ("trust_regions", "trust_regions"),
        ("range_form", "range_form"),
        ("contextual_bandit", "contextual_bandit"),
        ("gradient_weights", "gradient_weights"),
    ],
)
def test_sim_script_writes_png_pdf_and_numbers(tmp_path, script, figure):
    _load(script).main(["--quick", "--out", str(tmp_path)])
    assert (tmp_path / f"{figure}.png").stat().st_size > 10_000
    assert (tmp_path / f"{figure}.pdf").exists()
    data = list(tmp_path.glob("*.csv")) + list(tmp_path.glob("*.json"))
    assert data
    for p in tmp_path.glob("*.csv"):
        rows = list(csv.DictReader(p.open()))
        assert rows, p


def test_bandit_training_is_reproducible_with_the_same_seed(tmp_path):
    mod = _load("bandit_training")
    mod.main(["--quick", "--seed", "3", "--out", str(tmp_path / "a")])
    mod.main(["--quick", "--seed", "3", "--out", str(tmp_path / "b")])
    for name in (
        "bandit_training_episodic.csv",
        "bandit_training_matched_control.csv",
        "bandit_training_delta_sweep.csv",
    ):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()


def test_entropy_diff_corrected_statement_tracks_the_exact_entropy_difference(tmp_path):
    _load("entropy_diff").main(["--quick", "--out", str(tmp_path)])
    rows = list(csv.DictReader((tmp_path / "entropy_diff_scatter.csv").open()))
    exact = [float(r["exact_over_eta"]) for r in rows]
    corr = [float(r["corrected_over_eta"]) for r in rows]
    paper = [float(r["paper_over_eta"]) for r in rows]
    scale = max(abs(e) for e in exact)
    assert max(abs(c - e) for c, e in zip(corr, exact)) < 0.01 * scale
    assert max(abs(p - e) for p, e in zip(paper, exact)) > 0.3 * scale
    summary = json.loads((tmp_path / "entropy_diff_summary.json").read_text())
    assert "atr" in summary["final"] and "clip" in summary["final"]


def test_interior_optimum_needs_an_inside_best_that_beats_both_ends_beyond_their_ci():
    mod = _load("delta_sweep")
    row = lambda d, m, hi: {"delta": d, "final_return_mean": m, "final_return_hi": hi}  # noqa: E731
    assert mod.interior_optimum([row(0.01, 0.5, 0.6), row(0.07, 0.8, 0.85), row(0.5, 0.6, 0.7)])["interior"]
    assert not mod.interior_optimum([row(0.01, 0.5, 0.6), row(0.07, 0.8, 0.85), row(0.5, 0.7, 0.81)])["interior"]
    assert not mod.interior_optimum([row(0.01, 0.9, 0.95), row(0.07, 0.8, 0.85), row(0.5, 0.6, 0.7)])["interior"]


def test_trust_regions_are_the_rules_own_bounds(tmp_path):
    """The figure's numbers are the rules' ranges: ATR's band [0.671, 1.422] for both signs at every p_old, DPPO-TV's
    upper bound 1 + 0.2 / p_old for A > 0 (up to the grid's spacing), PPO's min form unbounded below for A > 0."""
    rows = _load("trust_regions").main(["--quick", "--out", str(tmp_path)])
    step = (5.0 / 0.2) ** (1 / 199)  # the quick grid's ratio between neighbouring w
    lo, hi = (0.6714, 1.4225)
    for r in (r for r in rows if r["rule"] == "atr" and r["p_old"] < 0.5):
        assert lo <= r["w_low"] <= lo * step and hi / step <= r["w_high"] <= hi
    for r in (r for r in rows if r["rule"] == "dppo_tv" and r["advantage"] == "positive" and 0.05 < r["p_old"] < 0.5):
        bound = 1 + 0.2 / r["p_old"]
        assert bound / step <= r["w_high"] <= bound
    clip_pos = [r for r in rows if r["rule"] == "clip" and r["advantage"] == "positive"]
    assert all(r["w_low"] == pytest.approx(0.2) and r["interval"] for r in clip_pos)


def test_the_simulations_page_states_what_range_form_json_holds():
    """The range x form paragraph of docs/simulations.md against the committed numbers (python -m sims.range_form):
    every form contrast within 3e-6 of zero in return; ATR's p95 of the exact KL per update above clip's everywhere;
    the quoted return contrasts."""
    import json

    root = Path(__file__).resolve().parents[1]
    data = json.loads((root / "figures" / "paper" / "range_form.json").read_text())["contrasts"]
    page = (root / "docs" / "simulations.md").read_text()
    for contrasts in data.values():
        for name, by_key in contrasts.items():
            if name.startswith("form"):
                assert abs(by_key["final_return"]["mean"]) <= 3e-6, name
        assert contrasts["range within min (atr-min - clip-min)"]["kl_p95"]["lo"] > 0
    for setting, text in (("lr=0.03,inner=4", "+0.19 [+0.13, +0.26]"), ("lr=0.3,inner=4", "-0.047 [-0.091, -0.003]")):
        d = data[setting]["range within min (atr-min - clip-min)"]["final_return"]
        digits = 2 if text.startswith("+0.19") else 3
        assert f"{d['mean']:+.{digits}f} [{d['lo']:+.{digits}f}, {d['hi']:+.{digits}f}]" == text
        assert text in page


@pytest.mark.parametrize("rule,form", [("clip", "min"), ("clip", "mask"), ("atr", "mask")])
def test_the_contextual_bandit_with_one_hot_features_is_atr_theorys_tabular_bandit(rule, form):
    """One-hot features make theta the tabular logits: the expected return at every outer iteration equals
    ``atr_theory.bandit.train``'s with its closed-form gradient (not autograd through the features), at a step size
    where clipping acts."""
    import torch

    from atr_theory import bandit

    cb = _load("contextual_bandit")
    phi, r = cb.task("one-hot", 3)
    ours = cb.train(phi, r, rule, form, 3.0, 4, 6)
    theta0 = torch.zeros(3, cb.STATES, cb.ARMS, dtype=torch.float64)
    _, hist = bandit.train(
        r, theta0, rule, iterations=6, inner_steps=4, lr=3.0, gradient="closed_form", form=form, **cb.RULES[rule]
    )
    torch.testing.assert_close(torch.as_tensor(ours["returns"]), torch.stack(hist.ret), rtol=1e-10, atol=1e-12)
    assert float(ours["returns"][-1].mean()) > float(ours["returns"][0].mean()) + 0.02  # it learned


def test_the_committed_contextual_bandit_answer_follows_from_its_cells():
    """figures/paper/contextual_bandit.json (python -m sims.contextual_bandit): the full grid, each cell's mean and
    t-interval recomputed from its per-seed values by scipy, and the answer recomputed from the cells."""
    import numpy as np
    from scipy import stats

    cb = _load("contextual_bandit")
    data = json.loads((ROOT / "figures" / "paper" / "contextual_bandit.json").read_text())
    cells = data["cells"]
    assert len(cells) == len(cb.SHARING) * len(cb.STEP_SIZES) * len(cb.INNER_STEPS) * len(cb.RULES) * len(cb.FORMS)
    for c in cells:
        x = np.array(c["change_per_seed"])
        assert len(x) == cb.SEEDS == c["seeds"]
        low, high = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
        assert c["change_mean"] == pytest.approx(x.mean(), abs=1e-15)
        assert (c["change_low"], c["change_high"]) == pytest.approx((low, high), rel=1e-9)
        assert c["collapsed_seeds"] == int((x < 0).sum())
    assert cb.answer(cells) == data["answer"]


def test_the_simulations_page_states_what_contextual_bandit_json_holds():
    """The contextual-bandit paragraph of docs/simulations.md against the committed numbers."""
    page = " ".join((ROOT / "docs" / "simulations.md").read_text().split())
    data = json.loads((ROOT / "figures" / "paper" / "contextual_bandit.json").read_text())
    cells, answer = data["cells"], data["answer"]
    by = {(str(c["sharing"]), c["step_size"], c["inner_steps"], c["rule"], c["form"]): c for c in cells}
    shared = [k for k in by if k[0] != "one-hot"]
    assert not answer["shared_parameters_alone_collapse_the_mask_form"]
    assert "sharing parameters alone does not make the mask form collapse" in page
    assert sum(c["collapsed_seeds"] for c in cells) == 0 and f"{len(cells)} cells x {cells[0]['seeds']} seeds" in page
    assert f"smallest mean gain is +{min(c['change_mean'] for c in cells):.3f}" in page
    against = max(by[k]["against_max"] for k in shared)
    assert f"on up to {against:.1%} of the pi_old-weighted" in page
    deficit = max(by[k[:4] + ("min",)]["change_mean"] - by[k]["change_mean"] for k in shared if k[4] == "mask")
    assert f"by at most {deficit:.4f} in expected return" in page
    per_seed = max(  # the same deficit seed by seed: the cell mean hides single seeds' larger ones
        max(a - b for a, b in zip(by[k[:4] + ("min",)]["change_per_seed"], by[k]["change_per_seed"]))
        for k in shared
        if k[4] == "mask"
    )
    assert per_seed > deficit and f"single seeds by up to {per_seed:.3f}" in page
    mechanism = " ".join((ROOT / "docs" / "experiments" / "mask-mechanism.md").read_text().split())
    assert f"single seeds by up to {per_seed:.3f}" in mechanism
    identical = answer["one_hot_control_cells_identical"]
    assert f"bit for bit in {identical} cells" in page
    control = [k for k in by if k[0] == "one-hot"]
    assert f"up to {max(by[k]['against_max'] for k in control):.1%} of the pairs" in page
    gap = max(abs(by[k]["change_mean"] - by[k[:4] + ("min",)]["change_mean"]) for k in control if k[4] == "mask")
    assert f"agree to {gap:.0e}" in page


def test_gradient_weights_are_the_rules_own_gradients_by_hand(tmp_path):
    """The figure's weights, read back from its CSV: Clip-Higher's is w inside [0.8, 1.28] on the side the advantage
    pushes and 0 beyond; REINFORCE's 1; CE-GPPO's 0.25 * 0.8 below the range for A < 0 and 1.2 above it for A > 0;
    UP-GRPO's 1 at every ratio for A > 0; PSPO's 0.9 w."""
    _load("gradient_weights").main(["--quick", "--out", str(tmp_path)])
    rows = list(csv.DictReader((tmp_path / "gradient_weights.csv").open()))

    def weights(rule, side):
        return [(float(r["ratio"]), float(r["gradient_weight"])) for r in rows if r["rule"] == rule
                and r["advantage"] == side]

    for w, g in weights("clip_higher", "positive"):
        assert g == pytest.approx(w if w <= 1.28 else 0.0, abs=1e-12)
    for w, g in weights("clip_higher", "negative"):
        assert g == pytest.approx(w if w >= 0.8 else 0.0, abs=1e-12)
    assert all(g == pytest.approx(1.0) for _, g in weights("reinforce", "negative") + weights("up_grpo", "positive"))
    for w, g in weights("ce_gppo", "negative"):
        assert g == pytest.approx(0.2 if w < 0.8 else w if w <= 3.0 else 0.0, abs=1e-12)
    for w, g in weights("ce_gppo", "positive"):
        assert g == pytest.approx(w if w <= 1.2 else 1.2, abs=1e-12)
    for w, g in weights("pspo", "positive"):
        assert g == pytest.approx(0.9 * w, rel=1e-12)
