"""Every value a training run takes, declared once: each field's domain, the environment variables the run reads, and
the relations between fields. The configs' constructors (``ATRGRPOConfig``, ``ScriptArguments``, ``RunConfig``) check
these and nothing else checks them again; the command line (``python -m atr_llm.train``) only turns text into values.

The method's own parameters are not here: each is declared where its rule is registered (``atr_theory.Param``) and
checked by ``atr_theory.resolve`` (``atr_llm.config.trainer_config``).
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import dataclasses
import functools
import math
import os
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from ..cli_types import (
    SEED,
    Declared,
    Integer,
    OneOf,
    PathDeclared,
    Real,
    Steps,
    Temperature,
    WriteDir,
    python_scalars,
)
from ..relations import AtMost, Exclusive, Holds, Relation, Requires, check_relations
from .environment import ENVIRONMENT, check_environment  # noqa: F401  (part of this module's API)
from .errors import ConfigError

__all__ = [  # noqa: RUF022  (grouped: the error, the declarations, the checks)
    "ConfigError", "ENVIRONMENT", "GENERATION_RELATIONS", "MODEL_DOMAINS", "RUN_RELATIONS", "script_domains",
    "training_relations", "check_environment", "check_fields", "check_relations_of", "is_set", "training_domains"
]


def _report_to() -> OneOf:
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    return OneOf(["none", "all", *sorted(INTEGRATION_TO_CALLBACK)])


@functools.cache
def training_domains() -> dict[str, Declared]:
    """The domain of each ``ATRGRPOConfig`` field that TRL, transformers or torch check only once training runs (after
    the SFT stage has trained and saved a model), or never (a NaN learning rate trains), and of this package's own
    fields. A field whose default is None may also be None."""
    from atr_theory.divergence import REFERENCE_KL_ESTIMATORS

    from ..fast_generation import ATTENTIONS, MODES
    from .library_domains import library_domains

    return {
        # transformers' TrainingArguments
        "output_dir": WriteDir(),
        "learning_rate": Real(0),
        "weight_decay": Real(0),
        "adam_beta1": Real(0, 1, open_high=True),
        "adam_beta2": Real(0, 1, open_high=True),
        "adam_epsilon": Real(0, open_low=True),
        "max_grad_norm": Real(0),
        "per_device_train_batch_size": Integer(1),
        "per_device_eval_batch_size": Integer(1),
        "gradient_accumulation_steps": Integer(1),
        "seed": SEED,
        "data_seed": SEED,
        "max_steps": Integer(-1),
        "num_train_epochs": Real(0),
        "save_steps": Steps(),
        "logging_steps": Steps(),
        "eval_steps": Steps(),
        "warmup_steps": Steps(zero=True),
        "save_total_limit": Integer(1),
        "dataloader_num_workers": Integer(0),
        "report_to": _report_to(),
        # TRL's GRPOConfig
        "beta": Real(0),
        "sapo_temperature_pos": Real(0, open_low=True),
        "sapo_temperature_neg": Real(0, open_low=True),
        "max_completion_length": Integer(1),
        "num_generations": Integer(2),
        "num_iterations": Integer(1),
        "steps_per_generation": Integer(1),
        "generation_batch_size": Integer(1),
        "temperature": Temperature(),
        "top_p": Real(0, 1, open_low=True),
        "top_k": Integer(0),
        "min_p": Real(0, 1),
        "repetition_penalty": Real(0, open_low=True),
        "importance_sampling_level": OneOf(("token", "sequence")),
        "top_entropy_quantile": Real(0, 1),
        "off_policy_mask_threshold": Real(0),
        "entropy_coef": Real(),
        "entropy_target": Real(0),
        "entropy_coef_delta": Real(0),
        "entropy_coef_min": Real(0),
        "entropy_coef_max": Real(0),
        # this package's
        "kl_chunk_size": Integer(1),
        "dppo_topk": Integer(0),
        "true_kl_delta": Real(0, open_low=True),
        "method_seed": Integer(0, 2**64 - 1),
        "kl_estimator": OneOf(REFERENCE_KL_ESTIMATORS),
        "fast_generation": OneOf(MODES),
        "fast_generation_attention": OneOf(ATTENTIONS),
        "fast_generation_prompt_tokens": Integer(1),
        **library_domains(),  # TRL's and transformers' fields declared by their values (scale_rewards, ...)
    }


def script_domains() -> dict[str, Declared]:
    """The domain of each ``ScriptArguments`` field (``atr_llm.config.run``)."""
    from ..cli_types import ReadFile
    from ..data import OFFLINE_TASKS, SOURCES
    from ..rewards import REWARD_CONTROLS

    datasets = OneOf([*OFFLINE_TASKS, *SOURCES])
    return {
        "dataset_name": datasets,
        "sft_dataset_name": datasets,
        "dataset_path": ReadFile(),
        "sft_dataset_path": ReadFile(),
        "dataset_limit": Integer(1, 10**7),
        "tiny_vocab": OneOf(("toy", "qwen3")),
        "backend": OneOf(("trl", "unsloth")),
        "sft_steps": Integer(0),
        "sft_learning_rate": Real(0, open_low=True),
        "sft_batch_size": Integer(1),
        "sft_implementation": OneOf(("trl", "plain")),
        "reward_timeout_seconds": Integer(1),
        "truncated_reward": Real(),
        "reward_control": OneOf(REWARD_CONTROLS),
    }


MODEL_DOMAINS = {
    "lora_r": Integer(1),
    "lora_alpha": Integer(1),
    "lora_dropout": Real(0, 1, open_high=True),
    "lora_task_type": OneOf(("CAUSAL_LM",)),
}
"""trl.ModelConfig's numbers (TRL hands them to PEFT, which checks them when the adapter is built, after SFT), and
the LoRA task type: GRPO trains a causal LM (PEFT wraps the model as another task's, ``SEQ_CLS`` a classifier,
without a word)."""


def field_default(config: Any, name: str) -> Any:
    """The default of dataclass field ``name`` of ``config``'s class (its factory's value for a mutable default)."""
    f = {f.name: f for f in dataclasses.fields(config)}[name]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


GIVEN: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("atr_llm_given_fields", default=frozenset())
"""The fields a way in that knows what was typed (the command line, a YAML file: ``atr_llm.train.build_run``) gave,
while it builds the configs: a value typed equal to its default counts as given there too."""


@contextlib.contextmanager
def fields_given(names) -> Iterator[None]:
    """Within the block, ``is_set`` counts every field of ``names`` as given (``GIVEN``)."""
    token = GIVEN.set(frozenset(names))
    try:
        yield
    finally:
        GIVEN.reset(token)


def is_set(config: Any, name: str) -> bool:
    """Whether field ``name`` of ``config`` was given: typed on the command line or in a YAML file (``GIVEN``), or
    its value differs from the field's default (the one answer a config built in Python can give)."""
    return name in GIVEN.get() or getattr(config, name) != field_default(config, name)


