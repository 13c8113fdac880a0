"""The two readings of the paper (``atr_theory.READINGS``): the Section 2 surrogate (a rule's clip inside PPO's min)
and the Section 4 pure-clip objective (the mask form). ``atr`` trains the first by default everywhere, the second is
one argument away, neither is called "the paper's form", and a run trained before the default changed keeps its
meaning."""

import re
import subprocess
from pathlib import Path

import pytest
import torch

import atr_theory as at
from tests.loss_batches import loss_batch

ROOT = Path(__file__).resolve().parents[1]


def _moved_batch(seed=0, B=6, T=40):
    return loss_batch(seed, B, T, old_offset=2.5, scale=0.5, clamp=False, per_token=True, min_length=None)  # logp < 0


def _loss_and_grad(method, batch, **kw):
    logp, old, adv, mask = batch
    lp = logp.clone().requires_grad_(True)
    out = at.policy_loss(lp, old, adv, mask, method=method, **kw)
    (g,) = torch.autograd.grad(out.loss, lp)
    return out.loss.detach(), g


@pytest.mark.parametrize("delta", [0.01, 0.07, 0.3])
def test_atr_trains_the_min_form_by_default_with_clip_highers_loss_and_gradient_on_its_range(delta):
    """Thm 3.2 in the trainer's own terms: ``atr`` (min) is ``clip_higher(1 - l, u - 1)`` to machine precision."""
    assert at.resolve("atr").form == "min"
    lower, upper = at.kl3_clip_range(delta)
    batch = _moved_batch()
    w = torch.exp(batch[0] - batch[1])
    assert bool((w < lower).any()) and bool((w > upper).any())  # the ratios moved past both bounds
    la, ga = _loss_and_grad("atr", batch, delta=delta)
    lc, gc = _loss_and_grad("clip_higher", batch, epsilon_low=1 - lower, epsilon_high=upper - 1)
    torch.testing.assert_close(la, lc, rtol=1e-15, atol=1e-17)
    torch.testing.assert_close(ga, gc, rtol=1e-14, atol=1e-17)
    lm, gm = _loss_and_grad("atr", batch, delta=delta, form="mask")  # the mask form: one argument away, and another
    assert not torch.allclose(gm, ga)


def test_every_rule_with_a_ratio_range_defaults_to_the_min_form():
    for name in at.method_names(aliases=False):
        spec = at.METHODS[name]
        if set(spec.forms) == {"min", "mask"}:
            assert spec.default_form == "min", name


def test_the_trainers_config_and_the_presets_train_the_min_form_and_the_mask_form_is_one_field_away(tmp_path):
    pytest.importorskip("trl")
    from atr_llm.presets import RUNS
    from atr_llm.trainer import ATRGRPOConfig

    kw = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert ATRGRPOConfig(method="atr", **kw).resolved_method.form == "min"
    assert ATRGRPOConfig(**kw).resolved_method.name == "atr"  # the default method, in the min form
    assert ATRGRPOConfig(**kw).resolved_method.form == "min"
    assert ATRGRPOConfig(method="atr", form="mask", **kw).resolved_method.form == "mask"
    for run, spec in RUNS.items():
        if spec["method"] in ("atr", "kl1", "kl2", "is_kl3", "tr_ppo"):
            assert "form" not in spec and at.resolve(spec["method"]).form == "min", run


def test_verls_atr_loss_trains_the_min_form_and_takes_the_mask_form_from_its_params(monkeypatch):
    from types import SimpleNamespace

    from atr_llm.verl import plugin as verl_plugin

    def actor(atr_params=None):
        return SimpleNamespace(
            clip_ratio_low=None, clip_ratio_high=None, policy_loss=SimpleNamespace(atr_params=atr_params)
        )

    monkeypatch.delenv(verl_plugin.PARAMS_ENV, raising=False)
    assert verl_plugin.method_params("atr", actor()).form == "min"
    assert verl_plugin.method_params("atr", actor({"form": "mask"})).form == "mask"
    monkeypatch.setenv(verl_plugin.PARAMS_ENV, '{"form": "mask", "delta": 0.05}')
    choice = verl_plugin.method_params("atr", actor())
    assert (choice.form, dict(choice.params)) == ("mask", {"delta": 0.05})


def test_no_text_calls_one_reading_the_papers_form():
    """Neither reading is "the paper's form" (README, docs, the packages, sims, experiments, figures' markdown)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    roots = ("README.md", "docs/", "atr_theory/", "atr_llm/", "sims/", "experiments/", "figures/")
    banned = re.compile(r"the paper'?s\s+(\(appendix\)\s+)?(mask\s+|min\s+|pure[- ]clip\s+)?(form|objective)\b", re.I)
    hits = []
    for name in files:
        if not name.startswith(roots) or not name.endswith((".md", ".py", ".yaml", ".json")):
            continue
        for i, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            if banned.search(line):
                hits.append(f"{name}:{i}: {line.strip()[:120]}")
    assert not hits, "\n".join(hits)


def test_the_two_readings_are_described_once_on_the_theory_page_with_the_papers_lines():
    page = (ROOT / "docs" / "theory.md").read_text()
    assert page.count("## Two readings of the paper") == 1
    for reading in at.READINGS.values():
        assert reading.lower() in page.lower()
    for lines in ("234", "278", "364", "503", "773"):
        assert lines in page


# ------------------------------------------------------------------------- a run trained before the default changed
def _legacy_checkpoint(folder: Path, **config) -> Path:
    """A checkpoint folder as atr-grpo wrote it before forms were recorded: TRL's ``training_args.bin`` only."""
    from atr_llm.trainer import ATRGRPOConfig

    folder.mkdir(parents=True)
    args = ATRGRPOConfig(output_dir=str(folder.parent), use_cpu=True, report_to="none", **config)
    torch.save(args, folder / "training_args.bin")
    (folder / "trainer_state.json").write_text("{}")
    return folder


