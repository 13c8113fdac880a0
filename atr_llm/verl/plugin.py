"""Every method of ``atr_theory.METHODS`` as a verl (0.9.1) policy loss, computed by ``atr_theory.policy_loss``.

Loading: verl imports every ``verl.plugins`` entry point when ``verl`` is imported, and this package declares
one (``pyproject.toml``), so installing atr-grpo next to verl is enough; ``VERL_USE_EXTERNAL_MODULES=
atr_llm.verl.plugin`` does the same explicitly. Then ``actor_rollout_ref.actor.policy_loss.loss_mode=atr_grpo_atr``
(or ``atr_grpo_<method>`` for any registered method) selects it, on every Ray worker that imports verl.

What each call does: ``atr_theory.policy_loss`` computes the method's per-token objective (unchanged, validated);
verl's own ``agg_loss`` aggregates it with verl's ``loss_agg_mode`` and ``config.global_batch_info``, so the
data-parallel normalisation (global token counts, ``seq-mean-token-sum-norm``'s horizon) is exactly verl's.
``rollout_is_weights`` multiply the per-token objective (``token_weights``), as in verl's own losses.

Parameters: verl's fields map onto ours where they mean the same thing, as each parameter declares where it is
registered (``atr_theory.Param.verl``; ``config_fields_read`` lists them): ``clip_ratio_low`` / ``clip_ratio_high``
-> ``epsilon_low`` / ``epsilon_high`` (``epsilon`` when a method has one symmetric range: then the two must be equal;
GMPO's log-space bounds and CISPO's weight bounds too), ``clip_ratio_c`` -> ``dual_clip_c``, DPPO's
``clip_ratio_low`` / ``clip_ratio_high`` / ``clip_ratio_c`` -> ``delta_low`` / ``delta_high`` / ``is_cap``,
``clip_cov_*`` / ``kl_cov_ratio`` / ``ppo_kl_coef`` -> Clip-Cov / KL-Cov's, ``tau_pos`` / ``tau_neg`` -> SAPO's. Parameters verl has no field for
(``delta``, ``alpha``, ...) go in verl's own config, so that verl's config dump records them: the policy-loss
config class ``atr_llm.verl.config.PolicyLossConfig`` (verl's, plus one field ``atr_params``) is selected by
``_target_``, e.g. ``actor_rollout_ref.actor.policy_loss._target_=atr_llm.verl.config.PolicyLossConfig
'+actor_rollout_ref.actor.policy_loss.atr_params={delta:0.05}'``. The environment variable ``ATR_GRPO_PARAMS``
(a JSON object, ``ATR_GRPO_PARAMS='{"delta": 0.05}'``, passed to the workers through Ray's ``runtime_env``) is the
fallback when the config has none; both set and different is refused. A name the method does not take, or a value
outside its domain, raises at the first loss call (malformed JSON already at import). The same object configures
the loss layers (``layers_from_params``): ``{"rollout_correction": {...}, "sequence_mask": {...}}`` gives any
method verl's rollout correction and rejection, e.g. ATR in verl's bypass mode.
Metrics: verl's names (``actor/pg_clipfrac`` = fraction of valid tokens whose gradient was removed, ``actor/pg_clipfrac_lower`` = those
clipped because w was too low, ``actor/ppo_kl`` = mean ``-log w``) plus ours under ``actor/atr_*``, and each numeric
parameter the loss ran with as ``actor/atr_param_<name>`` (so a run's metrics show which delta it used).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch

import atr_theory as at

PREFIX = "atr_grpo_"
PARAMS_ENV = "ATR_GRPO_PARAMS"


def env_params() -> dict[str, Any]:
    """The JSON object in ``$ATR_GRPO_PARAMS`` ({} when unset); a malformed value raises naming the variable."""
    raw = os.environ.get(PARAMS_ENV, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw, object_pairs_hook=_refuse_a_key_twice)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{PARAMS_ENV} must be a JSON object such as '{{\"delta\": 0.05}}', got {raw!r}: {e}"
        ) from None
    except RecursionError:  # json nests by recursion: a deeply nested value exhausts the stack
        raise ValueError(
            f"{PARAMS_ENV} nests too deeply to read ({len(raw)} characters); it holds a flat JSON object of "
            "parameters such as '{\"delta\": 0.05}'"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"{PARAMS_ENV} must be a JSON object such as '{{\"delta\": 0.05}}', got {raw!r}")
    return value


def _refuse_a_key_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object of ``$ATR_GRPO_PARAMS`` as a dict, a key given twice refused (JSON keeps the last silently)."""
    keys = [k for k, _ in pairs]
    twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if twice is not None:
        raise ValueError(f"{PARAMS_ENV} gives the key {twice!r} twice ({dict(pairs)!r} keeps the last); give it once")
    return dict(pairs)


CONFIG_PARAMS_FIELD = "atr_params"
"""The field of ``atr_llm.verl.config.PolicyLossConfig`` (``actor.policy_loss.atr_params``) holding our parameters."""


