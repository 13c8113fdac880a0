"""One summary of every CPU study: its regime, whether GRPO (clip) beat its own SFT model and the shuffled-reward
control, the form and range effects, n, and whether a rule comparison counts there.

    python -m experiments.study_summary            # figures/experiments/summary.{json,md} + the pages' blocks
    python -m experiments.study_summary --check    # exit 1 when a page's block or summary.json is stale

Every number is computed from the committed tables (``experiments.cpu_table`` outputs) with the table's own paired
statistics (``cpu_table.paired_difference``: pairs on seed and SFT model, 95% Student t). The block between
``<!-- generated: study_summary -->`` and ``<!-- end: study_summary -->`` on ``PAGES`` is this module's Markdown;
``tests/studies/test_study_summary.py`` fails when it is stale and checks its numbers against the studies' analyses.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from experiments.cpu_table import base_config_value, comparison_validity, paired_difference, read_table

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures" / "experiments"
PAGES = (ROOT / "docs" / "experiments" / "index.md", ROOT / "docs" / "index.md")
OUT = FIGURES / "summary.json"
PRIMARY, SECONDARY = "steps-test-T0.3", "steps-test-T1"

STUDIES: tuple[tuple[str, str, str], ...] = (
    ("CPU study, Tables 2-3", "cpu_table/table", "experiments/cpu-table.md"),
    ("CPU study, start C", "cpu_table/startC", "experiments/cpu-table.md"),
    ("Forms at lr 1e-4", "cpu_table/forms_lr1e-4", "experiments/cpu-table.md"),
    ("Forms at lr 3e-4", "cpu_table/lr3e-4", "experiments/cpu-table.md"),
    ("Trust region", "trust_region/table", "experiments/trust-region.md"),
    ("Range x form", "range_form/table", "experiments/range-form.md"),
    *((f"Mask mechanism, D = {d}", f"mask_mechanism/D{d}", "experiments/mask-mechanism.md") for d in (1, 4, 8, 16, 32)),
    (
        "Learning regime, calibration",
        "learning_regime/calibration/table",
        "experiments/learning-regime-calibration-prereg.md",
    ),
    ("Learning regime, comparison", "learning_regime/comparison/table", "experiments/learning-regime-comparison.md"),
)
"""(name, table folder under figures/experiments/, its page under docs/): the studies, in the order they ran."""


def regime(settings: dict) -> dict:
    """A table's learning regime: GRPO's learning rate, the reuse depth D (optimizer steps per generated batch:
    ``num_iterations`` x ``steps_per_generation``), steps, SFT steps, prompts per step and warmup; a None setting
    is cpu-table.yaml's."""
    iterations = settings.get("num_iterations") or base_config_value("num_iterations")
    split = settings.get("steps_per_generation") or 1
    prompts = settings.get("prompts_per_step") or base_config_value("per_device_train_batch_size") // 8
    return {
        "learning_rate": settings.get("learning_rate") or float(base_config_value("learning_rate")),
        "reuse": iterations * split,
        "max_steps": settings["max_steps"],
        "sft_steps": settings["sft_steps"],
        "prompts_per_step": prompts,
        "warmup_steps": settings.get("warmup_steps") or 0,
    }


def study_row(name: str, table: str, page: str, k: int = 8) -> dict | None:
    """The summary of one study's table, or None when it has not been written yet."""
    folder = FIGURES / table
    if not (folder / "cpu_llm_table.json").exists():
        return None
    summary, rows, _ = read_table(folder)
    key = f"mean_at_{k}"

    def contrast(run: str, reference: str, benchmark: str) -> dict | None:
        mine = [r for r in rows if r["benchmark"] == benchmark]
        return paired_difference(mine, run, reference, key)

    validity = comparison_validity(rows, k)
    return {
        "study": name,
        "table": f"figures/experiments/{table}",
        "page": page,
        "regime": regime(summary["settings"]),
        "runs": sorted({r["method"] for r in rows} - {"sft"}),
        "seeds": len({r["seed"] for r in rows}),
        "clip_minus_sft": {b: contrast("clip", "sft", b) for b in (PRIMARY, SECONDARY)},
        "shuffled_minus_sft": {b: contrast("shuffled", "sft", b) for b in (PRIMARY, SECONDARY)},
        "form_effect": {b: contrast("clip-mask", "clip", b) for b in (PRIMARY, SECONDARY)},
        "range_effect": {b: contrast("atr-min", "clip", b) for b in (PRIMARY, SECONDARY)},
        "counts": {b: validity.get(b, {}).get("counts", False) for b in (PRIMARY, SECONDARY)},
    }