@functools.cache
def flag_fields(cls: type) -> tuple[str, ...]:
    """The fields of dataclass ``cls`` annotated ``bool`` (read from the annotations: transformers'
    ``HfArgumentParser`` rewrites ``Field.type`` in place)."""
    hints = typing.get_type_hints(cls)
    return tuple(f.name for f in dataclasses.fields(cls) if hints.get(f.name) is bool)


def _finite(value: float) -> bool:
    """``math.isfinite``, False for an integer beyond any float (10**400) instead of an OverflowError."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@functools.cache
def choice_fields(cls: type) -> dict[str, tuple[str, ...]]:
    """``{field: its values}`` for the fields of dataclass ``cls`` annotated with an ``Enum`` (transformers'
    ``lr_scheduler_type``, ``optim``, the strategies): a config built in Python meets the choices the command line
    offers (transformers' own refusal names no field)."""
    import enum

    hints, out = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):  # or with the choices its metadata offers HfArgumentParser (log_level, dtype)
        for kind in typing.get_args(hints.get(f.name)) or (hints.get(f.name),):
            if isinstance(kind, type) and issubclass(kind, enum.Enum):
                out[f.name] = tuple(str(member.value) for member in kind)
        if "choices" in f.metadata:
            out[f.name] = tuple(str(choice) for choice in f.metadata["choices"])
    return out


@functools.cache
def list_fields(cls: type) -> frozenset[str]:
    """The fields of dataclass ``cls`` annotated as a list (or a list or something else): checked item by item."""
    hints = typing.get_type_hints(cls)
    kinds = {f.name: typing.get_args(hints.get(f.name)) or (hints.get(f.name),) for f in dataclasses.fields(cls)}
    return frozenset(name for name, args in kinds.items() if any(typing.get_origin(a) is list for a in args))


