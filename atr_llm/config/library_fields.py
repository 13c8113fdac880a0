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

from .fields import ConfigError, is_set

__all__ = [
    "LIBRARY_FIELDS",
    "check_library_fields",
    "check_train_library_fields",
    "check_train_reward_weights",
    "library_values_read",
]

LIBRARY_FIELDS = (
    "lr_scheduler_kwargs",
    "generation_kwargs",
    "pad_to_multiple_of",
    "reward_weights",
    "optim_args",
    "torch_compile_backend",
    "label_smoothing_factor",
    "sync_ref_model",
    "accelerator_config",
    "chat_template_kwargs",
    "gradient_checkpointing_kwargs",
    "optim_target_modules",
    "label_names",
    "deepspeed",
)
"""The fields ``check_library_fields`` checks (beside ``library_domains``' ones, which ``check_fields`` checks)."""


def library_values_read(config: Any) -> None:
    """What TRL's ``GRPOConfig.__post_init__`` reads before it checks anything, applied first so that our checks see
    the value TRL will use: ``scale_rewards`` ``True`` / ``False`` as ``"group"`` / ``"none"``."""
    value = getattr(config, "scale_rewards", None)
    if isinstance(value, bool):
        object.__setattr__(config, "scale_rewards", "group" if value else "none")
    for name in getattr(type(config), "_VALID_DICT_FIELDS", ()):  # JSON text transformers parses: refused by name
        _json_mapping(name, getattr(config, name, None))


def _json_mapping(name: str, value: Any) -> dict | None:
    """A mapping field's value as transformers reads it: the mapping, or the JSON text of one (``"{...}"``, which
    ``TrainingArguments.__post_init__`` parses), refused naming the field when that text is not JSON; None for
    anything else (a path, None)."""
    if isinstance(value, dict):
        return value
    if not (isinstance(value, str) and value.startswith("{")):
        return None
    import json

    try:
        loaded = json.loads(value)
    except json.JSONDecodeError as e:
        raise ConfigError(name, value, f"not valid JSON ({e.msg}, at character {e.pos})") from None
    return loaded if isinstance(loaded, dict) else None


def _scheduler_function(scheduler_type: Any):
    """transformers' scheduler function for ``scheduler_type`` (``get_scheduler``'s table), or None for an unknown
    type (its own check names it)."""
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
    from transformers.trainer_utils import SchedulerType

    try:
        return TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(getattr(scheduler_type, "value", scheduler_type))]
    except (ValueError, KeyError):
        return None


def _scheduler_parameters(scheduler_type: Any) -> tuple[str, ...] | None:
    """The keyword parameters transformers' ``get_scheduler`` leaves to ``lr_scheduler_kwargs`` for
    ``scheduler_type`` (the scheduler function's, less the optimizer and the step counts it fills in itself);
    None when the function takes ``**kwargs`` or the type is unknown (its own check names it)."""
    function = _scheduler_function(scheduler_type)
    if function is None:
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
    given = getattr(config, "lr_scheduler_kwargs", None)
    if given is None or given == {}:
        _check_scheduler_needs(config.lr_scheduler_type, {})
        return
    kwargs = _json_mapping("lr_scheduler_kwargs", given)  # the command line gives JSON text, which transformers parses
    if kwargs is None:
        raise ConfigError("lr_scheduler_kwargs", given, "expected a mapping of the scheduler's keyword arguments")
    taken = _scheduler_parameters(config.lr_scheduler_type)
    if taken is None:
        return
    _check_scheduler_needs(config.lr_scheduler_type, kwargs)
    stray = [key for key in kwargs if key not in taken]
    if stray:
        shown = ", ".join(taken) or "none"
        raise ConfigError(
            "lr_scheduler_kwargs",
            kwargs,
            f"{stray[0]!r} is not a parameter of the {config.lr_scheduler_type} scheduler (its parameters: {shown})",
        )
    for key, value in kwargs.items():
        problem = _scheduler_value_problem(key, value)
        if problem:
            raise ConfigError("lr_scheduler_kwargs", kwargs, f"{key} {value!r}: {problem}")
    lr_end = kwargs.get("lr_end")  # the polynomial scheduler's end: transformers refuses it at the first step
    if isinstance(lr_end, (int, float)) and not lr_end < getattr(config, "learning_rate", math.inf):
        raise ConfigError(
            "lr_scheduler_kwargs",
            kwargs,
            f"lr_end {lr_end} must be below the learning rate {config.learning_rate} (the polynomial decay ends there)",
        )