def summary() -> list[dict]:
    """Every study whose table exists, in ``STUDIES`` order."""
    return [row for row in (study_row(*study) for study in STUDIES) if row is not None]


def _cell(d: dict | None) -> str:
    return "-" if d is None else f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"


def _counts(row: dict) -> str:
    return " / ".join("yes" if row["counts"][b] else "no" for b in (PRIMARY, SECONDARY))


def markdown(rows: list[dict], link_prefix: str = "") -> str:
    """The summary table: one line per study, clip - SFT at both temperatures, the shuffled arm, the form and range
    effects at T = 0.3 (n: paired seeds of the contrast), and whether a rule comparison counts (clip above its SFT
    model and the shuffled arm)."""
    lines = [
        "| study | lr, reuse D, steps, SFT steps | clip - SFT, T 0.3 / T 1 | shuffled - SFT, T 0.3 | "
        "clip-mask - clip, T 0.3 | atr-min - clip, T 0.3 | a comparison counts, T 0.3 / T 1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        g = r["regime"]
        setting = f"{g['learning_rate']:g}, {g['reuse']}, {g['max_steps']:,}, {g['sft_steps']}"
        if g["warmup_steps"]:
            setting += f", warmup {g['warmup_steps']}"
        sft = r["clip_minus_sft"]
        n = (sft[PRIMARY] or {}).get("n", 0)
        cells = [
            f"[{r['study']}]({link_prefix}{r['page']}) (n {n})",
            setting,
            f"{_cell(sft[PRIMARY])} / {_cell(sft[SECONDARY])}",
            _cell(r["shuffled_minus_sft"][PRIMARY]),
            _cell(r["form_effect"][PRIMARY]),
            _cell(r["range_effect"][PRIMARY])
            + (f" (n {r['range_effect'][PRIMARY]['n']})" if r["range_effect"][PRIMARY] else ""),
            _counts(r),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Final held-out Mean@8, paired on seed and SFT model, mean [95% t interval] in points; `-`: not run in that "
        "study. A rule comparison counts where clip beats both its own SFT model and the shuffled-reward control; no "
        "study before the learning-regime calibration ran that control. Written by `python -m experiments.study_summary` "
        "from the committed tables.",
    ]
    return "\n".join(lines)


def block(page: Path) -> str:
    """The generated block as it belongs on ``page`` (links relative to the docs folder)."""
    prefix = "" if page.parent.name == "docs" else "../"
    return markdown(summary(), prefix)


MARKER = re.compile(r"(<!-- generated: study_summary -->\n)(.*?)(\n<!-- end: study_summary -->)", re.S)


def stale_pages() -> list[Path]:
    """The pages whose block differs from what the committed tables give."""
    return [p for p in PAGES if (m := MARKER.search(p.read_text())) is None or m.group(2) != block(p)]


def main(argv: list[str] | None = None) -> int:
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block or summary.json is stale")
    args = ap.parse_args(argv)
    rows = summary()
    text = json.dumps(rows, indent=1) + "\n"
    if args.check:
        stale = [str(p.relative_to(ROOT)) for p in stale_pages()]
        if not OUT.exists() or OUT.read_text() != text:
            stale.append(str(OUT.relative_to(ROOT)))
        print("stale: " + ", ".join(stale) if stale else "current")
        return 1 if stale else 0
    OUT.write_text(text)
    (OUT.with_suffix(".md")).write_text(markdown(rows, "../../docs/") + "\n")
    for page in PAGES:
        content = page.read_text()
        if MARKER.search(content) is None:
            raise ValueError(f"{page} has no <!-- generated: study_summary --> block")
        page.write_text(MARKER.sub(lambda m: m.group(1) + block(page) + m.group(3), content))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(lambda argv: sys.exit(main(argv)))
