"""``ATRGRPOConfig``: TRL's ``GRPOConfig`` plus the clipping method, its form, its parameters and this package's
options, and which registry rule a config trains. The constructor is the one place that checks them, whichever way
they came in (Python, the command line, a YAML file): the environment a run reads, every declared field's domain
(``atr_llm.config.fields``), the method (resolved once, ``resolve_method``) and the relations between fields, before
any model loads.

* Every parameter of every registered rule is a field of ``ATRGRPOConfig`` under its own name (``method_fields``,
  added when this module is imported: a rule written as a new module of ``atr_theory/methods/`` has its fields with
  no other edit), except where TRL's ``GRPOConfig`` has a field of that name with another meaning: TRL's ``delta`` is
  its two-sided ratio clamp, the paper's delta is ``divergence_delta`` (``CONFIG_FIELD``). TRL's fields that mean
  the same as a parameter (``epsilon``, ``epsilon_high``, VESPO's four) are declared so by the parameter
  (``Param.trl_field``).
* ``method="trl"`` trains the rule TRL 1.16's ``GRPOTrainer`` applies for the config (``trl_rule``): a loss type that
  is a rule of its own (cispo, sapo, vespo) is declared where that rule is registered (``MethodSpec.trl``); the
  PPO-clip family (grpo, bnpo, dr_grpo, dapo, luspo) is Clip-Higher with TRL's epsilons, and TRL's ``delta`` makes it
  a dual clip (``two_sided_clip``). TRL's ``delta`` also composes with a rule whose min form has a finite ratio range
  (``range_rule_with_trl_delta``). ``tests/test_trl_options.py`` pins each against TRL's own trainer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from trl import GRPOConfig

import atr_theory as at
from atr_theory.registry import rule_for_trl_loss_type

from ..compat import check_supported_versions
from ..fast_generation import PROMPT_ALLOWANCE
from ..relations import Exclusive
from .fields import (
    GENERATION_RELATIONS,
    ConfigError,
    check_environment,
    check_fields,
    check_installed,
    check_relations_of,
    choice_fields,
    flag_fields,
    number_fields,
    training_domains,
    training_relations,
)
from .library_fields import LIBRARY_FIELDS, check_library_fields, library_values_read

__all__ = ["ATRGRPOConfig", "CONFIG_FIELD", "TRL_METHOD", "config_field", "resolve_method", "trl_rule"]


CONFIG_FIELD = {"delta": "divergence_delta"}
"""Method parameter -> config field, where the names differ (TRL's ``delta`` means something else)."""
_TRL_FIELDS = {f.name: f for f in dataclasses.fields(GRPOConfig)}
TRL_METHOD = "trl"
"""``method="trl"``: the registry rule TRL's GRPOTrainer applies for the config, its parameters read from TRL's
fields."""


def config_field(param: str) -> str:
    """The ``ATRGRPOConfig`` field that holds method parameter ``param``."""
    return CONFIG_FIELD.get(param, param)


# ---------------------------------------------------------------------------------------------------------------
# the method parameters as config fields
# ---------------------------------------------------------------------------------------------------------------
def shared_with_trl() -> tuple[str, ...]:
    """TRL's own GRPOConfig fields that are also method parameters (the clip range of clip-type rules, VESPO's gamma
    weight), as each parameter declares (``atr_theory.Param.trl_field``); their TRL default counts as "not set"
    (then the method's own default applies). Every declaration of a name must agree."""
    declared: dict[str, set[bool]] = {}
    for spec in at.METHODS.values():
        for param, decl in spec.params.items():
            declared.setdefault(config_field(param), set()).add(decl.trl_field)
    mixed = sorted(name for name, flags in declared.items() if len(flags) > 1)
    if mixed:
        raise ValueError(f"parameters {mixed} are declared both with and without trl_field=True: declare them alike")
    return tuple(name for name, flags in declared.items() if True in flags)


def unset_value(name: str):
    """The value of config field ``name`` that means "not set": TRL's default for a shared field, else None."""
    return _TRL_FIELDS[name].default if name in shared_with_trl() else None


def method_fields() -> dict[str, dict]:
    """``{field name: {"param", "default", "help"}}`` for every parameter of every registered method, built from the
    registry alone (the Param's help and domain, and which methods use it with which default). ``ATRGRPOConfig`` has
    one field for each when ``atr_llm.config`` is imported."""
    users: dict[str, list[tuple[str, at.Param]]] = {}
    for name in at.method_names(aliases=False):
        for param, decl in at.METHODS[name].params.items():
            users.setdefault(param, []).append((name, decl))
    out, trl_fields = {}, shared_with_trl()
    for param, used_by in users.items():
        name = config_field(param)
        if (name in _TRL_FIELDS) != (name in trl_fields):
            raise ValueError(
                f"method parameter {param!r} (config field {name!r}) is declared with trl_field="
                f"{name in trl_fields}, but TRL's GRPOConfig {'has' if name in _TRL_FIELDS else 'has no'} a "
                "field of that name: map it in CONFIG_FIELD, or declare its Param with trl_field=True if it means "
                "the same"
            )
        helps = list(dict.fromkeys(d.help for _, d in used_by))
        domains = list(dict.fromkeys(d.domain for _, d in used_by))
        defaults = ", ".join(f"{m} {d.default:g}" for m, d in used_by)
        shared = (
            f" (TRL's field; its default {_TRL_FIELDS[name].default} = the method's default)"
            if name in _TRL_FIELDS
            else ""
        )
        out[name] = {
            "param": param,
            "default": unset_value(name),
            "help": f"{'; '.join(helps)}. Must be {' / '.join(domains)}. Defaults: {defaults}{shared}",
        }
    return out


def method_inputs() -> frozenset[str]:
    """Every config field the resolved method depends on: writing one of them after the config is built resolves
    the method again (``ATRGRPOConfig.__setattr__``)."""
    peers = [f for spec in at.METHODS.values() if spec.trl is not None for f in spec.trl.fields]
    rule_options = ("method_seed", "kl_chunk_size", "measure_true_kl", "dppo_topk")  # only some rules read them
    rule_options += ("use_vllm", "vllm_importance_sampling_correction")  # vespo refuses the two together
    return frozenset(
        ("method", "form", "loss_type", "delta", "epsilon", "epsilon_high", *rule_options, *method_fields(), *peers)
    )


# ---------------------------------------------------------------------------------------------------------------
# TRL's loss types and options, as registry rules
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TRLLossType:
    """What one of TRL's ``loss_type`` values means here: an aggregation of ``atr_theory.AGGREGATIONS`` and whether
    TRL divides the token sum by the generation batch's token count (``num_items_in_batch``) instead."""

    aggregation: str
    by_generation_tokens: bool = False


TRL_CLIP_FAMILY_LOSS_TYPES = {
    "grpo": TRLLossType("seq_mean_token_mean"),
    "bnpo": TRLLossType("token_mean"),
    "dr_grpo": TRLLossType("dr_grpo"),
    "dapo": TRLLossType("token_mean", by_generation_tokens=True),
    "luspo": TRLLossType("seq_mean_token_sum"),
}
"""TRL 1.16's loss_type values that are only an aggregation (``GRPOTrainer._compute_loss``), for its PPO-clip family;
a loss type that is a rule of its own (cispo, sapo, vespo) is declared with that rule (``MethodSpec.trl``)."""


def trl_loss_types() -> dict[str, TRLLossType]:
    """Every TRL ``loss_type`` this package honours, with its aggregation: the PPO-clip family's, then each
    registered rule's ``TRLPeer`` (in registration order)."""
    peers = {
        spec.trl.loss_type: TRLLossType(spec.trl.aggregation, spec.trl.by_generation_tokens)
        for name in at.method_names(aliases=False)
        if (spec := at.METHODS[name]).trl is not None
    }
    return {**TRL_CLIP_FAMILY_LOSS_TYPES, **peers}


def trl_loss_type_rule(loss_type: str) -> str | None:
    """The registry rule TRL's ``loss_type`` is (its ``MethodSpec.trl``), None for the PPO-clip family (grpo, bnpo,
    dr_grpo, dapo, luspo), whose rule is the config's ``method``."""
    spec = rule_for_trl_loss_type(loss_type)
    return None if spec is None else spec.name


def default_method(method: str | None, loss_type: str) -> str:
    """``method`` if given; unset: ``'trl'`` for a loss type that is a rule of its own (cispo, sapo, vespo: TRL's
    rule with TRL's parameters), else ``'atr'`` (the paper's rule)."""
    if method is not None:
        return method
    return TRL_METHOD if trl_loss_type_rule(loss_type) is not None else "atr"


def two_sided_clip(epsilon_low: float, epsilon_high: float, delta: float) -> tuple[str, dict[str, float]]:
    """TRL's ``delta`` (INTELLECT-2's two-sided clipping) on PPO's min with the range ``[1 - epsilon_low, 1 +
    epsilon_high]``: ``min(min(w, delta) A, clip(w) A)``, which is ``dual_clip_higher`` with ``c = delta`` when
    ``delta >= 1 + epsilon_high``, and with the upper bound ``delta`` and ``c = 1 + epsilon_high`` below it."""
    if not (math.isfinite(delta) and delta > 1.0):
        raise ConfigError(
            "delta",
            delta,
            "expected delta > 1 and finite: TRL's two-sided clip caps every ratio at delta, so delta <= 1 leaves no "
            "trust region around w = 1 (INTELLECT-2 uses delta > 1 + epsilon_high; the paper's divergence threshold "
            "is --divergence_delta)",
        )
    if delta >= 1.0 + epsilon_high:
        return "dual_clip_higher", {"epsilon_low": epsilon_low, "epsilon_high": epsilon_high, "dual_clip_c": delta}
    return "dual_clip_higher", {
        "epsilon_low": epsilon_low,
        "epsilon_high": delta - 1.0,
        "dual_clip_c": 1.0 + epsilon_high,
    }


def trl_rule(args) -> tuple[str, dict[str, float]]:
    """The registry rule and parameters that TRL 1.16's GRPOTrainer applies for ``args`` (``method='trl'``).

    ``cispo``: TRL caps the detached weight at ``epsilon_high`` (no lower bound): the registry's cispo with
    ``epsilon_low = 1``, ``epsilon_high = cap - 1``. ``sapo``: ``sapo_temperature_pos / _neg``. ``vespo``: its four
    fields. The PPO-clip family (grpo, bnpo, dr_grpo, dapo, luspo): ``clip_higher(epsilon, epsilon_high or
    epsilon)``; with TRL's ``delta``, ``two_sided_clip`` (tests: TRL's own loss on the same batch)."""
    spec = rule_for_trl_loss_type(args.loss_type)
    if spec is not None:
        return spec.name, spec.trl.params(args)
    eps_low = args.epsilon
    eps_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    delta = getattr(args, "delta", None)
    if delta is None:
        return "clip_higher", {"epsilon_low": eps_low, "epsilon_high": eps_high}
    return two_sided_clip(eps_low, eps_high, delta)


def trl_delta_rules() -> tuple[str, ...]:
    """Rules whose min form is PPO's min with a finite ratio range (``MethodSpec.ratio_range``, at their defaults):
    TRL's ``delta`` composes with them as it does with TRL's own clip (``range_rule_with_trl_delta``)."""
    names = []
    for name in at.method_names(aliases=False):
        spec = at.METHODS[name]
        if spec.ratio_range is not None and math.isfinite(float(spec.ratio_range(**spec.defaults)[1])):
            names.append(name)
    return tuple(names)


def range_rule_with_trl_delta(resolved: at.ResolvedMethod, delta: float) -> tuple[str, dict[str, float]]:
    """``resolved`` (a rule of ``trl_delta_rules``, in its min form) under TRL's ``delta``: TRL's two-sided clip on
    the rule's range, ``two_sided_clip(1 - l, u - 1, delta)``."""
    lower, upper = resolved.spec.ratio_range(**resolved.params)
    return two_sided_clip(1.0 - float(lower), float(upper) - 1.0, delta)


def trl_rule_fields() -> tuple[str, ...]:
    """The TRL fields that ``method='trl'`` reads (they are not stray parameters of the rule it maps to): the PPO-clip
    family's ``epsilon``, ``epsilon_high`` and ``delta``, and every field a rule's ``TRLPeer`` reads."""
    peers = [f for spec in at.METHODS.values() if spec.trl is not None for f in spec.trl.fields]
    return tuple(dict.fromkeys(("epsilon", "epsilon_high", "delta", *peers)))


# ---------------------------------------------------------------------------------------------------------------
# the one resolution
# ---------------------------------------------------------------------------------------------------------------
def is_method_field_set(args, name: str) -> bool:
    """Whether method field ``name`` of ``args`` is set (its value is not the one that means "not set")."""
    value = getattr(args, name, None)
    return value is not None and value != unset_value(name)


def _rule(method: str) -> at.MethodSpec:
    """The registered rule ``method`` names, refused under the field ``method``."""
    try:
        return at.get_method(method)
    except ValueError as e:
        raise ConfigError("method", method, str(e), message=str(e)) from None


def _checked_params(spec: at.MethodSpec, args) -> dict[str, float]:
    """The parameters of ``spec`` that ``args`` sets, each checked against its ``Param`` under its config field's
    name."""
    given = {}
    for param, declaration in spec.params.items():
        name = config_field(param)
        if is_method_field_set(args, name):
            value = getattr(args, name)
            try:
                given[param] = declaration.check(name, value, spec.name)
            except ValueError as e:
                about = f"{declaration.help}; " if declaration.help else ""
                expected = f"expected {declaration.domain} ({about}method {spec.name!r})"
                raise ConfigError(name, value, expected, message=str(e)) from None
    return given


def resolve_method(args) -> at.ResolvedMethod:
    """The rule ``args`` (an ``ATRGRPOConfig``) trains, validated once by ``atr_theory.resolve``: the loss type, the
    method, its form and the parameters it sets (each refused under its config field's name), TRL's loss options
    that cannot be honoured, and parameters set for a method that does not use them. ``method='trl'``: the rule
    ``trl_rule`` reads from TRL's fields; TRL's ``delta`` on a range rule's min form: TRL's two-sided clip on its
    range. A refusal is a ``ConfigError`` naming the field; a relation between a rule's parameters is
    ``atr_theory.resolve``'s ValueError, which names them."""
    loss_types = trl_loss_types()
    if args.loss_type not in loss_types:
        raise ConfigError("loss_type", args.loss_type, f"expected one of {', '.join(loss_types)}")
    implied = trl_loss_type_rule(args.loss_type)
    if implied is not None and args.method != TRL_METHOD:
        raise ConfigError(
            "method",
            args.method,
            f"loss_type={args.loss_type!r} is TRL's {implied} rule with TRL's parameters; leave method unset (or "
            f"'trl') for it, or pick the aggregation of {list(TRL_CLIP_FAMILY_LOSS_TYPES)} to train method "
            f"{args.method!r}",
        )
    if args.method == TRL_METHOD:
        own = set(trl_rule_fields())
        name, given = trl_rule(args)
        spec = at.get_method(name)
        fields = spec.trl.fields if spec.trl is not None else ("epsilon", "epsilon_high", "delta")
        for param, value in given.items():  # a TRL field's value, refused under the TRL fields the rule reads
            try:
                spec.params[param].check(param, value, spec.name)
            except ValueError as e:
                raise ConfigError(
                    fields[0], getattr(args, fields[0]), f"{e} (read from TRL's {', '.join(fields)})"
                ) from None
    else:
        spec = _rule(args.method)
        given, own = _checked_params(spec, args), {config_field(p) for p in spec.params}
    if args.form is not None and args.form not in spec.forms:
        raise ConfigError("form", args.form, f"not available for method {spec.name!r}; available: {list(spec.forms)}")
    resolved = at.resolve(spec.name, args.form, **given)
    delta = getattr(args, "delta", None)
    if delta is not None and args.method != TRL_METHOD:
        if resolved.name not in trl_delta_rules() or resolved.form != "min":
            raise ConfigError(
                "delta",
                delta,
                "TRL's two-sided clip acts on PPO's min with a finite ratio range; "
                f"method={args.method!r} in form {resolved.form!r} has none. Use method='trl' (TRL's own clip), one "
                f"of {sorted(trl_delta_rules())} in form 'min', or method='dual_clip_higher' with dual_clip_c (the "
                "paper's divergence threshold is --divergence_delta)",
            )
        name, params = range_rule_with_trl_delta(resolved, delta)
        resolved = at.resolve(name, "min", **params)
    stray = [n for n in method_fields() if n not in own and is_method_field_set(args, n)]
    if stray:
        own_shown = ", ".join(sorted(own)) or "none"
        raise ConfigError(
            stray[0],
            getattr(args, stray[0]),
            f"set, but method {args.method!r} does not use it (its parameters: {own_shown})",
        )
    folds = resolved.spec.trl is not None and resolved.spec.trl.folds_vllm_ratio
    if folds and args.use_vllm and args.vllm_importance_sampling_correction:
        raise ConfigError(
            "vllm_importance_sampling_correction",
            True,
            f"TRL folds vLLM's importance ratios into {resolved.name.upper()}'s sequence weight, which "
            "ATRGRPOTrainer does not (untested without vLLM); set it to false or use another loss type",
        )
    rule_options_read(args, resolved)
    return resolved


def rule_options_read(args, resolved: at.ResolvedMethod) -> None:
    """Refuse an option only some rules read, set for one that does not: ``method_seed`` seeds the random choice of
    a stochastic rule (``MethodSpec.stochastic``: clip_cov); ``kl_chunk_size`` chunks the full-vocabulary KL of a
    rule that needs the full distributions (tr_ppo, truly_ppo) or of ``measure_true_kl``; ``dppo_topk`` is the K of a
    rule that reads the top-K (``MethodSpec.needs_topk``: dppo_topk_tv, dppo_topk_kl)."""
    from .fields import is_set

    for option, flag, not_read, readers in (  # an option a rule reads where its MethodSpec flag is set
        ("method_seed", "stochastic", "draws nothing to seed", "the rules that draw"),
        ("dppo_topk", "needs_topk", "reads no top-K", "the rules that do"),
    ):
        if is_set(args, option) and not getattr(resolved.spec, flag):
            names = sorted(n for n in at.method_names(aliases=False) if getattr(at.METHODS[n], flag))
            raise ConfigError(
                option, getattr(args, option), f"rule {resolved.name!r} {not_read} ({readers}: {', '.join(names)})"
            )
    if is_set(args, "kl_chunk_size") and not (resolved.spec.needs_full_distributions or args.measure_true_kl):
        raise ConfigError(
            "kl_chunk_size",
            args.kl_chunk_size,
            f"rule {resolved.name!r} computes no full-vocabulary KL to chunk (tr_ppo, truly_ppo or measure_true_kl do)",
        )


# ---------------------------------------------------------------------------------------------------------------
# when no rule can act
# ---------------------------------------------------------------------------------------------------------------
def clipping_is_inert(args) -> bool:
    """True when every ratio ``w = pi / pi_old`` is 1 (up to forward-pass noise), so no clipping rule can act.

    That is the case whenever ``gradient_accumulation_steps`` is a multiple of ``steps_per_generation *
    num_iterations``: every use of a generated batch falls inside one optimizer step, so no update separates
    generation from the loss. TRL then either skips old log-probs (``old = logp.detach()``) or -- with vLLM
    importance sampling -- computes them with the very parameters the loss sees.
    """
    generate_every = args.steps_per_generation * args.num_iterations
    return args.gradient_accumulation_steps % generate_every == 0


def inert_clipping_message(args) -> str:
    vllm = bool(getattr(args, "use_vllm", False) and getattr(args, "vllm_importance_sampling_correction", False))
    how = (
        "TRL computes old log-probs for vLLM's importance sampling, but with the very parameters the loss sees"
        if vllm
        else "TRL never computes old log-probs and uses the current ones instead"
    )
    return (
        f"Clipping is inert with this configuration: gradient_accumulation_steps={args.gradient_accumulation_steps} is a "
        f"multiple of steps_per_generation * num_iterations = {args.steps_per_generation} * {args.num_iterations}, so "
        f"{how}: every likelihood ratio w is exactly 1 and "
        f"method {args.method!r} behaves like plain policy gradient. To make clipping act, reuse each generated batch: "
        "set num_iterations >= 2 (our presets use 2), or steps_per_generation > gradient_accumulation_steps."
    )


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
    dppo_topk: int = field(
        default=at.methods.vocab_topk_masks.DEFAULT_TOPK,
        metadata={
            "help": "dppo_topk_tv / dppo_topk_kl: K, the old policy's most likely tokens other than the sampled one "
            "whose log-probs are kept per position at generation (memory K x T; at most the vocabulary size - 1)"
        },
    )
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
    kl_estimator: str = field(
        default="trl_k3",
        metadata={
            "help": "the per-token estimate of the KL to the reference model that beta weighs (atr_theory.reference_kl): "
            "'trl_k3' (TRL's unclamped k3, the default) or one of verl 0.9.1's kl_penalty names: kl / k1, abs, mse / "
            "k2, low_var_kl / k3 (clamped as verl clamps it), each also with '+' (its value, k2's gradient)"
        },
    )
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
        library_values_read(self)  # scale_rewards True / False as TRL reads them
        check_fields(self, training_domains(), others=_METHOD_INPUTS)  # before TRL and transformers read them
        check_library_fields(self)
        check_relations_of(GENERATION_RELATIONS, (self,))  # TRL's own check names none of the fields it reads
        super().__post_init__()
        self.method = default_method(self.method, self.loss_type)
        self._resolved_method = resolve_method(self)
        check_relations_of(training_relations(), (self,))
        check_installed(self)

    @property
    def resolved_method(self) -> at.ResolvedMethod:
        """The validated method, form and parameter values, resolved when the config was built (and again when a
        field the method depends on is written: ``__setattr__``); reading it resolves nothing."""
        if "_resolved_method" not in self.__dict__:  # a config unpickled from a checkpoint's training_args.bin
            self._resolved_method = resolve_method(self)
        return self._resolved_method

    def __setattr__(self, name, value):
        """A field written after the config was built meets the constructor's checks again: its domain, the
        relations it takes part in, and the method (resolved again when the field is one the rule reads); a refused
        value leaves the config as it was."""
        if "_resolved_method" not in self.__dict__ or name not in _CHECKED_AFTER_BUILD:  # building, or unchecked
            return super().__setattr__(name, value)
        before = getattr(self, name)
        super().__setattr__(name, value)
        try:
            check_fields(self, training_domains(), only=name, others=_METHOD_INPUTS)
            check_library_fields(self, only=name)
            if name in _RELATED:
                check_relations_of(_AFTER_TRL, (self,))
            if name in _METHOD_INPUTS:
                self._resolved_method = resolve_method(self)
            if name in _INSTALLED:  # use_vllm, use_liger_kernel, deepspeed: their packages
                check_installed(self)
        except ValueError:
            super().__setattr__(name, before)
            raise

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_resolved_method", None)  # resolved again when read (the registry's spec holds functions)
        return state


_METHOD_INPUTS = method_inputs()
_AFTER_TRL = (*(r for r in GENERATION_RELATIONS if not isinstance(r, Exclusive)), *training_relations())
"""The relations a field written after the config was built meets (TRL sets both steps_per_generation and
generation_batch_size when the config is built: their exclusion holds for what was given only)."""
_RELATED = frozenset(n for relation in _AFTER_TRL for n in relation.names)
_INSTALLED = frozenset({"use_vllm", "use_liger_kernel", "deepspeed"})
_CHECKED_AFTER_BUILD = frozenset(
    {
        *_METHOD_INPUTS,
        *_RELATED,
        *training_domains(),
        *flag_fields(ATRGRPOConfig),
        *number_fields(ATRGRPOConfig),
        *choice_fields(ATRGRPOConfig),
        *LIBRARY_FIELDS,
        *_INSTALLED,
        "lr_scheduler_type",
    }
)