def config_params(config: Any) -> dict[str, Any]:
    """``actor.policy_loss.atr_params`` of verl's actor ``config`` as a plain dict ({} when absent or empty)."""
    holder = None if config is None else getattr(config, "policy_loss", None)
    value = None if holder is None else getattr(holder, CONFIG_PARAMS_FIELD, None)
    if value is None:
        return {}
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
    except ImportError:  # verl without omegaconf cannot happen; plain dicts need nothing
        pass
    if not isinstance(value, Mapping):
        raise ValueError(
            f"actor.policy_loss.{CONFIG_PARAMS_FIELD} must be a mapping such as {{delta: 0.05}}, got {value!r}"
        )
    return _plain(value)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def params_for(config: Any) -> dict[str, Any]:
    """Our parameters for one loss call: ``actor.policy_loss.atr_params`` from verl's config, else
    ``$ATR_GRPO_PARAMS``; both set and different is refused (one of them would be silently ignored)."""
    from_config, from_env = config_params(config), env_params()
    if from_config and from_env and from_config != from_env:
        raise ValueError(
            f"actor.policy_loss.{CONFIG_PARAMS_FIELD}={from_config} and {PARAMS_ENV}={from_env} disagree; set one of "
            f"them (the config is recorded in verl's config dump; {PARAMS_ENV} is the fallback)"
        )
    return from_config or from_env


def _field(config: Any, where: str, name: str) -> Any:
    holder = config if where == "actor" else getattr(config, "policy_loss", None)
    return None if holder is None else getattr(holder, name, None)


def params_source(config: Any) -> str:
    """Where our parameters come from, as a refusal names it: ``actor.policy_loss.atr_params`` when verl's config has
    them, else ``$ATR_GRPO_PARAMS``."""
    return f"actor.policy_loss.{CONFIG_PARAMS_FIELD}" if config_params(config) else f"${PARAMS_ENV}"


def method_params(method: str, config: Any, extra: Mapping[str, Any] | None = None) -> at.ResolvedMethod:
    """Our parameters of ``method`` from verl's ``config`` (an ``ActorConfig``) and ``extra`` (default
    ``params_for(config)``: ``actor.policy_loss.atr_params``, else ``$ATR_GRPO_PARAMS``), validated by
    ``atr_theory.resolve``; ``extra``'s ``"form"`` picks the form (``{"form": "mask"}``: the Section 4 pure-clip
    objective), else the method's default (PPO's min for every rule with a ratio range). A refusal names where the
    value came from (the key of ``params_source``, or verl's field)."""
    spec = at.get_method(method)
    source = params_source(config)
    extra = {k: v for k, v in (params_for(config) if extra is None else extra).items() if k not in LAYER_KEYS}
    form = extra.pop("form", None)  # "min" (every range rule's default, atr included) or "mask"
    if form is not None and form not in spec.forms:
        raise ValueError(
            f"{source} key 'form': {form!r} is not a form of method {spec.name!r}; its forms: {list(spec.forms)}"
        )
    params: dict[str, Any] = {}
    for name, declared in spec.params.items():
        if name in extra:
            where = f"{source} key {name!r}"
            params[name] = extra.pop(name)
        else:
            values = [_field(config, *f) for f in declared.verl]  # the fields atr_theory declares for it (Param.verl)
            given = [v for v in values if v is not None]
            if len(set(given)) > 1:  # one symmetric range from two fields: verl's low and high must agree
                shown = " and ".join(f"{f[1]}={v!r}" for f, v in zip(declared.verl, values))
                raise ValueError(
                    f"method {spec.name!r} has one parameter {name} for verl's {len(values)} fields, but {shown} "
                    f"differ; set them equal, or use a rule with a bound for each ({PREFIX}clip_higher)"
                )
            if not given:
                continue
            where = " / ".join(f"actor.{'policy_loss.' if sec == 'policy_loss' else ''}{f}" for sec, f in declared.verl)
            params[name] = given[0]
        try:
            declared.check(name, params[name], spec.name)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    if extra:
        raise ValueError(
            f"{source} sets {sorted(extra)}, which method {spec.name!r} does not take "
            f"(its parameters: {sorted(spec.params) or 'none'})"
        )
    return at.resolve(spec.name, form, **params)


LAYER_KEYS = ("rollout_correction", "sequence_mask")
"""Keys of ``$ATR_GRPO_PARAMS`` that configure a layer of ``atr_theory.layers`` instead of a method parameter."""


def layers_from_params(extra: Mapping[str, Any], source: str = f"${PARAMS_ENV}") -> dict[str, Any]:
    """The ``atr_theory.policy_loss`` layer keywords in ``$ATR_GRPO_PARAMS``: ``"rollout_correction"`` (the
    fields of ``atr_theory.RolloutCorrection``, e.g. ``{"level": "sequence", "mode": "mask", "upper": 2.0}``)
    and ``"sequence_mask"`` (those of ``atr_theory.SequenceMask``, e.g. ``{"estimator": "k3", "reduction":
    "token", "threshold": 0.07, "advantages": "all"}``). In verl's bypass mode (old = rollout log-probs) the rollout
    correction's ratio is ``sg[pi] / pi_rollout``, as in verl's own bypass losses."""
    layers: dict[str, Any] = {}
    for key, cls in (("rollout_correction", at.RolloutCorrection), ("sequence_mask", at.SequenceMask)):
        if key not in extra:
            continue
        fields = extra[key]
        if not isinstance(fields, dict):
            raise ValueError(f"{source} key {key!r} must be a JSON object of {cls.__name__} fields, got {fields!r}")
        try:
            layers[key] = cls(**fields)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source} key {key!r}: {e}") from None
    return layers


