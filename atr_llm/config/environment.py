"""The environment variables a run reads, each checked against its domain before any work (``check_environment``;
``atr_llm.train``, ``atr_llm.evaluate`` and the configs call it): a launch's ranks and rendezvous, torch's
``THP_MEM_ALLOC_ENABLE``, and the flags accelerate reads with ``parse_flag_from_env`` (``ACCELERATE_FLAGS``). A refusal
is a ``ConfigError`` naming the variable (``$RANK``)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from ..cli_types import Declared, Integer, OneOf
from .errors import ConfigError

__all__ = ["ACCELERATE_FLAGS", "ENVIRONMENT", "check_environment"]

ACCELERATE_FLAGS = (
    "ACCELERATE_CPU_AFFINITY",
    "ACCELERATE_DEBUG_MODE",
    "ACCELERATE_ENABLE_RICH",
    "ACCELERATE_INIT_INCLUDE_BUFFERS",
    "ACCELERATE_USE_CPU",
    "ACCELERATE_USE_FSDP",
)
"""The ``ACCELERATE_*`` variables accelerate 1.x reads as flags (``parse_flag_from_env``, whose ``str_to_bool`` raises
"invalid truth value", naming no variable, on anything but y/yes/t/true/on/1 and n/no/f/false/off/0;
``tests/test_config.py`` finds the names in accelerate's installed source)."""

TRUTH_VALUES = ("y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0")
"""What accelerate's ``str_to_bool`` takes (any case)."""


ENVIRONMENT: dict[str, Declared] = {
    "RANK": Integer(0),
    "LOCAL_RANK": Integer(-1),
    "WORLD_SIZE": Integer(1),
    "LOCAL_WORLD_SIZE": Integer(1),
    "MASTER_PORT": Integer(1, 65535),
    "THP_MEM_ALLOC_ENABLE": OneOf(("0", "1")),
    "ACCELERATE_MIXED_PRECISION": OneOf(("no", "fp16", "bf16", "fp8")),
}
"""The environment variables a run reads (``accelerate launch`` and ``torchrun`` set them): ``RANK`` decides which
process takes the output folder's lock (``atr_llm.run_lock``); transformers reads ``LOCAL_RANK`` and ``WORLD_SIZE``
when the config is built (``int()`` of ``"abc"`` failed there, naming nothing), torch ``MASTER_PORT``; torch reads
``THP_MEM_ALLOC_ENABLE`` (``atr_llm.huge_pages``: 1 unless the user set it) and ignores a value other than 0 or 1 with a
warning; accelerate ``ACCELERATE_MIXED_PRECISION`` (as it is: ``PrecisionType``'s values) when the accelerator is
built, after the output folder is made. Unset or empty: not given."""


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Each variable of ``ENVIRONMENT`` that is set, against its domain, and what a launch sets together: a rank
    below the world size (``RANK`` > 0 or ``LOCAL_RANK`` >= 0 means a distributed launch, which needs ``WORLD_SIZE``),
    ``LOCAL_RANK`` below ``LOCAL_WORLD_SIZE``, and a world of several processes its rendezvous (``MASTER_ADDR``,
    ``MASTER_PORT``, which ``accelerate launch`` and ``torchrun`` set; torch's ``env://`` needs them). A refusal is a
    ``ConfigError`` naming the variable (``$RANK``)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, declaration in ENVIRONMENT.items():
        text = environ.get(name, "")
        if text.strip():
            try:
                values[name] = declaration(text)
            except argparse.ArgumentTypeError as e:
                raise ConfigError(f"${name}", text, str(e).split(": ", 1)[-1]) from None
    for name in ACCELERATE_FLAGS:
        if name in environ and environ[name].lower() not in TRUTH_VALUES:
            raise ConfigError(f"${name}", environ[name], f"expected a flag accelerate reads: {', '.join(TRUTH_VALUES)}")
    _check_library_variables(environ)
    world = values.get("WORLD_SIZE")
    local = values.get("LOCAL_WORLD_SIZE")
    if local is not None and world is not None and local > world:
        raise ConfigError("$LOCAL_WORLD_SIZE", local, f"expected at most $WORLD_SIZE {world} (processes on this machine)")
    for rank, size in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE"), ("LOCAL_RANK", "WORLD_SIZE")):
        value = values.get(rank)
        launched = value is not None and (value > 0 if rank == "RANK" else value >= 0)
        if launched and values.get(size) is None and size == "WORLD_SIZE":
            raise ConfigError(
                f"${rank}",
                value,
                "a distributed launch's rank, set without $WORLD_SIZE; launch with "
                "accelerate launch or torchrun, which set both",
            )
        if value is not None and values.get(size) is not None and value >= values[size]:
            raise ConfigError(f"${rank}", value, f"expected a rank below ${size} {values[size]}")
    if world is not None and world > 1:
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(v, "").strip()]
        if missing:
            raise ConfigError(
                "$WORLD_SIZE",
                world,
                f"a launch of {world} processes needs ${missing[0]} (accelerate launch and torchrun set it)",
            )


LOG_LEVELS = ("CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG", "NOTSET")
"""The level names Python's ``logging`` takes (accelerate's ``get_logger`` upper-cases ``ACCELERATE_LOG_LEVEL`` into
``Logger.setLevel``, which raises on any other, a traceback at import)."""


def _check_library_variables(environ: Mapping[str, str]) -> None:
    """``ACCELERATE_DYNAMO_BACKEND``: a name of accelerate's ``DynamoBackend``, any case (accelerate upper-cases it when
    the accelerator is built, after the output folder is made); ``ACCELERATE_LOG_LEVEL`` one of ``LOG_LEVELS``;
    ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` unset (accelerate reads it only without a ``GradientAccumulationPlugin``,
    and transformers always passes one: the value was dropped); ``OMP_NUM_THREADS``: OpenMP's list of positive thread
    counts (``4`` or ``4,2``: OpenMP ignores anything else, without a word)."""
    backend = environ.get("ACCELERATE_DYNAMO_BACKEND", "")
    if backend.strip():
        from accelerate.utils import DynamoBackend

        names = [b.value for b in DynamoBackend]
        if backend.upper() not in names:
            raise ConfigError("$ACCELERATE_DYNAMO_BACKEND", backend, f"expected one of {', '.join(n.lower() for n in names)}")
    level = environ.get("ACCELERATE_LOG_LEVEL", "")
    if level.strip() and level.upper() not in LOG_LEVELS:
        raise ConfigError("$ACCELERATE_LOG_LEVEL", level, f"expected a logging level: {', '.join(LOG_LEVELS).lower()}")
    if environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "").strip():
        raise ConfigError(
            "$ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
            environ["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"],
            "never read: transformers gives accelerate its own accumulation (set --gradient_accumulation_steps)",
        )
    threads = environ.get("OMP_NUM_THREADS", "")
    if threads.strip() and not all(p.strip().isdigit() and int(p) >= 1 for p in threads.split(",")):
        raise ConfigError("$OMP_NUM_THREADS", threads, "expected a thread count >= 1 (or OpenMP's list of them: 4,2)")
