"""The performance page's tables, generated from the committed benchmark files (one table per machine).

    python -m tools.docs_tables          # rewrites the blocks between the markers in docs/performance.md

Each block is ``<!-- generated: NAME -->`` ... ``<!-- end: NAME -->``; ``tests/test_docs.py`` fails when a block
differs from what the files under ``figures/bench/`` give.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "figures" / "bench"
PAGE = ROOT / "docs" / "performance.md"


def _machines(name: str) -> list[Path]:
    return sorted(p for p in BENCH.glob(f"*/{name}"))


def _header(path: Path, data: dict) -> str:
    where = path.relative_to(ROOT)
    return f"**{path.parent.name}** (`{data.get('device', path.parent.name)}`, torch {data.get('torch', '?')}; [`{where}`]({where}))"


def loss_overhead_tables() -> str:
    """Per-token methods: time of ``policy_loss`` forward + backward over an inline PPO-clip's, (64, 4,096)."""
    blocks = []
    for path in _machines("loss_overhead_time.json"):
        data = json.loads(path.read_text())
        modes = list(data["part1_by_mode"])
        methods = sorted({m for by in data["part1_by_mode"].values() for m in by})
        rows = [f"| method | {' | '.join(modes)} |", "|---|" + "---|" * len(modes)]
        for m in methods:
            cells = []
            for mode in modes:
                got = data["part1_by_mode"][mode].get(m)
                cells.append(f"{got[0]['ratio']:.2f}" if got else "-")
            rows.append(f"| `{m}` | {' | '.join(cells)} |")
        blocks.append(_header(path, data) + "\n\n" + "\n".join(rows))
    return "\n\n".join(blocks)


def bandit_tables() -> str:
    """The vectorised bandit's throughput against the loop and against a memory copy."""
    blocks = []
    for path in _machines("bandit_throughput.json"):
        data = json.loads(path.read_text())
        rows = ["| arms K | best path | elements / s | x loop | share of copy bandwidth |", "|---|---|---|---|---|"]
        for r in data["rows"]:
            rows.append(
                f"| {r['K']:,} | {r['best_path']} | {r['vectorised_elements_per_s']:.3g} | "
                f"{r['speedup_vs_loop']:,.0f} | {100 * r['min_traffic_fraction_of_bandwidth']:.1f}% |"
            )
        blocks.append(_header(path, data) + "\n\n" + "\n".join(rows))
    return "\n\n".join(blocks)


def trainer_step_tables() -> str:
    """``ATRGRPOTrainer`` against stock ``trl.GRPOTrainer`` on the tiny model (ratios of time per step)."""
    blocks = []
    for path in _machines("trainer_step.json"):
        data = json.loads(path.read_text())
        rows = ["| method | loss step / stock | / stock with the fitted tile | end to end / stock | / stock fitted |"]
        rows.append("|---|---|---|---|---|")
        for m in data["loss_step_ratio_vs_stock"]:
            rows.append(
                f"| `{m}` | {data['loss_step_ratio_vs_stock'][m]:.2f} | {data['loss_step_ratio_vs_stock_fitted'][m]:.2f}"
                f" | {data['end_to_end_ratio_vs_stock'][m]:.2f} | {data['end_to_end_ratio_vs_stock_fitted'][m]:.2f} |"
            )
        blocks.append(
            f"**{path.parent.name}** ([`{path.relative_to(ROOT)}`]({path.relative_to(ROOT)}))\n\n" + "\n".join(rows)
        )
    return "\n\n".join(blocks)


def _decode(case: dict) -> str:
    """``ms (x floor)`` of a case whose file records the decode floor (written since the fast-generation cases)."""
    if case.get("decode_ms_per_step") is None:
        return "-"
    return f"{case['decode_ms_per_step']:.1f} (x{case['decode_ms_over_floor']:.0f})"


