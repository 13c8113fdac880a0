"""Which rule a configuration trains, checked before any model loads: the method's config fields (derived from the
registry), the mapping of TRL's own options onto a registry rule (``method="trl"``, TRL's ``delta`` on a range rule's
min form), the refusals of what cannot be honoured, TRL / transformers domains they check only late, and whether a
configuration leaves clipping inert. ``ATRGRPOConfig`` (``atr_llm.trainer``) calls these when it is built."""

from __future__ import annotations

import dataclasses

from trl import GRPOConfig

import atr_theory as at

from .trl_options import (
    TRL_CLIP_FAMILY_LOSS_TYPES,
    TRL_METHOD,
    range_rule_with_trl_delta,
    trl_delta_rules,
    trl_loss_type_rule,
    trl_loss_types,
    trl_rule,
    trl_rule_fields,
)

# A method parameter becomes a config field of the same name, except where TRL's GRPOConfig already has
# a field of that name with another meaning: TRL's `delta` is its two-sided ratio clamp, the paper's
# delta is a divergence threshold. TRL's loss options (the rule's fields, delta, the layers) are mapped in trl_options.
CONFIG_FIELD = {"delta": "divergence_delta"}
_TRL_FIELDS = {f.name: f for f in dataclasses.fields(GRPOConfig)}


def config_field(param: str) -> str:
    """The ATRGRPOConfig field that holds method parameter ``param``."""
    return CONFIG_FIELD.get(param, param)


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


def _unset_value(name: str):
    """The value of config field ``name`` that means "not set": TRL's default for a shared field, else None."""
    return _TRL_FIELDS[name].default if name in shared_with_trl() else None


def method_config_fields() -> dict[str, dict]:
    """``{field name: {"param", "default", "help"}}`` for every parameter of every registered method,
    built from the registry alone (the Param's help and domain, and which methods use it with which default)."""
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
            "default": _unset_value(name),
            "help": f"{'; '.join(helps)}. Must be {' / '.join(domains)}. Defaults: {defaults}{shared}",
        }
    return out


TRL_IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
"""TRL 1.16's values of ``importance_sampling_level`` (its loss raises on any other, after the run has started)."""


def trl_domains() -> dict:
    """TRL and transformers fields whose domain the libraries check only once training runs (or never), declared
    once (atr_llm.cli's types): ``importance_sampling_level`` (TRL: 'token' or 'sequence'), ``top_entropy_quantile``
    (TRL's documented range [0, 1]) and ``report_to`` (transformers' integrations, 'all' or 'none'). The command
    line refuses them while parsing (``python -m atr_llm.train``'s declaration holds them) and ``check_trl_domains``
    on a config built in Python."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    from .cli_types import OneOf, Real

    return {
        "importance_sampling_level": OneOf(TRL_IMPORTANCE_SAMPLING_LEVELS),
        "top_entropy_quantile": Real(0, 1),
        "report_to": OneOf(["none", "all", *sorted(INTEGRATION_TO_CALLBACK)]),
    }


def check_trl_domains(args) -> None:
    """``args``' values of the ``trl_domains()`` fields, each refused under the field's own name (a list, as
    ``report_to``, item by item) before anything is done."""
    import argparse

    for name, declaration in trl_domains().items():
        value = getattr(args, name, None)
        for item in value if isinstance(value, (list, tuple)) else [] if value is None else [value]:
            try:
                declaration.check(item)
            except argparse.ArgumentTypeError as e:
                raise ValueError(f"{name} {e}") from None


def _is_set(args, name: str) -> bool:
    value = getattr(args, name, None)
    return value is not None and value != _unset_value(name)


def _given_params(args) -> dict[str, float]:
    """The parameters of ``args.method`` (a registry rule) that the config sets."""
    spec = at.get_method(args.method)
    return {p: getattr(args, config_field(p)) for p in spec.params if _is_set(args, config_field(p))}


def _trl_delta_composes(args) -> bool:
    """TRL's ``delta`` is set on a rule whose min form is a ratio range, trained in that form."""
    if args.method == TRL_METHOD or getattr(args, "delta", None) is None:
        return False
    spec = at.get_method(args.method)
    return spec.name in trl_delta_rules() and (args.form or spec.default_form) == "min"


