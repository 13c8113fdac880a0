"""Check every theorem of the paper on many random instances; write figures/paper/theorem_report.{md,json}, and the
equivalences between rules (atr_theory.equivalences) into figures/paper/equivalences.{md,json}.

    python -m sims.verify_theorems            # 10,000 instances per statement
    python -m sims.verify_theorems --quick    # 1,000 (CI)

Same seed, same report. Each statement is compared with an independent exact computation
(autograd of the clipped objective, entropies of the updated policies, mpmath root finding).
"""

from __future__ import annotations

if not __package__:  # run by its path (`python sims/<name>.py`): run as `python -m sims.<name>`, sims is not installed
    __import__("_run_as_module").rerun_as_module(__file__)

import argparse
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from atr_theory import equivalences as E
from atr_theory import theorems as T

JSON_FENCE = "``` { .json .wrap-long-lines }"
"""A counterexample's one-line JSON wraps at the docs column's edge (``.wrap-long-lines`` in the site's CSS) instead of
scrolling sideways."""


def build_report(n: int, seed: int) -> list[dict]:
    """One row per ``atr_theory.theorems.THEOREMS`` record, in order, from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    return [T.evaluate(thm, n, gen, seed) for thm in tqdm(T.THEOREMS, desc="statements")]


def _fmt(x):
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "**NO**"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def write_markdown(report: list[dict], path: Path, n: int, seed: int) -> None:
    failed = [r for r in report if not r["holds_as_stated"]]
    lines = [
        "# Theorem report",
        "",
        f"`python -m sims.verify_theorems` (instances per statement: {n}, seed {seed}). Each statement is checked "
        "against an independent exact computation: autograd of the clipped objective, entropies of the updated "
        "policies, mpmath root finding. Numbers in `theorem_report.json`.",
        "",
        "## Findings: statements that do not hold as written",
        "",
    ]
    for r in failed:
        extra = ""
        if "sign_agreement" in r and r["sign_agreement"] is not None and r["id"].startswith("thm4.2"):
            extra = f"; the predicted sign is right in only {100 * r['sign_agreement']:.1f}% of instances"
        lines.append(
            f"- **{r['name']}** fails: max relative error {r['max_rel_error']:.3g} "
            f"(global {r.get('global_rel_error', float('nan')):.3g}){extra}. Corrected: {r['corrected_statement']} "
            f"-- holds: {_fmt(r['corrected_holds'])}."
        )
    lines += [
        "",
        "## All statements",
        "",
        "| id | holds as stated | instances | max abs error | max rel error | sign agreement | corrected holds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report:
        lines.append(
            f"| {r['id']} | {_fmt(r['holds_as_stated'])} | {r['instances']} | {_fmt(r['max_abs_error'])} | "
            f"{_fmt(r['max_rel_error'])} | {_fmt(r['sign_agreement'])} | {_fmt(r['corrected_holds'])} |"
        )
    lines += ["", "## Details", ""]
    for r in report:
        lines += [f"### {r['name']}", "", f"*Statement*: {r['statement']}", "", f"*Conditions*: {r['conditions']}", ""]
        if r.get("corrected_statement"):
            lines += [f"*Corrected*: {r['corrected_statement']}", ""]
        if r.get("numerical_note"):
            lines += [f"*Numerics*: {r['numerical_note']}", ""]
        if r["id"].startswith("thm4.2"):
            lines += [
                f"Error when eta is halved shrinks by x{r['error_ratio_when_eta_halved']:.2f} (paper) vs "
                f"x{r['corrected_error_ratio_when_eta_halved']:.2f} (corrected; 4 = second order). Corrected global relative "
                f"error {r['corrected_global_rel_error']:.2g}, sign agreement {r['corrected_sign_agreement']:.3f}.",
                "",
            ]
        ce = r.get("counterexample")
        if ce and ce["K"] <= 5:
            lines += [
                "Counterexample (first state):",
                "",
                JSON_FENCE,
                json.dumps({k: v for k, v in ce.items()}, indent=None)[:1500],
                "```",
                "",
            ]
    path.write_text("\n".join(lines) + "\n")


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: its ``|`` (as in ``KL(p || q)``) escaped, so it does not end the cell."""
    return text.replace("|", "\\|")


def write_equivalences(rows: list[dict], path: Path, n: int, seed: int) -> None:
    """The equivalence checks as a page: answer first (which identities hold, which need their condition), then
    the table and each counterexample."""
    surprising = [r for r in rows if not r["as_expected"]]
    lines = [
        "# Equivalences between rules",
        "",
        f"`python -m sims.verify_theorems` ({n} random float64 batches per check, seed {seed}; "
        "`atr_theory/equivalences.py`). Two rules are one rule when autograd gives the same gradient on every "
        "batch (relative difference <= 1e-10).",
        "",
        f"**{sum(r['holds'] for r in rows)} identities hold; {sum(not r['holds'] for r in rows)} fail when their "
        f"condition is dropped, each with a counterexample; {len(surprising)} checks came out otherwise than "
        "stated.**",
        "",
        "| id | statement | holds | as stated | max relative gradient difference | batches |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['id']}` | {_cell(r['statement'])} | {'yes' if r['holds'] else 'no'} | {_fmt(r['as_expected'])} | "
            f"{r['max_rel_gradient_difference']:.2g} | "
            f"{r['instances']} |"
        )
    lines += ["", "## Counterexamples", ""]
    for r in rows:
        if r["counterexample"]:
            lines += [f"### `{r['id']}`", "", JSON_FENCE, json.dumps(r["counterexample"])[:1200], "```", ""]
    path.write_text("\n".join(lines) + "\n")


def main(argv=None):
    from atr_llm.cli_types import Exclusive, Integer, WriteDir
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=Integer(1), default=10_000, help="instances per statement")
    ap.add_argument("--quick", action="store_true", help="1,000 instances per statement (CI)")
    # torch.Generator.manual_seed takes a signed 64-bit integer
    ap.add_argument("--seed", type=Integer(0, 2**63 - 1), default=0)
    ap.add_argument("--out", type=WriteDir(), default="figures/paper")
    ap.relate(Exclusive("quick", "n", why="--quick runs 1,000 instances per statement"))
    args = ap.parse_args(argv)
    n = 1000 if args.quick else args.n
    torch.set_default_dtype(torch.float64)
    report = build_report(n, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "theorem_report.json").write_text(json.dumps(report, indent=1))
    write_markdown(report, out / "theorem_report.md", n, args.seed)
    n_eq = max(20, n // 50)
    equivalences = [E.check(eq, n=n_eq, seed=args.seed) for eq in tqdm(E.EQUIVALENCES, desc="equivalences")]
    (out / "equivalences.json").write_text(json.dumps(equivalences, indent=1))
    write_equivalences(equivalences, out / "equivalences.md", n_eq, args.seed)
    for r in report:
        print(
            f"{r['id']:45s} holds={r['holds_as_stated']!s:5s} max_rel={r['max_rel_error']:.3g} corrected={r['corrected_holds']}"
        )
    for r in equivalences:
        print(f"{r['id']:45s} holds={r['holds']!s:5s} as_stated={r['as_expected']}")
    print(f"wrote {out / 'theorem_report.md'}, {out / 'theorem_report.json'} and {out / 'equivalences.md'} / .json")
    return report


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