def _number(value, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``-`` when it was not recorded."""
    return "-" if value is None else format(value, spec)


def gradient_step_s(case: dict, num_iterations: int) -> float | None:
    """Seconds per optimizer step with the generation shared out: one generation serves ``num_iterations`` optimizer
    steps (TRL's buffer, steps_per_generation = gradient_accumulation_steps), so a step costs
    generation / num_iterations + forward-backward + optimizer. ``None`` when the case recorded no generation."""
    gen = case.get("generation_s_per_call_after_first")
    if gen is None or case.get("forward_backward_s_per_step") is None:
        return None
    return gen / num_iterations + case["forward_backward_s_per_step"] + case.get("optimizer_s_per_step", 0.0)


def gpu_step_tables() -> str:
    """The GPU trainer benchmark: one row per case (kind x backend)."""
    blocks = []
    for path in _machines("gpu_step.json"):
        data = json.loads(path.read_text())
        rows = [
            "| kind | backend | steps | s / gradient step | forward + backward s / step | generation s / call "
            "| generated tokens / s | decode ms / step (x bandwidth floor) | peak GiB |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        num_iterations = data.get("geometry", {}).get("num_iterations", 1)
        stopped = []
        for c in data["cases"]:
            if c.get("forward_backward_s_per_step") is None:
                rows.append(f"| {c['kind']} | {c['backend']} | {c.get('steps', '-')} | (did not finish) | | | | | |")
                continue
            if c.get("error"):  # stopped early: the steps it did are measured, what it did not record is "-"
                stopped.append(f"{c['kind']} / {c['backend']}: {re.sub(r' *[(][^)]*[)]', '', c['error'])}")
            rows.append(
                f"| {c['kind']} | {c['backend']} | {c['steps']} | "
                f"{_number(gradient_step_s(c, num_iterations), '.1f')} | {c['forward_backward_s_per_step']:.2f} | "
                f"{_number(c.get('generation_s_per_call_after_first'), '.1f')} | "
                f"{_number(c.get('generated_tokens_per_s_after_first'), '.0f')} | "
                f"{_decode(c)} | {_number(c.get('peak_gpu_memory_GiB'), '.2f')} |"
            )
        if stopped:
            rows.append("\nStopped early, the steps done measured (- = not recorded): " + "; ".join(stopped) + ".")
        env = data.get("environment", {})
        head = f"**{path.parent.name}** (`{env.get('device', '?')}`, torch {env.get('torch', '?')}; [`{path.relative_to(ROOT)}`]({path.relative_to(ROOT)}))"
        blocks.append(head + f"\n\n`{data.get('command', '')}`\n\n" + "\n".join(rows))
    return "\n\n".join(blocks)


def decode_attention_tables() -> str:
    """One decode step's attention at the paper's geometry: transformers' SDPA against packed_gqa, per layer."""
    blocks = []
    for path in sorted(BENCH.glob("*/decode_attention*.json")):
        data = json.loads(path.read_text())
        env, g = data["environment"], data["geometry"]
        rows = [
            "| cache length | step | transformers' SDPA ms / layer (repeat_kv calls) | packed_gqa ms / layer "
            "| SDPA / packed_gqa |",
            "|---|---|---|---|---|",
        ]
        by = {(r["cache_len"], r["how"], r["attention"]): r for r in data["rows"]}
        for length, how in dict.fromkeys((r["cache_len"], r["how"]) for r in data["rows"]):
            sdpa, packed = by[length, how, "sdpa"], by[length, how, "packed_gqa"]
            rows.append(
                f"| {length:,} | {how} | {sdpa['ms_per_layer']:.1f} ({sdpa['repeat_kv_calls']}) | "
                f"{packed['ms_per_layer']:.1f} | {packed['sdpa_ms_over_this']:.1f}x |"
            )
        generated = {(r["cache_len"], r["attention"]): r for r in data.get("generate", [])}
        if generated:
            layers = data["generate"][0]["layers"]
            rows += [
                "",
                f"Whole decode steps of compiled `generate` ({layers} such layers, the trainer's static cache):",
                "",
                "| cache length | transformers' SDPA ms / step | packed_gqa ms / step | SDPA / packed_gqa |",
                "|---|---|---|---|",
            ]
            for length in dict.fromkeys(length for length, _ in generated):
                sdpa, packed = generated[length, "sdpa"], generated[length, "packed_gqa"]
                rows.append(
                    f"| {length:,} | {sdpa['decode_ms_per_step']:.1f} | {packed['decode_ms_per_step']:.1f} | "
                    f"{packed['sdpa_ms_over_this']:.1f}x |"
                )
        where = path.relative_to(ROOT)
        head = (
            f"**{path.parent.name}**, transformers {env['transformers']} (`{env['device']}`, torch {env['torch']}, "
            f"{env['threads']} threads; [`{where}`]({where})): batch {g['batch']}, {g['heads']} query heads on "
            f"{g['kv_heads']} key/value heads of {g['head_dim']}, {data['dtype']}"
        )
        blocks.append(head + f"\n\n`{data['command']}`\n\n" + "\n".join(rows))
    return "\n\n".join(blocks)


GENERATORS = {
    "loss_overhead": loss_overhead_tables,
    "bandit_throughput": bandit_tables,
    "trainer_step": trainer_step_tables,
    "gpu_step": gpu_step_tables,
    "decode_attention": decode_attention_tables,
}


def page_with_tables(text: str) -> str:
    """``text`` with every generated block replaced by what its generator writes now."""
    from atr_theory.docs import replace_block

    for name, generate in GENERATORS.items():
        begin, end = f"<!-- generated: {name} -->\n", f"<!-- end: {name} -->"
        text = replace_block(text, begin, end, generate() + "\n", str(PAGE))
    return text


def main(argv: list[str] | None = None) -> None:
    from atr_llm.cli_types import ReadFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "page", nargs="?", type=ReadFile(as_path=True), default=None, help="the page to rewrite (default: its own)"
    )
    path = ap.parse_args(argv).page or PAGE
    path.write_text(page_with_tables(path.read_text()))
    print(f"wrote the generated tables into {path}")


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