def configured_rule(args) -> tuple[str, dict[str, float]]:
    """The registry rule ``args`` trains with and the parameters the config sets (the others take the rule's
    default): ``args.method`` and its fields; for ``method='trl'`` the rule and parameters ``trl_rule`` reads from
    TRL's fields; with TRL's ``delta`` on a range rule's min form, TRL's two-sided clip on its range
    (``range_rule_with_trl_delta``: ``dual_clip_higher``)."""
    if args.method == TRL_METHOD:
        return trl_rule(args)
    if _trl_delta_composes(args):
        return range_rule_with_trl_delta(args.method, _given_params(args), args.delta)
    return at.get_method(args.method).name, _given_params(args)


def rule_name(args) -> str:
    """The registry rule ``args`` trains with (``configured_rule``)."""
    return configured_rule(args)[0]


def method_params(args) -> dict[str, float]:
    """The parameters of ``rule_name(args)`` that the config sets (``configured_rule``)."""
    return configured_rule(args)[1]


def check_method_config(args) -> at.ResolvedMethod:
    """Fail fast (before any model is loaded): the method choice through ``atr_theory.resolve``, the loss
    type, parameters set for a method that does not use them, and TRL loss options that cannot be honoured."""
    loss_types = trl_loss_types()
    if args.loss_type not in loss_types:
        raise ValueError(f"loss_type {args.loss_type!r} is not supported; use one of {list(loss_types)}")
    implied = trl_loss_type_rule(args.loss_type)
    if implied is not None and args.method != TRL_METHOD:
        family = list(TRL_CLIP_FAMILY_LOSS_TYPES)
        raise ValueError(
            f"method={args.method!r} with loss_type={args.loss_type!r}: that loss type is TRL's {implied} rule with "
            f"TRL's parameters; leave method unset (or 'trl') for it, or pick the aggregation of {family} to train "
            f"method {args.method!r}"
        )
    if args.method == TRL_METHOD:
        own = set(trl_rule_fields())
    else:
        spec = at.get_method(args.method)
        given = _given_params(args)
        for param, value in given.items():  # each value first, under the name the user typed
            spec.params[param].check(config_field(param), value, spec.name)
        own = {config_field(p) for p in spec.params}
        if getattr(args, "delta", None) is not None:
            if not _trl_delta_composes(args):
                form = args.form or spec.default_form
                raise ValueError(
                    f"delta={args.delta!r} is set: TRL's two-sided clip acts on PPO's min with a finite ratio range; "
                    f"method={args.method!r} in form {form!r} has none. Use method='trl' (TRL's own clip), one of "
                    f"{sorted(trl_delta_rules())} in form 'min', or method='dual_clip_higher' with dual_clip_c (the "
                    "paper's divergence threshold is --divergence_delta)"
                )
            at.resolve(spec.name, args.form, **given)  # the rule itself first, then TRL's delta on its range
    name, given = configured_rule(args)
    resolved = at.resolve(name, args.form, **given)
    stray = [n for n in method_config_fields() if n not in own and _is_set(args, n)]
    if stray:
        shown = ", ".join(f"{n}={getattr(args, n)!r}" for n in stray)
        own_shown = ", ".join(sorted(own)) or "none"
        raise ValueError(f"{shown} set, but method {args.method!r} does not use it (its parameters: {own_shown})")
    if resolved.name == "vespo" and args.use_vllm and args.vllm_importance_sampling_correction:
        raise ValueError(
            "loss_type='vespo' with use_vllm and vllm_importance_sampling_correction: TRL folds vLLM's importance "
            "ratios into VESPO's sequence weight, which ATRGRPOTrainer does not (untested without vLLM); set "
            "vllm_importance_sampling_correction=False or use another loss type"
        )
    return resolved


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