def config_fields_read() -> tuple[tuple[str, str], ...]:
    """Every verl config field ``method_params`` reads (each registered parameter's ``Param.verl``), sorted: with
    ``$ATR_GRPO_PARAMS`` they decide the resolved choice."""
    return tuple(sorted({f for spec in at.METHODS.values() for p in spec.params.values() for f in p.verl}))


_CHOICES: dict[tuple[str, int, str], tuple[Any, at.ResolvedMethod, dict[str, Any]]] = {}


def choice_for(method: str, config: Any) -> tuple[at.ResolvedMethod, dict[str, Any]]:
    """``method``'s validated choice (``method_params``) and its layers (``layers_from_params``) for verl's actor
    ``config``, resolved on the first loss call of a process and kept for that config object (and that value of
    ``$ATR_GRPO_PARAMS``): verl passes the same actor config to every call, so the JSON is parsed and the choice
    validated once per process, not per step."""
    key = (method, id(config), os.environ.get(PARAMS_ENV, "").strip())
    found = _CHOICES.get(key)
    if found is None or found[0] is not config:  # the config is kept alive with its entry: its id is not reused
        found = (config, method_params(method, config), layers_from_params(params_for(config), params_source(config)))
        _CHOICES[key] = found
    return found[1], found[2]


def make_verl_policy_loss(method: str):
    """A function with verl's ``PolicyLossFn`` signature computing ``method`` through ``atr_theory.policy_loss``."""
    if not at.get_method(method).sampled_tokens_only:  # unknown names fail here too, at registration
        raise ValueError(
            f"method {method!r} reads more than the sampled tokens' log-probs (the full distributions, or the old "
            "policy's top-K), which verl's policy-loss interface does not pass; use it with atr_llm.train"
        )

    def loss_fn(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        from verl.trainer.ppo.core_algos import agg_loss

        if config is None:
            raise ValueError(f"verl policy loss {PREFIX}{method!r} needs the actor config")
        choice, layers = choice_for(method, config)
        if rollout_is_weights is not None and "rollout_correction" in layers:
            raise ValueError(
                f"verl passed rollout_is_weights (its rollout_is is set) and {PARAMS_ENV} sets rollout_correction: the "
                "correction would be applied twice; set one of them"
            )
        mask = response_mask.bool()
        out = at.policy_loss(
            log_prob,
            old_log_prob,
            advantages,
            mask,
            method=choice,  # resolved once per process (choice_for): policy_loss resolves nothing
            aggregation="token_mean",  # unused: verl aggregates out.per_token below
            token_weights=None if rollout_is_weights is None else rollout_is_weights.to(log_prob.dtype),
            **layers,
        )
        batch_info = dict(getattr(config, "global_batch_info", None) or {})
        pg_loss = agg_loss(loss_mat=-out.per_token, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)
        m = out.metrics
        n = max(m["n_tokens"], 1.0)
        metrics = {
            "actor/pg_clipfrac": m["frac_masked"],
            "actor/pg_clipfrac_lower": m["frac_clipped_low"],
            "actor/ppo_kl": float((-out.log_ratio * mask).sum()) / n,
        }
        metrics.update({f"actor/atr_{k}": v for k, v in m.items()})
        metrics.update(
            {f"actor/atr_param_{k}": float(v) for k, v in choice.params.items() if isinstance(v, (int, float))}
        )
        return pg_loss, metrics

    loss_fn.__name__ = f"atr_grpo_{method}_policy_loss"
    loss_fn.__doc__ = f"verl policy loss: atr_theory.policy_loss(method={method!r}); see atr_llm.verl.plugin."
    return loss_fn


def register_all() -> list[str]:
    """Register ``atr_grpo_<method>`` in verl's policy-loss registry for every method (aliases included) that needs
    only the sampled tokens' log-probs (tr_ppo and truly_ppo need the full distributions, dppo_topk_* the old policy's
    top-K, which verl does not pass)."""
    from verl.trainer.ppo.core_algos import register_policy_loss

    names = []
    for method in at.method_names(aliases=True):
        if not at.get_method(method).sampled_tokens_only:
            continue
        register_policy_loss(PREFIX + method)(make_verl_policy_loss(method))
        names.append(PREFIX + method)
    if os.environ.get(PARAMS_ENV):
        layers_from_params(env_params())  # a malformed value fails at import, not at the first step
    return names


try:  # imported by verl (entry point / VERL_USE_EXTERNAL_MODULES): register now
    import verl.trainer.ppo.core_algos  # noqa: F401
except ImportError:  # verl not installed: importing this module still works (docs, tests of the mapping)
    REGISTERED: list[str] = []
else:
    REGISTERED = register_all()
