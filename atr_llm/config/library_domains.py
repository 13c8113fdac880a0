"""The domains of TRL's and transformers' own fields that a value declares alone (``training_domains`` holds them,
so ``check_fields`` checks them on every way in, the command line's types included); the fields that need more (a
mapping read against the function it is passed to) are checked by ``atr_llm.config.library_fields``."""

from __future__ import annotations

from ..cli_types import Declared, Integer, OneOf, Real

__all__ = ["MULTI_OBJECTIVE_AGGREGATIONS", "SCALE_REWARDS", "library_domains"]

SCALE_REWARDS = ("group", "batch", "none")
"""TRL 1.16's ``scale_rewards`` values (``GRPOTrainer._generate_and_score_completions`` raises on any other at the
first step); its ``GRPOConfig.__post_init__`` reads ``True`` as ``"group"`` and ``False`` as ``"none"``."""


MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
"""TRL 1.16's ``multi_objective_aggregation`` values (``GRPOTrainer._generate_and_score_completions`` branches on
these two and raises on any other, at the first step)."""


def library_domains() -> dict[str, Declared]:
    """Domains of TRL's and transformers' fields declared by their values: ``scale_rewards`` (``SCALE_REWARDS``),
    ``cache_implementation`` (transformers' ``ALL_CACHE_IMPLEMENTATIONS``; ``None`` is its default) and each item of
    ``reward_weights`` (a finite number: TRL multiplies the rewards by them, and a NaN weight trains on NaN),
    ``multi_objective_aggregation`` (``MULTI_OBJECTIVE_AGGREGATIONS``), ``neftune_noise_alpha`` (transformers scales
    its embedding noise by it: > 0, or None for none), and TRL's TR-DPO reference sync (``ref_model_mixup_alpha``, a
    mixing weight in [0, 1]; ``ref_model_sync_steps``, a step count >= 1), ``torch_compile_mode`` (a mode of
    ``torch.compile``: ``torch._inductor.list_mode_options``; any other failed at the first compile, after the model
    was built)."""
    import torch._inductor
    from transformers.generation.configuration_utils import ALL_CACHE_IMPLEMENTATIONS

    return {
        "scale_rewards": OneOf(SCALE_REWARDS),
        "cache_implementation": OneOf(tuple(ALL_CACHE_IMPLEMENTATIONS)),
        "reward_weights": Real(),
        "multi_objective_aggregation": OneOf(MULTI_OBJECTIVE_AGGREGATIONS),
        "neftune_noise_alpha": Real(0.0, open_low=True),
        "ref_model_mixup_alpha": Real(0.0, 1.0),
        "ref_model_sync_steps": Integer(1),
        "torch_compile_mode": OneOf(tuple(torch._inductor.list_mode_options())),
    }
