"""Every private TRL / transformers / Unsloth name the trainer relies on (atr_llm.compat) still is what it relies on,
under each TRL release CI installs (make test: 1.16; make test-pins: 1.15 with unsloth_zoo); and a release outside
the tested range is refused before any model loads, in one line naming it."""

from pathlib import Path

import pytest

from atr_llm import compat


@pytest.mark.parametrize("private", compat.PRIVATE_NAMES, ids=lambda p: p.name)
def test_each_private_name_is_still_what_the_trainer_relies_on(private):
    private.check()


def test_a_changed_private_name_fails_its_check_naming_it(monkeypatch):
    """The checks can fail: a TRL whose log-prob method lost ``compute_entropy`` is caught, by name."""
    from trl import GRPOTrainer

    def renamed(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None):
        raise NotImplementedError

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", renamed)
    check = next(p for p in compat.PRIVATE_NAMES if p.name == "GRPOTrainer._get_per_token_logps_and_entropies")
    with pytest.raises(AssertionError, match="compute_entropy"):
        check.check()


def test_every_private_touch_of_the_trainer_goes_through_compat():
    """The trainer's source names no private module constant of TRL itself: those live in compat."""
    from pathlib import Path

    import atr_llm.trainer

    source = Path(atr_llm.trainer.__file__).read_text()
    assert "trl_utils" not in source and "_CHUNKED_LOGPROB_CHUNK_SIZE" not in source


@pytest.mark.parametrize(
    "text,expected",
    [("1.16.0", (1, 16, 0)), ("1.17.0.dev0", (1, 17, 0)), ("5.24.0rc1", (5, 24, 0)), ("1.15", (1, 15))],
)
def test_version_numbers_compare_by_their_release_segments(text, expected):
    assert compat._version_tuple(text) == expected


def test_the_installed_releases_are_the_tested_ones():
    assert compat.unsupported_versions() == []


@pytest.mark.parametrize("trl_version", ["1.14.2", "1.17.0", "2.0.0", "1.17.0.dev0"])
def test_an_untested_trl_is_refused_in_one_line_naming_both_versions(trl_version):
    installed = {"trl": trl_version, "transformers": "5.24.0"}
    with pytest.raises(RuntimeError) as refused:
        compat.check_supported_versions(installed=installed)
    message = str(refused.value)
    assert "\n" not in message and f"trl {trl_version} is installed" in message and "trl>=1.15,<1.17" in message
    assert "--allow_untested_versions" in message
    compat.check_supported_versions(allow_untested=True, installed=installed)  # the opt-out runs


def test_the_config_refuses_an_untested_trl_before_any_model_loads(monkeypatch, tmp_path):
    from atr_llm.trainer import ATRGRPOConfig

    real = compat.metadata.version
    monkeypatch.setattr(compat.metadata, "version", lambda name: "1.18.0" if name == "trl" else real(name))
    kw = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(RuntimeError, match=r"trl 1\.18\.0 is installed"):
        ATRGRPOConfig(**kw)
    assert ATRGRPOConfig(allow_untested_versions=True, **kw).allow_untested_versions


def test_the_configs_method_fields_are_the_registrys_and_nothing_else_declares_them():
    """One source per field: ATRGRPOConfig's method fields are added from the registry when the module is imported
    (``with_method_fields``); no other module or generated block declares them."""
    import dataclasses

    from atr_llm.config.trainer_config import method_fields
    from atr_llm.trainer import ATRGRPOConfig

    fields = {f.name: f for f in dataclasses.fields(ATRGRPOConfig)}
    for name, spec in method_fields().items():
        assert fields[name].default == spec["default"] and fields[name].metadata["help"] == spec["help"], name
    for path in (Path(__file__).resolve().parents[1] / "atr_llm").rglob("*.py"):
        assert "divergence_delta: float" not in path.read_text(), f"{path} declares a method field by hand"


def test_help_of_the_config_shows_the_papers_delta_with_its_help():
    import dataclasses
    import pydoc

    from atr_llm.trainer import ATRGRPOConfig

    fields = {f.name: f for f in dataclasses.fields(ATRGRPOConfig)}
    assert fields["divergence_delta"].metadata["help"].startswith("divergence threshold delta")
    assert "divergence_delta: 'float | None' = None" in pydoc.render_doc(ATRGRPOConfig, renderer=pydoc.plaintext)