@functools.cache
def number_fields(cls: type) -> dict[str, tuple[bool, bool]]:
    """``{field: (integer, optional)}`` for the fields of dataclass ``cls`` annotated ``int`` or ``float`` (or either
    with None): what any such field must hold, a domain declared or not (NaN trained; a text failed late)."""
    hints, out = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        args = typing.get_args(hints.get(f.name)) or (hints.get(f.name),)
        kinds = {a for a in args if a is not type(None)}
        if kinds and kinds <= {int, float}:
            out[f.name] = (kinds == {int}, type(None) in args)
    return out


def check_fields(config: Any, domains: Mapping[str, Declared], only: str | None = None, others=frozenset()) -> None:
    """Each field of ``config`` named in ``domains`` against its declaration (a list item by item), every flag a bool
    and every other number a finite one of its kind; None passes where it is the field's default. ``only``: that
    field alone (one written after the config was built); ``others``: fields another check owns (the method's
    parameters: their ``Param``). A refusal is a ``ConfigError`` naming the field, the value and what was expected."""
    fields = {f.name: f for f in dataclasses.fields(config) if only is None or f.name == only}
    for name in fields:  # a numpy scalar (np.int64(5), np.float32(0.1), np.bool_(True)) is read as its Python kind
        value = getattr(config, name, None)
        plain = python_scalars(value)
        if plain is not value:
            object.__setattr__(config, name, plain)
    for name in flag_fields(type(config)):  # a flag is a bool: the text "false" is true
        if name in fields and not isinstance(getattr(config, name), bool):
            raise ConfigError(name, getattr(config, name), "expected true or false")
    for name, (integer, optional) in number_fields(type(config)).items():  # a library's number without a domain
        value = getattr(config, name, None)
        if name not in fields or name in domains or name in others or (value is None and optional):
            continue
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not _finite(value):
            expected = "expected an integer" if integer else "expected a finite number"
            raise ConfigError(name, value, expected + (" or None" if optional else ""))
    for name, choices in choice_fields(type(config)).items():
        value = getattr(config, name, None)
        if name in fields and value is not None and str(getattr(value, "value", value)) not in choices:
            raise ConfigError(name, value, f"expected one of {', '.join(choices)}")
    for name, declaration in domains.items():
        if name not in fields:
            continue
        value = getattr(config, name)
        if value is None and field_default(config, name) is None:
            continue
        if name in list_fields(type(config)) and isinstance(value, (list, tuple)):  # report_to, reward_weights
            items = list(value)
        elif isinstance(value, (list, tuple, dict, set)):
            raise ConfigError(name, value, f"expected {_words(declaration)}, got {_kind(value)}")
        else:
            items = [value]
        for item in items:
            if not _of_its_type(declaration, item):  # a text "0.5" for a number, 3 for a path: the libraries fail late
                raise ConfigError(name, item, f"expected {_words(declaration)}, got {_kind(item)}")
            try:
                declaration.check(str(item) if isinstance(item, os.PathLike) else item)
            except argparse.ArgumentTypeError as e:
                raise ConfigError(name, item, str(e).split(": ", 1)[-1]) from None


def _words(declaration: Declared) -> str:
    """The domain of ``declaration`` after "expected"."""
    text = declaration.describe()
    return text if text.startswith(("a ", "an ", "one of", "0 ", "text")) else f"a {text}"


def _kind(value: Any) -> str:
    """What ``value`` is, in words (a refusal of a value of the wrong type)."""
    kinds = {type(None): "None", bool: "a flag", str: "a text", int: "an integer", float: "a number", list: "a list"}
    return kinds.get(type(value), "a mapping" if isinstance(value, dict) else f"a {type(value).__name__}")


def _of_its_type(declaration: Declared, value: Any) -> bool:
    """Whether ``value`` has the Python type a config field of ``declaration`` holds: a number (not a bool) for a
    number, a text or path for a path, a text for the rest."""
    if isinstance(declaration, (Integer, Real)):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(declaration, PathDeclared):
        return isinstance(value, (str, os.PathLike))
    return isinstance(value, str)


def vllm_options() -> tuple[str, ...]:
    """TRL's GRPOConfig fields that configure its vLLM generation (``vllm_*``), read only with ``use_vllm``."""
    from trl import GRPOConfig

    return tuple(f.name for f in dataclasses.fields(GRPOConfig) if f.name.startswith("vllm_"))


