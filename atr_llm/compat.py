"""Every touch of a private TRL / transformers / Unsloth name, in one place, with the versions it was tested on.

The trainer changes one thing in TRL (the loss), but to do it without a second forward or a wrong number it relies on
names TRL does not promise to keep. Each is listed in ``PRIVATE_NAMES`` with what it relies on and a check that
fails, naming it, when an installed release changes it (``tests/test_compat.py`` runs every check against the TRL
releases CI installs: 1.15 and 1.16). ``check_supported_versions`` refuses to start a run on a release outside
``SUPPORTED`` before any model loads (``--allow_untested_versions true`` runs anyway).
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata

SUPPORTED: dict[str, tuple[str, str]] = {
    "trl": ("1.15", "1.17"),
    "transformers": ("5.17", "5.25"),
}
"""Distribution -> the half-open range [low, high) of releases CI tests (``make test`` and ``make test-pins``)."""


def _version_tuple(text: str) -> tuple[int, ...]:
    """``"1.16.0.dev0"`` -> ``(1, 16, 0)``: the numeric release segments, enough to compare against ``SUPPORTED``."""
    parts = []
    for piece in text.split("."):
        digits = re.match(r"\d*", piece).group(0)  # the leading digits: "0rc1" -> "0"
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    return tuple(parts)


def unsupported_versions(installed: dict[str, str] | None = None) -> list[str]:
    """One line per distribution of ``SUPPORTED`` whose installed release lies outside its tested range
    (``installed``: name -> version, default the installed distributions'); empty when all are supported."""
    lines = []
    for name, (low, high) in SUPPORTED.items():
        version = (installed or {}).get(name) if installed is not None else metadata.version(name)
        if version is None:
            continue
        if not (_version_tuple(low) <= _version_tuple(version) < _version_tuple(high)):
            lines.append(f"{name} {version} is installed; atr-grpo is tested with {name}>={low},<{high}")
    return lines


def check_supported_versions(allow_untested: bool = False, installed: dict[str, str] | None = None) -> None:
    """Raise ``RuntimeError`` with one line naming the installed and the supported releases when TRL or transformers
    lies outside ``SUPPORTED``, unless ``allow_untested`` (the private names below may then have changed)."""
    problems = unsupported_versions(installed)
    if problems and not allow_untested:
        raise RuntimeError(
            "; ".join(problems) + " (its private names may differ: pip install 'atr-grpo[llm]' for the tested "
            "releases, or pass --allow_untested_versions true to run anyway)"
        )


# ---------------------------------------------------------------------------------------------------------------
# TRL's log-prob helpers (trl.trainer.utils)
# ---------------------------------------------------------------------------------------------------------------
def trl_logps_kernel_available() -> bool:
    """False for TRL releases (<= 1.15) whose per-token log-prob path needs Triton, absent on CPU-only installs.

    Relies on: ``trl.trainer.utils._ChunkedLogProbFunction`` being None when TRL 1.15's Triton kernel is missing
    (TRL 1.16 has no such name: its path runs everywhere)."""
    try:
        import trl.trainer.utils as trl_utils
    except ImportError:  # pragma: no cover
        return False
    return getattr(trl_utils, "_ChunkedLogProbFunction", True) is not None


@contextlib.contextmanager
def logprob_tile_fitted_to_vocabulary(vocab_size: int) -> Iterator[None]:
    """Within the block, TRL's fused log-prob head tiles the vocabulary at most ``vocab_size`` columns wide.

    TRL (>= 1.16, ``trl.kernels.chunked_logprob``) projects the hidden states onto the vocabulary in
    ``[4096, _CHUNKED_LOGPROB_CHUNK_SIZE]`` tiles (32,768 columns) and allocates that buffer afresh on every call,
    whatever the vocabulary: 512 MiB of float32 for the 512-token toy model, of which it writes 1/64, one page per
    row, so each call pays thousands of page faults (measured: 65 ms per 4,096-token projection instead of ~4 ms;
    the cpu-table GRPO step 1.5x slower). A vocabulary narrower than the tile is one tile either way, so the
    narrowed buffer computes the same numbers bit for bit (test); a vocabulary wider than the tile is unchanged.

    Relies on: the module constant ``trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE`` (read at every call). It is
    process-wide state, set for the block only and restored after it (also on an exception); the trainer's loss
    forward is the only caller, so no other thread reads it meanwhile. A no-op on TRL releases without the constant.
    """
    try:
        import trl.trainer.utils as trl_utils
    except ImportError:  # pragma: no cover
        yield
        return
    default = getattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", None)
    if default is None or vocab_size >= default:
        yield
        return
    trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = int(vocab_size)
    try:
        yield
    finally:
        trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = default


# ---------------------------------------------------------------------------------------------------------------
# The private names relied on, each with a check
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrivateName:
    """A private name of a library the trainer relies on: where, what for, and a check of what is relied on."""

    name: str
    relied_on: str
    check: Callable[[], None]


def attention_implementations() -> set[str]:
    """The attention implementations transformers knows by name: ``eager`` and those of its ``AttentionInterface``
    registry (read from its private ``_global_mapping``, checked by ``PRIVATE_NAMES``)."""
    from transformers import AttentionInterface

    return {"eager", *AttentionInterface._global_mapping}


def optimizers_reading_optim_args() -> frozenset[str] | None:
    """The ``optim`` names whose transformers handler reads ``optim_args`` (its source mentions it: transformers'
    private ``trainer_optimizer._OPTIMIZER_HANDLERS``, 5.x); None where that registry is not there (another version:
    the caller then checks the text's syntax only)."""
    try:
        from transformers import trainer_optimizer

        handlers = trainer_optimizer._OPTIMIZER_HANDLERS
    except (ImportError, AttributeError):
        return None
    return frozenset(
        str(getattr(name, "value", name))
        for name, handler in handlers.items()
        if "optim_args" in inspect.getsource(handler)
    )


def _grpo_trainer():
    from trl import GRPOTrainer

    return GRPOTrainer


def _has_parameters(function, names: tuple[str, ...], what: str) -> None:
    params = list(inspect.signature(function).parameters)
    missing = [n for n in names if n not in params]
    if missing:
        raise AssertionError(f"{what} no longer takes {missing} (its parameters: {params})")


def _check_log_prob_method() -> None:
    _has_parameters(
        _grpo_trainer()._get_per_token_logps_and_entropies,
        ("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy"),
        "GRPOTrainer._get_per_token_logps_and_entropies",
    )


def _check_generate_and_score() -> None:
    _has_parameters(
        _grpo_trainer()._generate_and_score_completions, ("inputs",), "GRPOTrainer._generate_and_score_completions"
    )
    source = inspect.getsource(_grpo_trainer()._generate_and_score_completions)
    if "_get_per_token_logps_and_entropies" not in source or "old_per_token_logps" not in source:
        raise AssertionError(
            "GRPOTrainer._generate_and_score_completions no longer computes old_per_token_logps through "
            "_get_per_token_logps_and_entropies"
        )


def _check_compute_loss() -> None:
    _has_parameters(_grpo_trainer()._compute_loss, ("model", "inputs"), "GRPOTrainer._compute_loss")
    if "_compute_loss" not in inspect.getsource(_grpo_trainer().compute_loss):
        raise AssertionError("GRPOTrainer.compute_loss no longer delegates to _compute_loss")


def _check_train_sampler() -> None:
    from trl.trainer.grpo_trainer import RepeatSampler

    sampler = RepeatSampler(list(range(8)), mini_repeat_count=2, batch_size=2, repeat_count=1, shuffle=True, seed=0)
    for attr in ("generator", "num_samples", "shuffle"):
        if not hasattr(sampler, attr):
            raise AssertionError(f"trl's RepeatSampler has no attribute {attr!r}")
    if not hasattr(_grpo_trainer(), "_get_train_sampler"):
        raise AssertionError("GRPOTrainer has no _get_train_sampler")


def _check_generate_single_turn() -> None:
    if not callable(getattr(_grpo_trainer(), "_generate_single_turn", None)):
        raise AssertionError("GRPOTrainer has no _generate_single_turn (generation with transformers)")


def _check_compiled_generation() -> None:
    import torch
    from transformers import CompileConfig, GenerationConfig

    if "disable_compile=True" not in inspect.getsource(_grpo_trainer().__init__):
        raise AssertionError("GRPOTrainer.__init__ no longer builds generation_config with disable_compile=True")
    if GenerationConfig(max_new_tokens=2, cache_implementation="static", max_cache_len=7).max_cache_len != 7:
        raise AssertionError("GenerationConfig no longer keeps max_cache_len (the static cache's fixed length)")
    if not hasattr(CompileConfig(), "_compile_all_devices"):
        raise AssertionError("CompileConfig has no _compile_all_devices (compiled generation on a CPU)")
    if not isinstance(getattr(torch.nn.Module(), "_forward_hooks", None), dict):
        raise AssertionError("torch.nn.Module has no _forward_hooks dict (the embedding's hooks set aside)")


def _check_packed_gqa_attention() -> None:
    from transformers import AttentionInterface, PretrainedConfig
    from transformers.integrations import sdpa_attention
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: F401
    from transformers.models.qwen3 import modeling_qwen3

    params = list(inspect.signature(sdpa_attention.sdpa_attention_forward).parameters)
    if params[:8] != ["module", "query", "key", "value", "attention_mask", "dropout", "scaling", "is_causal"]:
        raise AssertionError(f"transformers' sdpa_attention_forward takes {params}, not the arguments passed on")
    for interface in (AttentionInterface, AttentionMaskInterface):
        if not callable(getattr(interface, "register", None)) or not isinstance(interface._global_mapping, dict):
            raise AssertionError(f"{interface.__name__} has no register / _global_mapping")
    config = PretrainedConfig()
    config._attn_implementation = "sdpa"
    if config._attn_implementation != "sdpa":
        raise AssertionError("PretrainedConfig._attn_implementation can no longer be set")
    if "self.num_key_value_groups" not in inspect.getsource(modeling_qwen3.Qwen3Attention.__init__):
        raise AssertionError("Qwen3Attention no longer sets num_key_value_groups (query heads per key/value head)")


def _check_metrics() -> None:
    if "self._metrics" not in inspect.getsource(_grpo_trainer().__init__):
        raise AssertionError("GRPOTrainer.__init__ no longer sets self._metrics")


def _check_chunk_size_constant() -> None:
    import trl.trainer.utils as trl_utils

    value = getattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", None)
    kernel = getattr(trl_utils, "_ChunkedLogProbFunction", "absent")
    if value is None and kernel == "absent":
        raise AssertionError("trl.trainer.utils has neither _CHUNKED_LOGPROB_CHUNK_SIZE nor _ChunkedLogProbFunction")
    if value is not None and not (isinstance(value, int) and value > 0):
        raise AssertionError(f"trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE is {value!r}, not a positive int")


def _check_generation_cycle() -> None:
    trainer = _grpo_trainer()
    init, prepare = inspect.getsource(trainer.__init__), inspect.getsource(trainer._prepare_inputs)
    for name in ("self._step", "self._buffered_inputs"):
        if name not in init or name not in prepare:
            raise AssertionError(f"GRPOTrainer no longer keeps its generation cycle in {name}")
    for hook in ("_save_checkpoint", "_load_optimizer_and_scheduler", "_get_output_dir"):
        if not callable(getattr(trainer, hook, None)):
            raise AssertionError(f"GRPOTrainer / transformers' Trainer has no {hook}")
    _has_parameters(trainer._save_checkpoint, ("model", "trial"), "Trainer._save_checkpoint")
    _has_parameters(trainer._load_optimizer_and_scheduler, ("checkpoint",), "Trainer._load_optimizer_and_scheduler")


def _check_unsloth_scorer() -> None:
    try:
        from unsloth_zoo.rl_replacements import chunked_hidden_states_selective_log_softmax_recompute as scorer
    except ImportError:
        return  # checked where unsloth_zoo is installed (make test-pins)
    _has_parameters(
        scorer,
        (
            "hidden_states",
            "lm_head",
            "index",
            "chunks",
            "temperature",
            "lm_head_bias",
            "return_entropy",
            "entropy_requires_grad",
        ),
        "unsloth_zoo's chunked scorer",
    )


def _check_optimizer_handlers() -> None:
    readers = optimizers_reading_optim_args()
    if readers is None or "adamw_torch" in readers or "galore_adamw" not in readers:
        raise AssertionError("transformers.trainer_optimizer._OPTIMIZER_HANDLERS changed: optim_args readers unknown")


PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName(
        "transformers.trainer_optimizer._OPTIMIZER_HANDLERS",
        "which optimizers read optim_args (a handler whose source mentions it): the config refuses optim_args for "
        "any other",
        _check_optimizer_handlers,
    ),
    PrivateName(
        "trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE / _ChunkedLogProbFunction",
        "the tile width of TRL 1.16's fused log-prob head (narrowed per call); TRL 1.15's Triton kernel or None",
        _check_chunk_size_constant,
    ),
    PrivateName(
        "GRPOTrainer._get_per_token_logps_and_entropies",
        "overridden: TRL calls it for the policy's and pi_old's log-probs with these arguments; it returns 2 values "
        "(TRL 1.15) or 3 (1.16), the trainer reads the first two",
        _check_log_prob_method,
    ),
    PrivateName(
        "GRPOTrainer._generate_and_score_completions",
        "overridden: it computes old_per_token_logps through _get_per_token_logps_and_entropies while generating",
        _check_generate_and_score,
    ),
    PrivateName("GRPOTrainer._compute_loss", "overridden: compute_loss delegates the loss to it", _check_compute_loss),
    PrivateName(
        "GRPOTrainer._get_train_sampler / RepeatSampler.generator, num_samples, shuffle",
        "exact resume: the fresh sampler's generator advanced past the epochs already trained",
        _check_train_sampler,
    ),
    PrivateName("GRPOTrainer._metrics", "the clip metrics are logged into it", _check_metrics),
    PrivateName(
        "GRPOTrainer._generate_single_turn",
        "wrapped: fast_generation='merged_lora' merges the LoRA around it",
        _check_generate_single_turn,
    ),
    PrivateName(
        "GRPOTrainer.generation_config (disable_compile=True) / GenerationConfig.max_cache_len / "
        "CompileConfig._compile_all_devices / torch.nn.Module._forward_hooks",
        "fast_generation='compiled': TRL's generation config copied with a static cache of one length and the "
        "automatic compile turned back on; the input embedding's forward hooks set aside while it generates",
        _check_compiled_generation,
    ),
    PrivateName(
        "AttentionInterface / AttentionMaskInterface.register, ._global_mapping, sdpa_attention_forward, "
        "PretrainedConfig._attn_implementation, <Attention>.num_key_value_groups",
        "fast_generation_attention='packed_gqa': an attention function registered with transformers and named in "
        "the model's config while TRL generates (every call but a decode step's goes to transformers' SDPA); "
        "--attn_implementation checked against the registry's names",
        _check_packed_gqa_attention,
    ),
    PrivateName(
        "GRPOTrainer._step, _buffered_inputs / Trainer._save_checkpoint, _load_optimizer_and_scheduler",
        "exact resume inside a generation cycle: the micro-step counter and the buffered batch saved in each "
        "checkpoint and restored in transformers' resume hook",
        _check_generation_cycle,
    ),
    PrivateName(
        "unsloth_zoo.rl_replacements.chunked_hidden_states_selective_log_softmax_recompute",
        "--backend unsloth scores hidden states with it, with gradient",
        _check_unsloth_scorer,
    ),
)