SCHEDULE_SHAPES = ("linear", "cosine", "1-sqrt")
"""``warmup_stable_decay``'s ``warmup_type`` and ``decay_type`` (transformers raises on another at the first step)."""


def _scheduler_value_problem(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` for the scheduler parameter ``key``, or None: the shapes are ``SCHEDULE_SHAPES``;
    every other parameter of transformers' schedules is a finite number (a text failed in the schedule's arithmetic
    at the first step), a count of cycles or steps or a timescale above 0 or at least 0, a rate or ratio in [0, 1]."""
    if key in ("warmup_type", "decay_type"):
        return None if value in SCHEDULE_SHAPES else f"expected one of {', '.join(SCHEDULE_SHAPES)}"
    if value is None and key in ("min_lr", "min_lr_rate", "warmup_lr_rate", "timescale", "num_stable_steps"):
        return None  # their default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "expected a finite number"
    if key in ("num_cycles", "timescale", "power") and value <= 0:
        return "expected a number > 0"
    if key in ("min_lr_rate", "min_lr_ratio", "warmup_lr_rate") and not 0 <= value <= 1:
        return "expected a rate in [0, 1]"
    if value < 0:
        return "expected a number >= 0"
    return None


def _check_scheduler_needs(scheduler_type: Any, kwargs: dict) -> None:
    """The parameters the ``scheduler_type`` function of transformers' ``get_scheduler`` needs from
    ``lr_scheduler_kwargs``: each one without a default (``warmup_stable_decay``'s ``num_decay_steps``: a TypeError
    at the first step), and for the cosine schedules with a floor ``min_lr`` or ``min_lr_rate`` (their own
    ValueError, at the first step)."""
    name, function = str(getattr(scheduler_type, "value", scheduler_type)), _scheduler_function(scheduler_type)
    if function is None:
        return
    filled = {"optimizer", "num_warmup_steps", "num_training_steps", "last_epoch"}
    needed = [
        p.name
        for p in inspect.signature(function).parameters.values()
        if p.default is inspect.Parameter.empty and p.name not in filled and p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    missing = [n for n in needed if n not in kwargs]
    if "min_lr" in name and not ({"min_lr", "min_lr_rate"} & set(kwargs)):
        missing.append("min_lr or min_lr_rate")
    if missing:
        raise ConfigError(
            "lr_scheduler_type",
            name,
            f"needs {missing[0]} in lr_scheduler_kwargs (e.g. --lr_scheduler_kwargs '{{\"{missing[0].split()[0]}\": ...}}')",
        )


def _check_generation_kwargs(config: Any) -> None:
    """``generation_kwargs`` without vLLM: a mapping of ``transformers.GenerationConfig`` attributes, which TRL 1.16
    (``GRPOTrainer.__init__``, after the SFT stage) lays over its own sampling settings and builds a
    ``GenerationConfig`` from; built the same way here, with the logits processors ``generate`` builds from it, so
    what either refuses is refused now. An unknown key, which
    ``GenerationConfig`` keeps silently and generation never reads, is refused too. With ``use_vllm`` the keys go
    to vLLM's ``SamplingParams`` instead (not checked here: vLLM is an optional extra)."""
    given = getattr(config, "generation_kwargs", None)
    if given is None:
        return
    kwargs = _json_mapping("generation_kwargs", given)  # the command line gives JSON text, which transformers parses
    if kwargs is None:
        raise ConfigError("generation_kwargs", given, "expected a mapping of GenerationConfig attributes")
    if getattr(config, "use_vllm", False):
        _check_no_setting_overridden(config, kwargs)
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
    for key in ("num_beams", "num_beam_groups", "num_return_sequences"):  # GenerationConfig takes 0; generate divides
        value = getattr(settings, key, None)
        if isinstance(value, int) and value < 1:
            raise ConfigError("generation_kwargs", kwargs, f"{key}={value}: expected an integer >= 1")
    _check_no_setting_overridden(config, kwargs)


_TRL_SETTINGS = {  # generation key -> the TRL field it comes from (None: TRL's fixed value, in the second map)
    "transformers": {"max_new_tokens": "max_completion_length", "temperature": "temperature", "top_p": "top_p",
                     "top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                     "cache_implementation": "cache_implementation", "do_sample": None},
    "vllm": {"max_tokens": "max_completion_length", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
             "min_p": "min_p", "repetition_penalty": "repetition_penalty", "n": None, "logprobs": None},
}
_FIXED_BY_TRL = {"do_sample": "GRPO samples its groups (TRL sets True)",
                 "n": "TRL sets it from num_generations and vllm_mode", "logprobs": "TRL sets it to read the sampler's log-probs"}


def _check_no_setting_overridden(config: Any, kwargs: dict) -> None:
    """A ``generation_kwargs`` key that TRL 1.16 also sets from one of its own fields (``GRPOTrainer.__init__`` for
    transformers' ``generate``, ``VLLMGeneration`` for vLLM's ``SamplingParams``) lays over that field, TRL's
    documented order: where the field was set too (given, or not at its default) and the values differ, the field
    would be dropped silently (``{"max_new_tokens": 3}`` overrode the file's ``max_completion_length: 12``), so it is
    refused, naming the field to set instead. A temperature that differs from ``temperature`` is refused even at the
    field's default: TRL divides the logits by ``temperature`` for the loss's log-probs, so the completions would be
    sampled from another policy than the one the ratio is taken of. ``do_sample`` (other than true), vLLM's ``n``
    and ``logprobs`` are TRL's own and refused."""

    path = "vllm" if getattr(config, "use_vllm", False) else "transformers"
    for key, field in _TRL_SETTINGS[path].items():
        if key not in kwargs:
            continue
        if field is None:
            if not (key == "do_sample" and kwargs[key] is True):
                raise ConfigError("generation_kwargs", kwargs, f"{key}: {_FIXED_BY_TRL[key]}; leave it out")
            continue
        own = getattr(config, field, None)
        if kwargs[key] != own and (field == "temperature" or is_set(config, field)):
            raise ConfigError(
                "generation_kwargs",
                kwargs,
                f"{key}={kwargs[key]!r} would override {{{field}}} ({own!r}): TRL lays generation_kwargs over its "
                f"own setting{_WHY_OVERRIDE.get(field, '')}; set {{{field}}} instead",
                others=(field,),
            )


_WHY_OVERRIDE = {"temperature": ", and divides the logits by temperature for the loss's log-probs"}


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


def _check_optim_args(config: Any) -> None:
    """``optim_args``: ``"key=value,key=value"`` (transformers splits it so; a piece without ``=`` fails at the first
    step), and only for an optimizer whose transformers handler reads it (``compat.optimizers_reading_optim_args``):
    for any other, ``adamw_torch`` included, transformers drops it silently."""
    from ..compat import optimizers_reading_optim_args

    value = getattr(config, "optim_args", None)
    if value is None or value == "":
        return
    if not isinstance(value, str):
        raise ConfigError("optim_args", value, "expected text of key=value pairs separated by commas")
    pieces = value.replace(" ", "").split(",")
    bad = next((p for p in pieces if p.count("=") != 1 or p.startswith("=")), None)
    if bad is not None:
        raise ConfigError(
            "optim_args", value, f"{bad!r} is not key=value (expected key=value pairs separated by commas)"
        )
    optimizer = str(getattr(config.optim, "value", config.optim))
    readers = optimizers_reading_optim_args()
    if readers is not None and optimizer not in readers:
        raise ConfigError(
            "optim_args",
            value,
            f"the {optimizer} optimizer never reads it (transformers passes optim_args only to "
            f"{', '.join(sorted(readers))}); leave it unset or choose one of those with --optim",
        )
    if not any(k in optimizer for k in ("galore", "apollo", "lomo")):  # those read the model too: built later
        from transformers import Trainer

        try:  # the peer reads the values (float('abc') failed there, after the SFT stage)
            Trainer.get_optimizer_cls_and_kwargs(config)
        except (ValueError, TypeError) as e:
            raise ConfigError("optim_args", value, f"the {optimizer} optimizer cannot read it ({e})") from None


def _check_torch_compile_backend(config: Any) -> None:
    """``torch_compile_backend``: a name of accelerate's ``DynamoBackend`` (transformers upper-cases it; any other
    fails when the accelerator is built, naming no field)."""
    value = getattr(config, "torch_compile_backend", None)
    if value is None:
        return
    from accelerate.utils import DynamoBackend

    names = [b.value for b in DynamoBackend]
    if not isinstance(value, str) or value.upper() not in names:
        raise ConfigError("torch_compile_backend", value, f"expected one of {', '.join(n.lower() for n in names)}")


def _check_label_smoothing_factor(config: Any) -> None:
    """``label_smoothing_factor``: 0. transformers applies it only to a cross-entropy on labels in
    ``Trainer.compute_loss``, which GRPO's loss replaces: any other value would be dropped silently."""
    value = getattr(config, "label_smoothing_factor", 0.0)
    if value != 0:
        raise ConfigError(
            "label_smoothing_factor", value, "expected 0: GRPO's loss never reads it (no labels cross-entropy)"
        )


def _check_sync_ref_model(config: Any) -> None:
    """``sync_ref_model`` needs a reference model, i.e. ``beta > 0`` (TRL 1.16 refuses it with ``beta = 0`` when the
    trainer is built, after the SFT stage)."""
    if getattr(config, "sync_ref_model", False) and getattr(config, "beta", 0.0) == 0:
        raise ConfigError(
            "sync_ref_model",
            True,
            "needs a reference model: set beta > 0 (with beta = 0 no reference model is loaded, so none is synced)",
        )


def _check_accelerator_config(config: Any) -> None:
    """``accelerator_config``: a mapping of ``transformers.trainer_pt_utils.AcceleratorConfig`` fields, or the path of
    a JSON file of one (an unknown key was a TypeError traceback when the config was built)."""
    value = _json_mapping("accelerator_config", getattr(config, "accelerator_config", None))
    if value is None:
        return  # a path: transformers reads it when the config is built and names the file; the built object: done
    import dataclasses

    from transformers.trainer_pt_utils import AcceleratorConfig

    known = [f.name for f in dataclasses.fields(AcceleratorConfig)]
    stray = [key for key in value if key not in known]
    if stray:
        raise ConfigError(
            "accelerator_config",
            value,
            f"{stray[0]!r} is not a field of AcceleratorConfig (its fields: {', '.join(known)})",
        )


def _check_chat_template_kwargs(config: Any) -> None:
    """``chat_template_kwargs``: None or a mapping (or its JSON text), which TRL passes to ``apply_chat_template`` as
    keywords at the first generation (a list was a TypeError there)."""
    value = getattr(config, "chat_template_kwargs", None)
    if value is not None and _json_mapping("chat_template_kwargs", value) is None:
        raise ConfigError("chat_template_kwargs", value, "expected a mapping of the chat template's variables")


def _check_gradient_checkpointing_kwargs(config: Any) -> None:
    """``gradient_checkpointing_kwargs``: a mapping of ``torch.utils.checkpoint.checkpoint``'s keyword parameters
    (transformers binds them with ``functools.partial``), its flags booleans (``use_reentrant='maybe'`` trained as a
    truthy string)."""
    value = getattr(config, "gradient_checkpointing_kwargs", None)
    if value is None:
        return
    kwargs = _json_mapping("gradient_checkpointing_kwargs", value)
    if kwargs is None:
        raise ConfigError("gradient_checkpointing_kwargs", value, "expected a mapping of torch checkpoint's arguments")
    from torch.utils.checkpoint import checkpoint

    taken = [p.name for p in inspect.signature(checkpoint).parameters.values() if p.kind is p.KEYWORD_ONLY]
    for key, item in kwargs.items():
        if key not in taken:
            shown = ", ".join(taken)
            raise ConfigError("gradient_checkpointing_kwargs", kwargs, f"{key!r} is not one of torch's ({shown})")
        if key in ("use_reentrant", "preserve_rng_state", "debug") and not isinstance(item, bool):
            raise ConfigError("gradient_checkpointing_kwargs", kwargs, f"{key} {item!r}: expected true or false")


def _check_optim_target_modules(config: Any) -> None:
    """``optim_target_modules``: read only by the low-rank optimizers (transformers' GaLore and APOLLO handlers);
    for any other it was dropped silently."""
    value = getattr(config, "optim_target_modules", None)
    optimizer = str(getattr(config.optim, "value", config.optim))
    if value is not None and not any(k in optimizer for k in ("galore", "apollo")):
        raise ConfigError(
            "optim_target_modules",
            value,
            f"the {optimizer} optimizer never reads it (only GaLore and APOLLO do); leave it unset or choose one with --optim",
        )


def _check_label_names(config: Any) -> None:
    """``label_names``: unset. GRPO's batches hold no labels and transformers reads it only for evaluation losses,
    which a GRPO run does not compute: any value would be dropped silently."""
    value = getattr(config, "label_names", None)
    if value:
        raise ConfigError("label_names", value, "expected it unset: GRPO's batches hold no labels (nothing reads it)")


def _check_deepspeed(config: Any) -> None:
    """``deepspeed``: DeepSpeed installed (transformers imports it while the config is built: a traceback naming a
    package), and a path to its JSON config that exists."""
    value = getattr(config, "deepspeed", None)
    if value is None:
        return
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("deepspeed") is None:
        raise ConfigError("deepspeed", value, "needs DeepSpeed, which is not installed (pip install deepspeed)")
    if isinstance(value, str) and not value.lstrip().startswith("{") and not Path(value).is_file():
        raise ConfigError("deepspeed", value, "no such DeepSpeed config file")


def check_library_fields(config: Any, only: str | None = None) -> None:
    """The checks of ``LIBRARY_FIELDS`` on ``config`` (``only``: that field alone, written after the build); a
    refusal is a ``ConfigError`` naming the field."""
    checks = {
        "reward_weights": _check_reward_weights_listed,
        "lr_scheduler_kwargs": _check_scheduler_kwargs,
        "generation_kwargs": _check_generation_kwargs,
        "pad_to_multiple_of": _check_pad_to_multiple_of,
        "optim_args": _check_optim_args,
        "torch_compile_backend": _check_torch_compile_backend,
        "label_smoothing_factor": _check_label_smoothing_factor,
        "sync_ref_model": _check_sync_ref_model,
        "accelerator_config": _check_accelerator_config,
        "chat_template_kwargs": _check_chat_template_kwargs,
        "gradient_checkpointing_kwargs": _check_gradient_checkpointing_kwargs,
        "optim_target_modules": _check_optim_target_modules,
        "label_names": _check_label_names,
        "deepspeed": _check_deepspeed,
    }
    also = {
        "lr_scheduler_type": ("lr_scheduler_kwargs",),
        "optim": ("optim_args", "optim_target_modules"),
        "beta": ("sync_ref_model",),
    }
    for name, check in checks.items():
        if only is None or only == name or name in also.get(only, ()):
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


def check_train_library_fields(training: Any, model: Any) -> None:
    """The library fields a run of ``atr_llm.train`` cannot honour, refused before any work: ``reward_weights``
    (``check_train_reward_weights``); ``eval_strategy`` other than ``no`` (the run passes no evaluation dataset:
    transformers refuses it when the trainer is built, after the SFT stage); ``model_init_kwargs`` (the run builds
    the model itself, from ``ModelConfig``'s ``--dtype`` / ``--attn_implementation``: TRL reads it only for a model
    given by name); ``push_to_hub`` without a Hugging Face token (the push fails at the first save);
    ``sync_ref_model`` with a LoRA adapter (TRL refuses it when the trainer is built)."""
    check_train_reward_weights(training)
    _check_train_machine_fields(training, model)
    strategy = str(getattr(training.eval_strategy, "value", training.eval_strategy))
    if strategy != "no":
        raise ConfigError(
            "eval_strategy",
            strategy,
            "expected no: atr_llm.train passes no evaluation dataset (atr_llm.evaluate scores a run)",
        )
    if training.model_init_kwargs:
        raise ConfigError(
            "model_init_kwargs",
            training.model_init_kwargs,
            "is not read: atr_llm.train builds the model itself; set --dtype / --attn_implementation instead",
        )
    if training.push_to_hub:
        from huggingface_hub import get_token

        if get_token() is None:
            raise ConfigError(
                "push_to_hub", True, "needs a Hugging Face token (huggingface-cli login, or $HF_TOKEN); none is set"
            )
    if getattr(training, "sync_ref_model", False) and getattr(model, "use_peft", False):
        raise ConfigError(
            "sync_ref_model", True, "cannot sync a reference model with a LoRA adapter (use_peft): TRL refuses it"
        )


def _check_train_machine_fields(training: Any, model: Any) -> None:
    """What a run of ``atr_llm.train`` on this machine cannot honour: ``save_strategy best`` (it evaluates nothing,
    so there is no best; transformers refuses it after the trainer is built), ``fp16`` without a GPU (accelerate
    drops it on a CPU without a word), ``fsdp`` in a single process (transformers refuses it after the trainer is
    built), and a flash-attention ``attn_implementation`` without its package (an ImportError once the model is
    built)."""
    import os

    import torch

    strategy = str(getattr(training.save_strategy, "value", training.save_strategy))
    if strategy == "best":
        raise ConfigError("save_strategy", strategy, "atr_llm.train evaluates nothing, so no checkpoint is best; use steps")
    if training.fp16 and not torch.cuda.is_available():
        raise ConfigError("fp16", True, "needs a GPU: on a CPU accelerate ignores it (use bf16, or leave both unset)")
    if os.environ.get("ACCELERATE_MIXED_PRECISION") == "fp16" and not torch.cuda.is_available():
        raise ConfigError("$ACCELERATE_MIXED_PRECISION", "fp16", "needs a GPU: on a CPU accelerate ignores it")
    if training.fsdp and int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        raise ConfigError("fsdp", training.fsdp, "needs a distributed launch (accelerate launch or torchrun, several processes)")
    attention = str(getattr(model, "attn_implementation", None) or "")
    if attention.startswith("flash_attention"):
        from transformers.utils import import_utils

        available = {"flash_attention_2": import_utils.is_flash_attn_2_available,
                     "flash_attention_3": getattr(import_utils, "is_flash_attn_3_available", lambda: False)}
        if attention in available and not available[attention]():
            raise ConfigError("attn_implementation", attention, "needs the flash-attn package on a GPU, not available here")
