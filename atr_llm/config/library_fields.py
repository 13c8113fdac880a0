"""TRL's and transformers' own fields whose values neither library checks where the config is built: each one's
domain, read from the library that uses it (transformers' cache implementations, the scheduler function's
parameters, ``GenerationConfig``'s attributes and validation), so that what the library would refuse at its
first training step (after the SFT stage has trained and saved a model) is refused when the config is built,
naming the field.

``ATRGRPOConfig.__post_init__`` calls ``library_values_read`` before TRL's own ``__post_init__`` and
``check_library_fields`` on every build and on every write of one of ``LIBRARY_FIELDS`` after it; the fields
declared by a domain alone are in ``atr_llm.config.library_domains`` (``training_domains`` holds them)."""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any

from .fields import ConfigError

__all__ = [
    "LIBRARY_FIELDS",
    "check_library_fields",
    "check_train_reward_weights",
    "library_values_read",
]

LIBRARY_FIELDS = ("lr_scheduler_kwargs", "generation_kwargs", "pad_to_multiple_of", "reward_weights")
"""The fields ``check_library_fields`` checks (beside ``library_domains``' ones, which ``check_fields`` checks)."""


def library_values_read(config: Any) -> None:
    """What TRL's ``GRPOConfig.__post_init__`` reads before it checks anything, applied first so that our checks see
    the value TRL will use: ``scale_rewards`` ``True`` / ``False`` as ``"group"`` / ``"none"``."""
    value = getattr(config, "scale_rewards", None)
    if isinstance(value, bool):
        object.__setattr__(config, "scale_rewards", "group" if value else "none")


def _scheduler_parameters(scheduler_type: Any) -> tuple[str, ...] | None:
    """The keyword parameters transformers' ``get_scheduler`` leaves to ``lr_scheduler_kwargs`` for
    ``scheduler_type`` (the scheduler function's, less the optimizer and the step counts it fills in itself);
    None when the function takes ``**kwargs`` or the type is unknown (its own check names it)."""
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
    from transformers.trainer_utils import SchedulerType

    try:
        function = TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(getattr(scheduler_type, "value", scheduler_type))]
    except (ValueError, KeyError):
        return None
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    filled = {"optimizer", "num_warmup_steps", "num_training_steps", "last_epoch"}
    return tuple(p.name for p in parameters if p.name not in filled)


def _check_scheduler_kwargs(config: Any) -> None:
    """``lr_scheduler_kwargs``: a mapping whose keys the chosen scheduler function takes (transformers passes them
    as keywords, ignoring none: a key it does not take fails at the first step, or is dropped by a scheduler that
    takes ``**kwargs``)."""
    kwargs = getattr(config, "lr_scheduler_kwargs", None)
    if kwargs is None or kwargs == {}:
        return
    if not isinstance(kwargs, dict):
        raise ConfigError("lr_scheduler_kwargs", kwargs, "expected a mapping of the scheduler's keyword arguments")
    taken = _scheduler_parameters(config.lr_scheduler_type)
    if taken is None:
        return
    stray = [key for key in kwargs if key not in taken]
    if stray:
        shown = ", ".join(taken) or "none"
        raise ConfigError(
            "lr_scheduler_kwargs",
            kwargs,
            f"{stray[0]!r} is not a parameter of the {config.lr_scheduler_type} scheduler (its parameters: {shown})",
        )


