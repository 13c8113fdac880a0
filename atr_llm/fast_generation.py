"""Faster generation inside the trainer without vLLM: LoRA merged into the base weights while TRL generates.

With LoRA on every linear layer, each decode step of an unmerged PEFT model runs three matrix products per layer
(``W x``, ``A x``, ``B (A x)``) and the adapter's Python wrappers; merged, one. The adapter is merged from its
current weights at every generation (so each generation samples from the policy after the last optimizer step),
and after it every base weight is restored **bit for bit** from a copy taken before the merge (PEFT's own
``unmerge`` subtracts the delta back, which rounds: a base weight would drift a little at every generation). Only
generation sees the merged weights: the loss, pi_old's log-probs and the gradients run on the unmerged model.

Modes (``ATRGRPOConfig.fast_generation``): ``"off"`` (TRL's generation as it is), ``"merged_lora"``, ``"auto"``
(``merged_lora`` on a CUDA device for a LoRA model generating with transformers; ``off`` otherwise: on a CPU the
tiny models gain nothing measurable). The choice is logged when the trainer starts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

MODES = ("off", "merged_lora", "auto")
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


def generation_context(mode: str, model):
    """The context TRL's generation runs in for ``mode`` (a resolved mode: ``"off"`` or ``"merged_lora"``)."""
    return lora_merged_for_generation(model) if mode == "merged_lora" else contextlib.nullcontext(0)
