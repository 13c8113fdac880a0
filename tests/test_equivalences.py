"""The equivalences between rules (atr_theory.equivalences): each comes out as stated, a wrong one is caught, and
the report lists them with their counterexamples."""

import json
from dataclasses import replace

import pytest

from atr_theory import equivalences as E


@pytest.mark.parametrize("eq", E.EQUIVALENCES, ids=lambda e: e.id)
def test_each_equivalence_comes_out_as_stated(eq):
    row = E.check(eq, n=40, seed=3)
    assert row["as_expected"], row
    if eq.holds_expected:
        assert row["max_rel_gradient_difference"] <= 1e-10 and row["counterexample"] is None
    else:  # a failure is reported with the batch that shows it, and is not rounding
        assert row["counterexample"] is not None and row["max_rel_gradient_difference"] > 1e-3


def test_a_wrong_identity_is_caught():
    """ATR at delta = 0.05 against the bypass rejection at 0.07: not one rule."""
    eq = next(e for e in E.EQUIVALENCES if e.id == "atr=bypass_token_k3")
    wrong = replace(eq, left=E._loss("atr", delta=0.05))
    assert not E.check(wrong, n=20)["holds"]


def test_the_ids_name_each_identity_once_and_failures_follow_their_identity():
    ids = [e.id for e in E.EQUIVALENCES]
    assert len(set(ids)) == len(ids)
    for i, e in enumerate(E.EQUIVALENCES):
        if not e.holds_expected:  # "... but not when": stated right after the identity it qualifies
            assert E.EQUIVALENCES[i - 1].holds_expected and e.statement.startswith("...")


def test_the_report_writes_the_equivalences(tmp_path):
    from sims import verify_theorems as mod

    rows = [E.check(eq, n=5) for eq in E.EQUIVALENCES]
    mod.write_equivalences(rows, tmp_path / "eq.md", 5, 0)
    text = (tmp_path / "eq.md").read_text()
    assert text.index("identities hold") < text.index("| id |") < text.index("## Counterexamples")
    for r in rows:
        assert f"`{r['id']}`" in text
    json.dumps(rows)  # serialisable as written to equivalences.json