def test_a_legacy_atr_checkpoint_without_a_form_is_named_as_the_mask_form_and_a_switching_resume_is_refused(tmp_path):
    pytest.importorskip("trl")
    from atr_llm import checkpoints
    from atr_llm.trainer import ATRGRPOConfig

    old = _legacy_checkpoint(tmp_path / "run" / "checkpoint-4", method="atr")
    record = checkpoints.recorded_method(old)
    assert record["method"] == "atr" and record["form"] == "mask" and record["recorded"] == "legacy default"
    assert "mask form" in checkpoints.describe_recorded_method(record)
    kw = dict(output_dir=str(tmp_path / "run"), use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="--form mask"):
        checkpoints.check_resume_compatible(old, ATRGRPOConfig(method="atr", **kw).resolved_method)
    checkpoints.check_resume_compatible(old, ATRGRPOConfig(method="atr", form="mask", **kw).resolved_method)
    # a legacy clip run trained the min form, its default then and now: nothing to refuse
    clip = _legacy_checkpoint(tmp_path / "c" / "checkpoint-2", method="clip")
    assert checkpoints.recorded_method(clip)["form"] is None
    checkpoints.check_resume_compatible(clip, ATRGRPOConfig(method="clip", **kw).resolved_method)
    # a checkpoint written now records its form; the record wins over training_args.bin
    checkpoints.write_method_record(old, ATRGRPOConfig(method="atr", **kw).resolved_method)
    assert checkpoints.recorded_method(old)["form"] == "min"


def test_train_refuses_a_resume_that_would_switch_forms_before_any_model_loads(tmp_path):
    pytest.importorskip("trl")
    from atr_llm import train

    _legacy_checkpoint(tmp_path / "run" / "checkpoint-4", method="atr")
    argv = ["--tiny", "true", "--method", "atr", "--output_dir", str(tmp_path / "run"), "--use_cpu", "true"]
    argv += ["--resume_from_checkpoint", "latest", "--report_to", "none"]
    from atr_llm.command_line import UsageError

    with pytest.raises(UsageError, match=r"^--resume_from_checkpoint latest: .*atr, mask form.*--form mask"):
        train.main(argv)  # refused before any model loads: no weights are written to the run folder
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint-4"]


def test_the_theory_pages_and_readmes_verdicts_are_the_committed_reports():
    """Each Thm 3.1 / 4.1 / 4.2 row of the theory page's table states, per pairing, what
    ``figures/paper/theorem_report.json`` (``python -m sims.verify_theorems``) computed; the README's sign figures
    are the report's."""
    import json

    report = {r["id"]: r for r in json.loads((ROOT / "figures" / "paper" / "theorem_report.json").read_text())}
    pairing_of = {"min vs min": "min-vs-min", "pure vs pure": "pure-vs-pure", "mixed": "mixed"}
    prefix = {"Thm 3.1": "thm3.1-", "Thm 4.1": "thm4.1-", "Thm 4.2": "thm4.2-"}
    checked = 0
    for line in (ROOT / "docs" / "theory.md").read_text().splitlines():
        cells = [c.strip().strip("*") for c in line.split("|")[1:-1]]
        if len(cells) != 5 or not cells[0].startswith(tuple(prefix)):
            continue
        thm = cells[0][:7]
        pairings = list(pairing_of.values()) if cells[1] == "every pairing" else [pairing_of[cells[1].strip("*")]]
        rows = [r for i, r in report.items() if i.startswith(prefix[thm]) and i.endswith(tuple(pairings))]
        assert rows, line
        stated = cells[2].startswith("holds")
        assert all(r["holds_as_stated"] == stated for r in rows), line
        checked += len(rows)
    assert checked == sum(i.startswith(("thm3.1", "thm4.1", "thm4.2")) for i in report) == 15

    def wrong_sign(pairings):
        rows = [r for i, r in report.items() if i.startswith("thm4.2") and i.endswith(pairings)]
        return round(100 * min(1 - r["sign_agreement"] for r in rows)), round(
            100 * max(1 - r["sign_agreement"] for r in rows)
        )

    consistent, mixed = wrong_sign(("min-vs-min", "pure-vs-pure")), wrong_sign(("mixed",))
    readme = (ROOT / "README.md").read_text()
    assert f"wrong sign in {consistent[0]}-{consistent[1]}% of\n  instances under either reading" in readme
    assert f"({mixed[0]}-{mixed[1]}% in the mixed pairing)" in readme
