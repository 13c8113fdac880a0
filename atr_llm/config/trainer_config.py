"""``ATRGRPOConfig``: TRL's ``GRPOConfig`` plus the clipping method, its form, its parameters and this package's
options. Its constructor is the one place that checks them, whichever way they came in (Python, the command line, a
YAML file): the environment a run reads, every declared field's domain (``atr_llm.config.fields``), the method
(resolved once, ``atr_llm.config.method``) and the relations between fields, before any model loads.

The method fields (one per parameter of every registered rule) are added from the registry when this module is
imported (``with_method_fields``): a rule written as a new module of ``atr_theory/methods/`` has its fields with no
other edit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

import atr_theory as at

from ..compat import check_supported_versions
from ..fast_generation import PROMPT_ALLOWANCE
from .fields import (
    TRAINING_RELATIONS,
    check_environment,
    check_fields,
    check_relations_of,
    training_domains,
)
from .method import default_method, method_fields, method_inputs, resolve_method

__all__ = ["ATRGRPOConfig"]


def with_method_fields(cls):
    """Add to ``cls`` (a class body not yet made a dataclass) one ``float | None`` field per method parameter of the
    registry (``method_fields``: its help, and the value that means "not set"), unless the class body declares it.
    TRL's own fields among them (``epsilon``, ``epsilon_high``, VESPO's four) are declared again with TRL's default
    and the rules' help."""
    have = set(cls.__dict__.get("__annotations__", {}))
    annotations = dict(cls.__dict__.get("__annotations__", {}))
    for name, spec in method_fields().items():
        if name in have:
            continue
        annotations[name] = "float | None"
        setattr(cls, name, field(default=spec["default"], metadata={"help": spec["help"]}))
    cls.__annotations__ = annotations
    return cls


@dataclass
@with_method_fields
class ATRGRPOConfig(GRPOConfig):
    """GRPOConfig plus the clipping method, its form and its parameters.

    Every parameter of every registered method is a field here (added from ``atr_theory.METHODS`` when the module is
    imported; None = the method's default). ``divergence_delta`` is the paper's delta;
    TRL's own ``delta`` (INTELLECT-2's two-sided clipping) is honoured with ``method="trl"`` and with the min form of
    ``atr``, ``kl2`` and ``is_kl3`` (TRL's two-sided clip on the rule's range: ``dual_clip_higher``), and refused
    with any other method; ``epsilon`` / ``epsilon_high`` keep their TRL meaning for clip-type methods.
    ``form`` unset trains the method's default form: PPO's min (the paper's Section 2 surrogate) for every rule
    with a ratio range, ``atr`` included; ``form="mask"`` trains the Section 4 pure-clip objective.
    The whole choice is validated and resolved once, when the config is built (``resolved_method``), before any
    model is loaded; a parameter set for a method that does not use it is refused, naming it. A refusal is a
    ``ConfigError`` (a ValueError) naming the field, the value and what was expected.
    """

    method: str | None = field(
        default=None,
        metadata={
            "help": f"clipping method: {', '.join(at.method_names())}; or 'trl': the rule TRL's GRPOTrainer applies "
            "for this config (its loss_type, epsilon, epsilon_high, delta, sapo_* and vespo_* fields). Unset: 'trl' "
            "for loss_type cispo / sapo / vespo, else 'atr'"
        },
    )
    form: str | None = field(
        default=None,
        metadata={
            "help": "'min' (the rule's clip inside PPO's min: the paper's Section 2 surrogate) or 'mask' (pure clip: "
            "its Section 4 objective); default: the method's ('min' for every rule with a ratio range, atr included)"
        },
    )
    kl_chunk_size: int = field(default=64, metadata={"help": "positions per chunk for full-distribution KLs"})
    measure_true_kl: bool = field(
        default=False,
        metadata={
            "help": "log the full-vocabulary KL(pi_old || pi) and KL(pi || pi_old) at every completion position, per "
            "step (true_kl/*: mean, p95, the fraction above true_kl_delta among kept and dropped tokens, the rank "
            "correlation with the sampled token's k3); two extra no-grad forwards, training unchanged "
            "(atr_llm.true_kl)"
        },
    )
    true_kl_delta: float = field(
        default=0.07, metadata={"help": "measure_true_kl: the threshold of true_kl/frac_above_delta*"}
    )
    method_seed: int = field(default=0, metadata={"help": "seed of the generator of stochastic methods (clip_cov)"})
    fast_generation: str = field(
        default="off",
        metadata={
            "help": "'off', 'merged_lora' (LoRA merged into the base weights while TRL generates with transformers, "
            "restored bit for bit after; atr_llm.fast_generation), 'compiled' (merged_lora plus a static KV cache "
            "and a compiled decode step: CUDA graphs on a GPU) or 'auto' (merged_lora on CUDA for a LoRA model "
            "without vLLM)"
        },
    )
    fast_generation_attention: str = field(
        default="sdpa",
        metadata={
            "help": "how a decode step attends while TRL generates with transformers: 'sdpa' (transformers' own) or "
            "'packed_gqa' (grouped-query attention on the cached key/value heads, without transformers' repeat_kv "
            "copy of the cache; atr_llm.fast_generation.packed_gqa_attention). Needs a model loaded with "
            "attn_implementation='sdpa'"
        },
    )
    fast_generation_prompt_tokens: int = field(
        default=PROMPT_ALLOWANCE,
        metadata={
            "help": "fast_generation='compiled': prompt tokens its static KV cache holds beside max_completion_length "
            "(a longer prompt makes a larger cache, compiled once more)"
        },
    )
    allow_untested_versions: bool = field(
        default=False,
        metadata={"help": "run with a TRL / transformers release outside the tested range (atr_llm.compat.SUPPORTED)"},
    )

    def __post_init__(self):
        check_environment()  # transformers reads LOCAL_RANK / WORLD_SIZE in the next line but one
        check_supported_versions(self.allow_untested_versions)  # before TRL's own checks and before any model loads
        check_fields(self, training_domains())  # before TRL and transformers read them
        super().__post_init__()
        self.method = default_method(self.method, self.loss_type)
        self._resolved_method = resolve_method(self)
        check_relations_of(TRAINING_RELATIONS, (self,))

    @property
    def resolved_method(self) -> at.ResolvedMethod:
        """The validated method, form and parameter values, resolved when the config was built (and again when a
        field the method depends on is written: ``__setattr__``); reading it resolves nothing."""
        if "_resolved_method" not in self.__dict__:  # a config unpickled from a checkpoint's training_args.bin
            self._resolved_method = resolve_method(self)
        return self._resolved_method

    def __setattr__(self, name, value):
        if name not in _METHOD_INPUTS or "_resolved_method" not in self.__dict__:  # building, or not the rule's
            return super().__setattr__(name, value)
        before = getattr(self, name)  # written after the config was built: resolved (and checked) again
        super().__setattr__(name, value)
        try:
            self._resolved_method = resolve_method(self)
        except ValueError:
            super().__setattr__(name, before)  # a refused value leaves the config as it was
            raise

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_resolved_method", None)  # resolved again when read (the registry's spec holds functions)
        return state


_METHOD_INPUTS = method_inputs()
