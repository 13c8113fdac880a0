"""The trainer's configuration, in one place. Read it in this order:

1. ``fields`` -- every value a run takes, declared once: each field's domain, the environment variables a run reads,
   the relations between fields (``atr_llm.relations``: ``Exclusive``, ``Requires``, ``AtMost``, ``Holds``), and
   ``ConfigError``, the one refusal.
2. ``trainer_config`` -- ``ATRGRPOConfig``: TRL's ``GRPOConfig`` plus ours, and which registry rule a config trains
   (the registry's parameters as fields, TRL's own loss options mapped onto a rule, ``resolve_method``, run once when
   the config is built). Its constructor is the one check.
3. ``run`` -- a whole run: ``ScriptArguments`` (data, model source, stages), trl's ``ModelConfig`` and
   ``ATRGRPOConfig`` in one ``RunConfig``, whose constructor checks what spans them (model options, resume
   compatibility, the output folder, the data files) before any work.

Every way in builds these objects and goes through their constructors: ``ATRGRPOConfig(...)`` in Python, ``python -m
atr_llm.train`` (its command line and ``--config`` YAML file only turn text into values), ``--resume_from_checkpoint``
(``RunConfig``), and the environment. A refusal is a ``ConfigError`` (a ValueError) naming the field; the command
line words it with the place the value came from.
"""

from typing import TYPE_CHECKING

from .fields import ConfigError

if TYPE_CHECKING:  # what the names below are, for readers and tools (they are imported on first use, __getattr__)
    from .run import RunConfig, ScriptArguments
    from .trainer_config import (
        TRL_METHOD,
        ATRGRPOConfig,
        clipping_is_inert,
        config_field,
        inert_clipping_message,
        trl_loss_types,
    )

_LAZY = {
    "ATRGRPOConfig": "trainer_config",
    "TRL_METHOD": "trainer_config",
    "clipping_is_inert": "trainer_config",
    "config_field": "trainer_config",
    "inert_clipping_message": "trainer_config",
    "trl_loss_types": "trainer_config",
    "RunConfig": "run",
    "ScriptArguments": "run",
}
"""Names imported on first use: ``atr_llm.config.fields`` (the declarations and the environment's check) stays
importable without TRL, so an entry point checks the environment before torch reads it."""


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ATRGRPOConfig",
    "ConfigError",
    "RunConfig",
    "ScriptArguments",
    "TRL_METHOD",
    "clipping_is_inert",
    "config_field",
    "inert_clipping_message",
    "trl_loss_types",
]