def _check_generation_kwargs(config: Any) -> None:
    """``generation_kwargs`` without vLLM: a mapping of ``transformers.GenerationConfig`` attributes, which TRL 1.16
    (``GRPOTrainer.__init__``, after the SFT stage) lays over its own sampling settings and builds a
    ``GenerationConfig`` from; built the same way here, with the logits processors ``generate`` builds from it, so
    what either refuses is refused now. An unknown key, which
    ``GenerationConfig`` keeps silently and generation never reads, is refused too. With ``use_vllm`` the keys go
    to vLLM's ``SamplingParams`` instead (not checked here: vLLM is an optional extra)."""
    kwargs = getattr(config, "generation_kwargs", None)
    if kwargs is None:
        return
    if not isinstance(kwargs, dict):
        raise ConfigError("generation_kwargs", kwargs, "expected a mapping of GenerationConfig attributes")
    if getattr(config, "use_vllm", False):
        return
    from transformers import GenerationConfig

    stray = [key for key in kwargs if key not in GenerationConfig().to_dict()]
    if stray:
        raise ConfigError("generation_kwargs", kwargs, f"{stray[0]!r} is not an attribute of GenerationConfig")
    trl_settings = {  # TRL's own, in its order; the mapping is laid over them
        "max_new_tokens": config.max_completion_length,
        "do_sample": True,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "top_k": config.top_k,
        "min_p": config.min_p,
        "repetition_penalty": config.repetition_penalty,
        "cache_implementation": config.cache_implementation,
    }
    try:
        settings = GenerationConfig(**{**trl_settings, **kwargs}, disable_compile=True)
        _build_samplers(settings, kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError("generation_kwargs", kwargs, f"transformers refuses it: {e}") from None


def _build_samplers(settings: Any, given: dict) -> None:
    """The logits processors transformers' ``generate`` builds from ``settings`` (``_get_logits_processor``, under
    its own conditions), for the keys in ``given``: their constructors are where transformers checks these values
    (a temperature of -1 passes ``GenerationConfig`` and fails at the first generation)."""
    from transformers.generation import logits_process as lp

    builds = {
        "temperature": (lambda v: v is not None and v != 1.0, lp.TemperatureLogitsWarper),
        "top_k": (lambda v: v is not None and v != 0, lp.TopKLogitsWarper),
        "top_p": (lambda v: v is not None and v < 1.0, lp.TopPLogitsWarper),
        "min_p": (lambda v: v is not None, lp.MinPLogitsWarper),
        "typical_p": (lambda v: v is not None and v < 1.0, lp.TypicalLogitsWarper),
        "repetition_penalty": (lambda v: v is not None and v != 1.0, lp.RepetitionPenaltyLogitsProcessor),
    }
    for key, (built, processor) in builds.items():
        value = getattr(settings, key, None)
        if key in given and built(value):
            processor(value)


def _check_reward_weights_listed(config: Any) -> None:
    """``reward_weights``: None or a list (TRL takes ``len()`` of it when the trainer is built; each item's domain is
    ``check_fields``')."""
    weights = getattr(config, "reward_weights", None)
    if weights is not None and not isinstance(weights, (list, tuple)):
        raise ConfigError("reward_weights", weights, "expected a list of finite numbers, one per reward function")


def _check_pad_to_multiple_of(config: Any) -> None:
    """``pad_to_multiple_of``: None, ``"auto"``, an integer >= 1, or the text of one (or ``"none"`` / ``"null"``),
    which TRL's ``GRPOConfig.__post_init__`` reads with ``int()`` (``"abc"`` failed there naming nothing)."""
    value = getattr(config, "pad_to_multiple_of", None)
    if value is None or value == "auto":
        return
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("none", "null") or (text.isdigit() and int(text) >= 1):
            return
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1:
        return
    raise ConfigError("pad_to_multiple_of", value, "expected an integer >= 1, 'auto' or None")


def check_library_fields(config: Any, only: str | None = None) -> None:
    """The checks of ``LIBRARY_FIELDS`` on ``config`` (``only``: that field alone, written after the build); a
    refusal is a ``ConfigError`` naming the field."""
    checks = {
        "reward_weights": _check_reward_weights_listed,
        "lr_scheduler_kwargs": _check_scheduler_kwargs,
        "generation_kwargs": _check_generation_kwargs,
        "pad_to_multiple_of": _check_pad_to_multiple_of,
    }
    for name, check in checks.items():
        if only is None or only == name or (only, name) == ("lr_scheduler_type", "lr_scheduler_kwargs"):
            check(config)


def check_train_reward_weights(config: Any, reward_functions: int = 1) -> None:
    """``reward_weights`` of a run of ``atr_llm.train``, which scores with ``reward_functions`` reward functions:
    one weight each (TRL refuses another count when the trainer is built, after the SFT stage), each finite."""
    weights = getattr(config, "reward_weights", None)
    if weights is None:
        return
    if len(weights) != reward_functions or not all(math.isfinite(w) for w in weights):
        raise ConfigError(
            "reward_weights",
            list(weights),
            f"expected {reward_functions} finite number{'s' if reward_functions > 1 else ''}: atr_llm.train scores "
            f"with {reward_functions} reward function{'s' if reward_functions > 1 else ''}",
        )