def test_an_eager_step_does_no_range_computation_after_the_first(monkeypatch):
    """Resolve once: ATR's Lambert-W range (and every per-token divergence rule's) is computed once per delta, not
    on every loss call; counted on the range functions themselves."""
    import torch

    import atr_theory as at
    from atr_theory.methods import _ratio as methods

    calls = {}

    def counting(kind, real):
        def wrapper(delta):
            calls[kind] = calls.get(kind, 0) + 1
            return real(delta)

        return wrapper

    monkeypatch.setattr(methods, "_RANGES", {k: counting(k, f) for k, f in methods._RANGES.items()})
    methods._constant_range_cached.cache_clear()
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 8, generator=g, dtype=torch.float64) - 1.5  # logp < 0 below (5 sd)
    logp, adv, mask = old + 0.3 * torch.randn(4, 8, generator=g, dtype=torch.float64), torch.randn(4), old < 0
    choice = at.resolve("atr", "min", delta=0.0517)
    for _ in range(5):
        at.policy_loss(logp, old, adv, mask, method=choice)
        at.policy_loss(logp, old, adv, mask, method="atr", form="mask", delta=0.0517)
    assert calls == {"kl3": 1}
    methods._constant_range_cached.cache_clear()


def test_a_resolved_choice_is_not_resolved_again_and_takes_no_extra_parameters(monkeypatch):
    import torch

    import atr_theory as at
    import atr_theory.loss as loss_module

    choice = at.resolve("clip_higher", epsilon_high=0.3)
    old = -torch.rand(2, 5, dtype=torch.float64) - 0.3
    logp, adv, mask = old + 0.2, torch.tensor([1.0, -1.0]), torch.ones(2, 5, dtype=torch.bool)
    want = at.policy_loss(logp, old, adv, mask, method="clip_higher", epsilon_high=0.3).loss
    monkeypatch.setattr(loss_module, "resolve", lambda *a, **k: (_ for _ in ()).throw(AssertionError("resolved")))
    assert torch.equal(at.policy_loss(logp, old, adv, mask, method=choice).loss, want)
    with pytest.raises(ValueError, match=r"already resolved choice \('clip_higher'"):
        at.policy_loss(logp, old, adv, mask, method=choice, epsilon_high=0.5)


def test_verl_parameters_are_parsed_and_resolved_once_per_process(monkeypatch):
    """The loss's choice is resolved on the first call for a config (atr_theory.resolve runs once, the JSON is parsed
    once), and every later call of the process reads it; another value of $ATR_GRPO_PARAMS is resolved anew."""
    import json
    from types import SimpleNamespace

    import atr_theory
    from atr_llm.verl import plugin as verl_plugin

    monkeypatch.setenv(verl_plugin.PARAMS_ENV, '{"delta": 0.05}')
    parsed, resolved = [], []
    real_loads, real_resolve = json.loads, atr_theory.resolve
    monkeypatch.setattr(verl_plugin.json, "loads", lambda text, **kw: parsed.append(text) or real_loads(text, **kw))
    monkeypatch.setattr(atr_theory, "resolve", lambda *a, **k: resolved.append(a) or real_resolve(*a, **k))
    verl_plugin._CHOICES.clear()
    config = SimpleNamespace(clip_ratio_low=None, clip_ratio_high=None, policy_loss=SimpleNamespace())
    choices = [verl_plugin.choice_for("atr", config)[0] for _ in range(5)]
    assert len(resolved) == 1 and len(parsed) == 2  # one resolution; the JSON read for the parameters and the layers
    assert all(c is choices[0] for c in choices) and choices[0].params["delta"] == 0.05
    monkeypatch.setenv(verl_plugin.PARAMS_ENV, '{"delta": 0.06}')  # another value is resolved anew
    assert verl_plugin.choice_for("atr", config)[0].params["delta"] == 0.06 and len(resolved) == 2
    verl_plugin._CHOICES.clear()
