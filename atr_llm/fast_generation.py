"""Faster generation inside the trainer without vLLM: LoRA merged into the base weights while TRL generates.

With LoRA on every linear layer, each decode step of an unmerged PEFT model runs three matrix products per layer
(``W x``, ``A x``, ``B (A x)``) and the adapter's Python wrappers; merged, one. The adapter is merged from its
current weights at every generation (so each generation samples from the policy after the last optimizer step),
and after it every base weight is restored **bit for bit** from a copy taken before the merge (PEFT's own
``unmerge`` subtracts the delta back, which rounds: a base weight would drift a little at every generation). Only
generation sees the merged weights: the loss, pi_old's log-probs and the gradients run on the unmerged model.

``"compiled"`` adds, to the merged LoRA, what removes the per-token Python and kernel-launch cost of a decode step:
a static KV cache of a fixed length (``max_completion_length`` + ``PROMPT_ALLOWANCE`` tokens, so every generation
has the same shapes) and transformers' automatic ``torch.compile`` of the decode step (mode ``reduce-overhead``:
CUDA graphs on a GPU; TRL itself turns the automatic compile off with ``disable_compile=True``). The first
generation pays the compilation; a prompt longer than the allowance makes a larger cache and compiles once more.

Modes (``ATRGRPOConfig.fast_generation``): ``"off"`` (TRL's generation as it is), ``"merged_lora"``,
``"compiled"``, ``"auto"`` (``merged_lora`` on a CUDA device for a LoRA model generating with transformers; ``off``
otherwise: on a CPU the tiny models gain nothing measurable). The choice is logged when the trainer starts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

MODES = ("off", "merged_lora", "compiled", "auto")
PROMPT_ALLOWANCE = 512  # prompt tokens the static cache of "compiled" holds beside the completion
logger = logging.getLogger(__name__)


def lora_layers(model) -> list:
    """The PEFT tuner layers of ``model`` that can merge (LoRA linear layers), unmerged now."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # pragma: no cover - peft is part of the [llm] extra
        return []
    return [m for m in model.modules() if isinstance(m, BaseTunerLayer) and hasattr(m, "merge") and not m.merged]


@contextlib.contextmanager
def lora_merged_for_generation(model) -> Iterator[int]:
    """Within the block the LoRA deltas of ``model`` are merged into its base weights; after it (also on an error)
    every base weight holds its earlier bits again and PEFT counts the layers unmerged. Yields the number of layers
    merged (0 for a model without LoRA: then nothing changes)."""
    layers = lora_layers(model)
    saved = [(layer, layer.get_base_layer().weight.detach().clone()) for layer in layers]
    try:
        with torch.no_grad():
            for layer in layers:
                layer.merge()
        yield len(layers)
    finally:
        with torch.no_grad():
            for layer, weight in saved:
                if layer.merged:
                    layer.unmerge()
                layer.get_base_layer().weight.data.copy_(weight)


def resolve_mode(mode: str, *, model, use_vllm: bool, device: torch.device | str) -> str:
    """The mode a trainer uses: ``mode`` itself unless ``"auto"``, which is ``"merged_lora"`` for a LoRA model that
    generates with transformers on a CUDA device and ``"off"`` otherwise."""
    if mode not in MODES:
        raise ValueError(f"fast_generation must be one of {MODES}, got {mode!r}")
    if mode != "auto":
        return mode
    cuda = torch.device(device).type == "cuda"
    return "merged_lora" if cuda and not use_vllm and lora_layers(model) else "off"


@contextlib.contextmanager
def input_embedding_hooks_set_aside(model) -> Iterator[int]:
    """Within the block the input embedding of ``model`` has no forward hooks; after it (also on an error) it has
    its own again, in their order. Yields how many were set aside.

    Why: with gradient checkpointing and a PEFT model, the embedding carries hooks that make its output require
    grad (for checkpointed backward passes: nothing under ``no_grad`` generation needs them), and each of TRL's
    generations (which turns checkpointing off and on again) leaves more of them (on this CPU: 2 more per
    generation, ``tests/test_fast_generation.py``). The compiled decode step guards on their number, so it would
    compile again at every generation."""
    get = getattr(model, "get_input_embeddings", None)
    embedding = get() if get is not None else None
    if embedding is None:
        yield 0
        return
    hooks = embedding._forward_hooks
    kept = list(hooks.items())
    hooks.clear()
    try:
        yield len(kept)
    finally:
        hooks.clear()
        hooks.update(kept)


@contextlib.contextmanager
def _compiled_generation(model) -> Iterator[int]:
    with lora_merged_for_generation(model) as merged, input_embedding_hooks_set_aside(model):
        yield merged


def generation_context(mode: str, model):
    """The context TRL's generation runs in for ``mode`` (a resolved mode): the LoRA merged for ``"merged_lora"``;
    merged and the input embedding's hooks set aside for ``"compiled"``; nothing for ``"off"``. Yields the number
    of LoRA layers merged."""
    if mode == "compiled":
        return _compiled_generation(model)
    return lora_merged_for_generation(model) if mode == "merged_lora" else contextlib.nullcontext(0)


def compiled_generation_config(generation_config, *, device: torch.device | str, prompt_allowance: int = PROMPT_ALLOWANCE):
    """A copy of TRL's ``generation_config`` for mode ``"compiled"``: ``cache_implementation="static"`` with
    ``max_cache_len = max_new_tokens + prompt_allowance`` (one cache shape for every generation, so one compiled
    decode step), ``disable_compile=False`` and a ``CompileConfig``: ``reduce-overhead`` (CUDA graphs) on a GPU;
    elsewhere inductor's default mode, with transformers' ``_compile_all_devices`` flag (it compiles only on
    accelerators otherwise), which is what the CPU tests run."""
    import copy

    from transformers import CompileConfig

    if not generation_config.max_new_tokens:
        raise ValueError(f"fast_generation='compiled' needs max_new_tokens, got {generation_config.max_new_tokens!r}")
    if generation_config.cache_implementation not in (None, "static"):
        raise ValueError(
            f"fast_generation='compiled' uses a static cache, got cache_implementation="
            f"{generation_config.cache_implementation!r}; leave it unset"
        )
    cuda = torch.device(device).type == "cuda"
    config = copy.deepcopy(generation_config)
    config.cache_implementation = "static"
    config.max_cache_len = int(generation_config.max_new_tokens) + int(prompt_allowance)
    config.disable_compile = False
    config.compile_config = CompileConfig(mode="reduce-overhead" if cuda else "default")
    if not cuda:
        config.compile_config._compile_all_devices = True
    return config