def check_installed(config: Any) -> None:
    """The packages ``config`` asks for are installed (the libraries import them only once training runs, after
    the SFT stage has trained and saved a model): ``use_vllm`` (vllm), ``use_liger_kernel`` (liger_kernel),
    ``deepspeed`` (deepspeed), each ``report_to`` integration (transformers' ``get_available_reporting_integrations``)
    and the optimizer ``optim`` names (transformers' ``Trainer.get_optimizer_cls_and_kwargs``). A refusal is a
    ``ConfigError`` naming the field and the package."""
    import importlib.util

    for name, package in (("use_vllm", "vllm"), ("use_liger_kernel", "liger_kernel"), ("deepspeed", "deepspeed")):
        if getattr(config, name, None) and importlib.util.find_spec(package) is None:
            raise ConfigError(name, getattr(config, name), f"needs the package {package}, which is not installed")
    from transformers.integrations.integration_utils import get_available_reporting_integrations

    available = set(get_available_reporting_integrations())
    for item in config.report_to or []:
        if item not in ("none", "all") and item not in available:
            raise ConfigError(
                "report_to",
                item,
                f"the {item} integration is not installed (installed: {', '.join(sorted(available)) or 'none'})",
            )
    from transformers import Trainer

    try:
        Trainer.get_optimizer_cls_and_kwargs(config)
    except ImportError as e:
        raise ConfigError("optim", str(getattr(config.optim, "value", config.optim)), str(e).split("\n")[0]) from None
    except (ValueError, TypeError, AttributeError):  # an optimizer that needs the model to say more: it says later
        pass


def generation_batch(value) -> int:
    """The completions TRL's GRPOConfig generates at once (its ``generation_batch_size``), from the fields as given:
    ``generation_batch_size``, else ``per_device_train_batch_size x processes x steps_per_generation`` (default
    ``gradient_accumulation_steps``), the processes from ``$WORLD_SIZE`` (1 unset)."""
    if value("generation_batch_size") is not None:
        return value("generation_batch_size")
    steps = value("steps_per_generation") or value("gradient_accumulation_steps")
    return value("per_device_train_batch_size") * int(os.environ.get("WORLD_SIZE", "") or 1) * steps


GENERATION_RELATIONS: tuple[Relation, ...] = (
    Exclusive(
        "steps_per_generation",
        "generation_batch_size",
        why="each sets how many completions TRL generates at once (the other follows from it)",
    ),
    Holds(
        "fp16",
        "bf16",
        holds=lambda value, is_set: not (value("fp16") and value("bf16")),
        why="at most one of half precisions: bf16 is TRL's default, so pass {bf16} false with {fp16} true",
    ),
    Holds(
        "per_device_train_batch_size",
        "num_generations",
        "steps_per_generation",
        "generation_batch_size",
        "gradient_accumulation_steps",
        holds=lambda value, is_set: generation_batch(value) % value("num_generations") == 0,
        why=lambda value: (
            f"TRL generates {generation_batch(value)} completions at once (per_device_train_batch_size x "
            "processes x steps_per_generation, or generation_batch_size), not whole groups of {num_generations} "
            f"{value('num_generations')}"
        ),
    ),
)
"""Relations ``ATRGRPOConfig`` checks before TRL's own ``__post_init__``, which checks them too but names none of
the fields it reads (``generation_batch_size (12) must be divisible by num_generations (8)``)."""


