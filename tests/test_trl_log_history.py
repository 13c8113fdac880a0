"""What a TRL user reads after ``train()`` is TRL's: ``trainer.state.log_history[-1]``, the run's closing entry, holds
every key stock TRL 1.16's ``GRPOTrainer`` puts there on the same config and data (TRL's own GRPO tests read
``train_loss``, ``policy_loss``, ``entropy_coef`` and, for a Mixture-of-Experts model, ``aux_loss`` from it), with
transformers' default saving, whose final checkpoint at the last step used to empty TRL's metric buffer into a log of
its own (``atr_llm.checkpoints.LogAtEveryCheckpoint``)."""

from __future__ import annotations

import types

import pytest
from grpo_helpers import grpo_config_kwargs, tiny_moe, tiny_trainer
from trl import GRPOConfig, GRPOTrainer

from atr_llm.trainer import ATRGRPOConfig, ATRLossMixin, trl_logps_kernel_available

# the options of TRL's tests (tests/test_grpo_trainer.py: test_train, test_train_with_static_entropy,
# test_train_with_adaptive_entropy), on this package's tiny CPU run
CASES = {
    "plain": ({}, ("train_loss",)),
    "mixture_of_experts": ({}, ("train_loss", "aux_loss")),
    "static_entropy": ({"entropy_coef": 0.1}, ("train_loss", "policy_loss", "entropy_coef")),
    "adaptive_entropy": (
        {"entropy_coef": 0.01, "use_adaptive_entropy": True, "entropy_target": 15.0},
        ("train_loss", "policy_loss", "entropy_coef"),
    ),
}


def _closing_entry(tok, tmp_path, config_cls, trainer_cls, case, options) -> dict:
    kwargs = grpo_config_kwargs(tmp_path / config_cls.__name__, **options)
    kwargs.pop("save_strategy")  # transformers' default: save every save_steps, and at the last step
    kwargs.pop("logging_steps")  # TRL's default (10): the two steps log only in the closing entry
    if config_cls is ATRGRPOConfig:
        kwargs["method"] = "trl"
    model = tiny_moe(tok) if case == "mixture_of_experts" else None
    trainer = tiny_trainer(tok, config_cls(**kwargs), trainer_cls, model=model)
    if trainer_cls is GRPOTrainer and not trl_logps_kernel_available():  # TRL 1.15's log-probs need Triton: the
        # stock trainer scores with ours (a plain forward); what is compared is what it logs
        trainer._get_per_token_logps_and_entropies = types.MethodType(
            ATRLossMixin._get_per_token_logps_and_entropies, trainer
        )
    trainer.train()
    return trainer.state.log_history[-1]


@pytest.mark.parametrize("case", list(CASES))
def test_the_closing_log_entry_holds_what_stock_trls_holds(tmp_path, tok, case):
    options, read_by_trls_tests = CASES[case]
    theirs = _closing_entry(tok, tmp_path, GRPOConfig, GRPOTrainer, case, options)
    ours = _closing_entry(tok, tmp_path, ATRGRPOConfig, None, case, options)
    for key in read_by_trls_tests:
        assert theirs.get(key) is not None, f"stock TRL's closing entry lacks {key!r}: the case does not test it"
    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"the closing entry lacks {missing}, which stock TRL's holds"
