r"""The method registry: the shapes every clipping rule shares (``TokenBatch`` in, ``MethodResult`` out),
each parameter's declaration (``Param``: default, domain, help), ``register`` and ``resolve``.

The rules themselves are in ``atr_theory.methods``, which re-exports every name here.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

__all__ = [
    "FORMS",
    "READINGS",
    "METHODS",
    "MethodResult",
    "MethodSpec",
    "Param",
    "PeerCode",
    "Relation",
    "ResolvedMethod",
    "TRLPeer",
    "TokenBatch",
    "get_method",
    "method_names",
    "register",
    "rule_for_trl_loss_type",
    "resolve",
    "unregister",
]

FORMS = ("min", "mask", "soft", "none")
"""``min``: a rule's clip inside PPO's pessimistic min; ``mask``: pure clip (keep ``w A`` where the rule's constraint
holds, else the constant ``A``); ``soft``: a smooth gate; ``none``: no clipping. See ``READINGS``."""

READINGS = {
    "min": "the Section 2 surrogate (the general clip inside PPO's min)",
    "mask": "the Section 4 pure-clip objective (the mask form)",
}
"""The two readings of the paper, named for what they are (``docs/theory.md#two-readings-of-the-paper``):

* ``min``: Sec. 2 (tex lines 234-244) defines one surrogate, ``E[min(w A, clip(w, .) A)]``, and names objectives by
  the clip operator plugged into it (270-272); the general operator (Eq. 5, 278-285) is that operator and ATR-GRPO
  sets its constraint to ``KL3 <= delta`` (364-365); the experiments ran in TRL and Unsloth "varying only the
  clipping mechanism" (503-507, 1030), and TRL's loss is this min. A range rule in this form has PPO's gradient with
  its range (Thm 3.1 under the min-vs-min pairing).
* ``mask``: Sec. 4's proofs (773-781) write both objectives without the min: ``E[clip(w, l, u) A]``, whose gradient is
  the general operator's alone (keep ``w A`` where the constraint holds, else the constant ``A``).

Neither reading is the paper's alone; every rule with a ratio range defaults to ``min`` (what its source trains)."""

@dataclass
class TokenBatch:
    """What a method sees. All tensors are (B, T) unless noted; ``mask`` is boolean; ``log_ratio``, ``advantages``,
    ``logp``, ``old_logp`` and ``position_kl`` are zero on padding (``atr_theory.policy_loss`` replaces whatever
    the caller had there)."""

    log_ratio: torch.Tensor  # log w = logp - old_logp, zero on padding, clamped to +-LOG_RATIO_CLAMP
    advantages: torch.Tensor
    mask: torch.Tensor
    logp: torch.Tensor
    old_logp: torch.Tensor
    form: str
    generator: torch.Generator | None = None
    old_full_logp: torch.Tensor | None = None  # (B, T, V)
    full_logp: torch.Tensor | None = None  # (B, T, V)
    kl_chunk_size: int | None = None
    position_kl: torch.Tensor | None = None  # (B, T) KL(pi_old || pi) per position, instead of the full distributions
    old_topk_logp: torch.Tensor | None = None  # (B, T, K) pi_old's log-probs of its K most likely other tokens
    topk_logp: torch.Tensor | None = None  # (B, T, K) pi's log-probs of those same tokens


@dataclass
class MethodResult:
    """Per-token objective (to maximise) and which tokens kept / lost their gradient.

    The boolean flags are computed lazily by ``flags()`` (metrics and tests need them, the training
    step does not): ``kept`` = the token's objective depends on theta through w; ``clipped_low`` /
    ``clipped_high`` = it lost that dependence because w was too low / too high (or, for penalty
    methods, it was penalised).
    """

    objective: torch.Tensor
    flags: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(repr=False)
    mask_form_kept: Callable[[], torch.Tensor] | None = field(default=None, repr=False)
    """A rule with a mask form, run in another form: the tokens its mask form would keep (where its constraint
    holds), computed when called from this evaluation's own tensors, so reading the forms metric
    (``LossOutput.outside``) never evaluates the rule a second time. ``None`` where the rule cannot say without a
    second evaluation (``clip_cov``: its mask form would draw its random tokens among other candidates)."""

    @cached_property
    def _resolved(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return tuple(f.detach() for f in self.flags())

    @property
    def kept(self) -> torch.Tensor:
        return self._resolved[0]

    @property
    def clipped_low(self) -> torch.Tensor:
        return self._resolved[1]

    @property
    def clipped_high(self) -> torch.Tensor:
        return self._resolved[2]


@dataclass(frozen=True)
class Param:
    r"""One method parameter, declared once: its default, its domain and a one-line help text.

    The domain is a finite real number with optional bounds: ``gt`` / ``ge`` (lower, open / closed)
    and ``lt`` / ``le`` (upper). Everything that validates, documents or exposes a parameter
    (``policy_loss``, the trainer config and its ``--help``, the presets, the README's methods table)
    reads it from here.

    Examples
    --------
    >>> Param(0.07, gt=0, help="KL3 threshold").check("delta", 0.0, "atr")
    Traceback (most recent call last):
    ...
    ValueError: delta must be a finite number > 0 (KL3 threshold), got 0.0 (method 'atr')
    """

    default: float
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    help: str = ""
    verl: tuple[tuple[str, str], ...] = ()
    """The verl config fields this parameter is read from, each ``(section, field)`` with section ``"actor"`` (verl's
    ``ActorConfig``) or ``"policy_loss"`` (its ``policy_loss`` sub-config); with two, they must agree (PPO's one
    ``epsilon`` from verl's ``clip_ratio_low`` and ``clip_ratio_high``). Empty: only ``atr_params`` /
    ``$ATR_GRPO_PARAMS`` set it (``atr_llm.verl.plugin``)."""
    trl_field: bool = False
    """The trainer config's field of this name is TRL's own ``GRPOConfig`` field (``epsilon``, ``epsilon_high``,
    VESPO's four): TRL's default there means "not set" (then the rule's default applies)."""

    def with_default(self, default: float) -> Param:
        """The same parameter (domain, help) with another default, for a method that uses another value."""
        return replace(self, default=default)

    @property
    def domain(self) -> str:
        """The domain in words: ``'a finite number > 0'``, ``'in [0, 1)'``, ``'finite'``."""
        lo = (self.gt, "(") if self.gt is not None else (self.ge, "[") if self.ge is not None else None
        hi = (self.lt, ")") if self.lt is not None else (self.le, "]") if self.le is not None else None
        if lo and hi:
            return f"in {lo[1]}{lo[0]:g}, {hi[0]:g}{hi[1]}"
        if lo:
            return f"a finite number {'>' if lo[1] == '(' else '>='} {lo[0]:g}"
        if hi:
            return f"a finite number {'<' if hi[1] == ')' else '<='} {hi[0]:g}"
        return "a finite number"

    def check(self, name: str, value: Any, method: str) -> float:
        """``float(value)`` if it is a real number (not a bool, string or tensor) inside the domain, else ValueError."""
        where = f"(method {method!r})"
        if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
            raise ValueError(f"{name} must be a real number, got {type(value).__name__} {value!r} {where}")
        try:
            v = float(value)
        except OverflowError:  # an integer beyond any float (10**400)
            v = math.inf
        ok = math.isfinite(v)
        ok = ok and (self.gt is None or v > self.gt) and (self.ge is None or v >= self.ge)
        ok = ok and (self.lt is None or v < self.lt) and (self.le is None or v <= self.le)
        if not ok:
            what = f" ({self.help})" if self.help else ""
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            raise ValueError(f"{name} must be {self.domain}{what}, got {shown} {where}")
        return v


@dataclass(frozen=True)
class Relation:
    """A condition between parameters of one method, e.g. ``cov_lb < cov_ub``."""

    text: str
    holds: Callable[[Mapping[str, float]], bool]


@dataclass(frozen=True)
class TRLPeer:
    """TRL 1.16's ``GRPOTrainer`` trains this rule for ``loss_type``: the ``GRPOConfig`` ``fields`` it reads, the rule's
    parameters from a config (``params(config) -> {name: value}``), and the loss metrics TRL logs for it under
    TRL's names (``metrics(out, advantages, log_ratio, params, mean) -> {name: value}``: ``out`` the
    ``LossOutput``, ``advantages`` (B, 1) or (B, T), ``log_ratio`` the token log-ratios, ``params`` the rule's
    parameters, ``mean`` averaging a boolean (B, T) flag as TRL does), and how TRL aggregates that loss type: an
    ``atr_theory.AGGREGATIONS`` name, and whether TRL divides the token sum by the generation batch's token count
    (``num_items_in_batch``) instead. ``folds_vllm_ratio``: TRL folds vLLM's importance-sampling ratio into the
    rule's own weight (VESPO's sequence weight) instead of multiplying the loss by it, which the package's trainer
    does not reproduce, so it refuses that pairing. ``tests/test_trl_options.py`` pins each against TRL's own loss
    and metrics on the same batch."""

    loss_type: str
    fields: tuple[str, ...]
    params: Callable[[Any], dict[str, float]]
    metrics: Callable[..., dict[str, float]]
    aggregation: str
    by_generation_tokens: bool = False
    folds_vllm_ratio: bool = False


@dataclass(frozen=True)
class PeerCode:
    """Another library ships this rule, neither TRL nor verl (those have ``TRLPeer`` and ``verl_loss_mode``): the
    ``peer`` and the release read, its ``name`` for the rule (a config value or field), its config ``fields`` each
    with the parameter it sets (``(theirs, ours)``), the file and lines of its code the rule matches (``source``) and
    the test that runs that code on the rule's batches (``oracle``). ``atr_theory.docs.peers_markdown`` lists it in
    the peer table of ``docs/methods.md``."""

    peer: str
    name: str
    fields: tuple[tuple[str, str], ...]
    source: str
    oracle: str


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: its function, parameters, forms and reference."""

    name: str
    fn: Callable[..., MethodResult]
    params: Mapping[str, Param] = field(default_factory=dict)
    default_form: str = "min"
    forms: tuple[str, ...] = ("min", "mask")
    reference: str = ""
    needs_full_distributions: bool = False
    relations: tuple[Relation, ...] = ()
    aliases: tuple[str, ...] = ()
    ratio_mask_gradient: bool = False
    """The token gradient is ``kept * w A grad log pi`` in every form (``kept`` from the flags): a rule of Eq. 5, PPO's
    min, a dual clip, dropped tokens. ``atr_theory.bandit.exact_gradient`` uses it (test: against autograd)."""
    reference_form: Callable[..., torch.Tensor] | None = None
    """The rule as a textbook formula, written beside the fast path and sharing no helper with it:
    ``(logp, old_logp, advantages, mask, *, <params>[, form]) -> (B, T) objective`` (``tests/test_reference.py``
    compares the two; rules without one are pinned by brute force in ``tests/test_oracles.py``)."""
    trl: TRLPeer | None = None
    """Where TRL ships this rule as a ``loss_type`` of its own: how its config maps onto it (``TRLPeer``)."""
    verl_loss_mode: str | None = None
    """verl 0.9.1's own ``policy_loss.loss_mode`` that computes this rule, each parameter read from its ``Param.verl``
    fields (``tests/test_verl_oracle.py`` compares verl's mode with ``policy_loss`` on the same batch and config)."""
    ratio_range: Callable[..., tuple[float, float]] | None = None
    """A rule whose min form is PPO's min ``min(w A, clip(w, l, u) A)`` with one constant ratio range:
    ``ratio_range(**params) -> (l, u)`` (``u`` may be ``inf``). TRL's ``delta`` composes with such a rule, where ``u``
    is finite, as with TRL's own clip (``atr_llm.trl_options``); ``tests/test_registry.py`` checks each declaration
    against PPO's min written out."""

    stochastic: bool = False
    """The rule draws from ``TokenBatch.generator`` (Clip-Cov's random token choice): the trainer's ``method_seed``
    seeds it, and is refused for a rule that draws nothing."""
    peers: tuple[PeerCode, ...] = ()
    """Other libraries' code that computes this rule (``PeerCode``), each pinned by its ``oracle`` test."""
    needs_topk: bool = False
    """The rule reads, besides the sampled tokens, both policies' log-probs of the old policy's K most likely other
    tokens at each position (``TokenBatch.old_topk_logp`` / ``topk_logp``, (B, T, K); ``atr_theory.topk_logps``
    gathers them): the top-K DPPO rules."""

    @property
    def sampled_tokens_only(self) -> bool:
        """The rule reads only the sampled tokens' log-probs (neither the full distributions nor the top-K): a
        ``policy_loss`` call with ``logp``, ``old_logp``, ``advantages`` and ``mask`` alone computes it."""
        return not (self.needs_full_distributions or self.needs_topk)

    @property
    def defaults(self) -> dict[str, float]:
        """``{parameter: default}``."""
        return {k: p.default for k, p in self.params.items()}

    @property
    def summary(self) -> str:
        """The first paragraph of the method's docstring, on one line."""
        first = (self.fn.__doc__ or "").strip().split("\n\n")[0]
        return " ".join(first.split())


METHODS: dict[str, MethodSpec] = {}


def unclipped_result(objective: torch.Tensor, batch: TokenBatch) -> MethodResult:
    """``objective`` with every token kept and none clipped (a rule that reweights or penalises)."""
    return MethodResult(
        objective, lambda: (torch.ones_like(batch.mask), torch.zeros_like(batch.mask), torch.zeros_like(batch.mask))
    )


def register(
    name: str,
    *,
    params: Mapping[str, Param],
    default_form: str,
    forms: tuple[str, ...],
    reference: str,
    needs_full_distributions: bool = False,
    aliases: tuple[str, ...] = (),
    relations: tuple[Relation, ...] = (),
    ratio_mask_gradient: bool = False,
    reference_form: Callable[..., torch.Tensor] | None = None,
    trl: TRLPeer | None = None,
    ratio_range: Callable[..., tuple[float, float]] | None = None,
    verl_loss_mode: str | None = None,
    stochastic: bool = False,
    needs_topk: bool = False,
    peers: tuple[PeerCode, ...] = (),
) -> Callable[[Callable[..., MethodResult]], Callable[..., MethodResult]]:
    """Decorator: register ``fn`` under ``name`` (and ``aliases``) in ``METHODS``.

    ``params`` maps each parameter of ``fn`` (after the batch) to its ``Param``; the function's
    signature must name exactly those parameters. ``reference_form`` (``MethodSpec.reference_form``) takes them as
    keywords, and ``form`` when the rule has the form ``"min"`` or ``"mask"``.
    """
    if reference_form is not None:
        wanted = ["logp", "old_logp", "advantages", "mask", *params, *(("form",) if {"min", "mask"} & set(forms) else ())]
        takes = list(inspect.signature(reference_form).parameters)
        if takes != wanted:
            raise ValueError(f"method {name!r}: its reference form takes {takes}, expected {wanted}")
    for key, p in params.items():
        if not isinstance(p, Param):
            raise TypeError(f"parameter {key!r} of method {name!r} must be declared as Param(...), got {p!r}")
    if default_form not in forms or not set(forms) <= set(FORMS):
        raise ValueError(f"method {name!r}: forms {forms} must be among {FORMS} and include {default_form!r}")

    def deco(fn: Callable[..., MethodResult]) -> Callable[..., MethodResult]:
        signature = list(inspect.signature(fn).parameters)[1:]
        if signature != list(params):
            raise ValueError(f"method {name!r}: the function takes {signature}, the declaration lists {list(params)}")
        spec = MethodSpec(
            name,
            fn,
            MappingProxyType(dict(params)),
            default_form,
            forms,
            reference,
            needs_full_distributions,
            tuple(relations),
            tuple(aliases),
            ratio_mask_gradient,
            reference_form,
            trl,
            verl_loss_mode,
            ratio_range,
            stochastic,
            tuple(peers),
            needs_topk,
        )
        for key in (name, *aliases):
            if key in METHODS:
                raise ValueError(f"method {key!r} is already registered")
        if trl is not None and rule_for_trl_loss_type(trl.loss_type) is not None:
            raise ValueError(f"method {name!r}: TRL's loss_type {trl.loss_type!r} is already another rule's")
        for key in (name, *aliases):
            METHODS[key] = spec
        return fn

    return deco


def unregister(name: str) -> None:
    """Remove a method and its aliases from ``METHODS`` (for plugins and tests)."""
    spec = get_method(name)
    for key in (spec.name, *spec.aliases):
        METHODS.pop(key, None)


def get_method(name: str) -> MethodSpec:
    """The spec registered under ``name``; an unknown name raises ValueError listing the known ones."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}") from None


def rule_for_trl_loss_type(loss_type: str) -> MethodSpec | None:
    """The registered rule TRL trains for its ``loss_type`` (``MethodSpec.trl``), None for a loss type that is only an
    aggregation (TRL's PPO-clip family: grpo, bnpo, dr_grpo, dapo, luspo)."""
    return next((s for s in METHODS.values() if s.trl is not None and s.trl.loss_type == loss_type), None)


def method_names(aliases: bool = True) -> list[str]:
    """Registered method names, sorted; ``aliases=False`` lists each method once (under its own name)."""
    return sorted(k for k, spec in METHODS.items() if aliases or k == spec.name)


@dataclass(frozen=True)
class ResolvedMethod:
    """A validated choice: the method's spec, its form and every parameter's value."""

    spec: MethodSpec
    form: str
    params: Mapping[str, float]

    @property
    def name(self) -> str:
        return self.spec.name


def resolve(method: str, form: str | None = None, **params: Any) -> ResolvedMethod:
    r"""Validate a method choice once: name, form, parameter names, each value's domain, relations.

    ``form=None`` picks the method's default form; parameters not given take their declared defaults.
    ``atr_theory.policy_loss`` and the trainer's config both call this (the trainer at config
    time, before any model is loaded).

    Examples
    --------
    >>> r = resolve("atr")
    >>> r.name, r.form, dict(r.params)
    ('atr', 'min', {'delta': 0.07})
    >>> resolve("clip", epsilon=1.5)
    Traceback (most recent call last):
    ...
    ValueError: epsilon must be in [0, 1) (PPO clip range: keep w in [1 - epsilon, 1 + epsilon]), got 1.5 (method 'clip')
    """
    spec = get_method(method)
    if form is None:
        form = spec.default_form
    if form not in spec.forms:
        raise ValueError(f"form {form!r} is not available for method {spec.name!r}; available: {list(spec.forms)}")
    unknown = set(params) - set(spec.params)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {sorted(unknown)} for method {spec.name!r}; "
            f"its parameters are {sorted(spec.params) or 'none'}"
        )
    values = {k: p.check(k, params.get(k, p.default), spec.name) for k, p in spec.params.items()}
    for rel in spec.relations:
        if not rel.holds(values):
            shown = ", ".join(f"{k}={values[k]!r}" for k in values)
            raise ValueError(f"method {spec.name!r} needs {rel.text}, got {shown}")
    return ResolvedMethod(spec, form, MappingProxyType(values))