@functools.cache
def training_relations() -> tuple[Relation, ...]:
    """Relations between ``ATRGRPOConfig``'s fields (TRL's own fields among them: built when first asked for, so
    that importing this module does not import TRL)."""
    return (
        Requires(
            "kl_estimator",
            "beta",
            test=lambda beta: beta > 0,
            words="> 0",
            why="it estimates the KL to the reference model, which beta weighs",
        ),
        Requires(
            "true_kl_delta", "measure_true_kl", equals=True, why="it is the threshold of true_kl/frac_above_delta*"
        ),
        Requires(
            "fast_generation_prompt_tokens",
            "fast_generation",
            equals="compiled",
            why="the prompt room of the compiled path's static KV cache",
        ),
        Requires(
            "use_vllm",
            "fast_generation",
            equals=("off", "merged_lora", "auto"),
            why="fast_generation='compiled' compiles transformers' generate, which vLLM replaces",
        ),
        Requires(
            "use_transformers_continuous_batching",
            "fast_generation",
            equals=("off", "merged_lora", "auto"),
            why="fast_generation='compiled' compiles transformers' generate, which continuous batching replaces",
        ),
        Holds(
            "max_steps",
            holds=lambda value, is_set: value("max_steps") != 0,
            why="expected an integer >= 1, or -1 (epochs)",
        ),
        Holds(
            "num_train_epochs",
            "max_steps",
            holds=lambda value, is_set: value("max_steps") > 0 or value("num_train_epochs") > 0,
            why="a run of no steps: {max_steps} is -1, so the epochs decide; expected a number > 0",
        ),
        Holds(
            "cache_implementation",
            "fast_generation",
            holds=lambda value, is_set: (
                value("fast_generation") != "compiled" or value("cache_implementation") in (None, "static")
            ),
            why="{fast_generation} compiled uses a static KV cache; leave it unset",
        ),
        Requires(
            "num_train_epochs",
            "max_steps",
            equals=-1,
            why="a max_steps above 0 ends the run whatever the epochs; -1 trains by epochs",
        ),
        *(
            Requires(name, "use_vllm", equals=True, why="it configures TRL's vLLM generation")
            for name in vllm_options()
        ),
        Requires(
            "save_steps", "save_strategy", equals="steps", why="transformers saves every save_steps under steps only"
        ),
        Requires(
            "logging_steps",
            "logging_strategy",
            equals="steps",
            why="transformers logs every logging_steps under steps only",
        ),
        AtMost("entropy_coef_min", "entropy_coef_max", why="the adaptive entropy coefficient moves between them"),
        *(
            Requires(name, "use_adaptive_entropy", equals=True, why="it steers the adaptive entropy coefficient")
            for name in ("entropy_target", "entropy_coef_delta", "entropy_coef_min", "entropy_coef_max")
        ),
    )


RUN_RELATIONS: tuple[Relation, ...] = (
    Holds(
        "model_name_or_path",
        "tiny",
        holds=lambda value, is_set: not (value("tiny") and value("model_name_or_path")),
        why="{tiny} true builds the tiny model, and this names another one to train; give one of them",
    ),
    Holds(
        "model_name_or_path",
        "tiny",
        holds=lambda value, is_set: value("tiny") or value("model_name_or_path"),
        why="no model to train: give a hub id or a folder, or {tiny} true",
    ),
    *(
        Requires(name, "sft_steps", test=lambda steps: steps > 0, words="> 0", why="it configures the SFT stage")
        for name in (
            "sft_dataset_name",
            "sft_dataset_path",
            "sft_learning_rate",
            "sft_batch_size",
            "sft_implementation",
        )
    ),
    *(
        Requires(name, "use_peft", equals=True, why="it configures the LoRA adapter, which use_peft builds")
        for name in (
            "lora_r",
            "lora_alpha",
            "lora_dropout",
            "lora_target_modules",
            "lora_target_parameters",
            "lora_modules_to_save",
            "lora_task_type",
            "use_rslora",
            "use_dora",
        )
    ),
    Requires("tiny_vocab", "tiny", equals=True, why="it is the vocabulary of the tiny model"),
    Requires("use_vllm_if_available", "backend", equals="trl", why="Unsloth generates with its own fast_inference"),
    Requires("use_peft", "sft_implementation", equals="trl", why="the 'plain' SFT loop trains every weight"),
    Holds(
        "reward_control",
        "per_device_train_batch_size",
        "num_generations",
        holds=lambda value, is_set: (
            value("reward_control") != "shuffled"
            or value("per_device_train_batch_size") % value("num_generations") == 0
        ),
        why="'shuffled' permutes rewards within whole groups: {per_device_train_batch_size} must be a multiple of "
        "{num_generations}",
    ),
)
"""Relations between fields of a run's three configs (``ScriptArguments``, ``ATRGRPOConfig``, ``trl.ModelConfig``)."""


def check_relations_of(relations, configs: tuple[Any, ...]) -> None:
    """The first relation of ``relations`` the fields of ``configs`` break, as a ``ConfigError`` naming the field (a
    field is looked up in the first config that has it)."""
    owners = {}
    for config in configs:
        for f in dataclasses.fields(config):
            owners.setdefault(f.name, config)

    def value(name: str) -> Any:
        return getattr(owners[name], name)

    keep = lambda name: "{" + name + "}"  # noqa: E731 - the way in names the other fields (ConfigError.worded)
    for relation in relations:
        if any(name not in owners for name in relation.names):  # a field this TRL release does not have
            continue
        broken = check_relations((relation,), lambda name: is_set(owners[name], name), value, keep)
        if broken is not None:
            name, why = broken
            error = ConfigError(name, value(name), why, others=relation.names)
            error.relation = relation
            raise error
