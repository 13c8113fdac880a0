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

``"packed_gqa"`` attention (``ATRGRPOConfig.fast_generation_attention``, any mode) changes how a decode step
attends with grouped-query attention (Qwen3-1.7B: 16 query heads on 8 key/value heads). transformers' SDPA path,
once the decode step is compiled (and on every decode step in transformers 5.17), copies each layer's cached keys
and values ``n_rep`` times (``repeat_kv``) before attending: with a static cache that is, per step, a write and a
read of ``n_rep`` times the whole cache on top of the one read attention needs. ``packed_gqa_attention`` instead
folds a KV group's ``n_rep`` query heads into the query-length axis, so SDPA reads each cached key once; the
numbers are the same up to float rounding (the same dot products, in another kernel shape).

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
ATTENTIONS = ("sdpa", "packed_gqa")  # ATRGRPOConfig.fast_generation_attention
PROMPT_ALLOWANCE = 512  # prompt tokens the static cache of "compiled" holds beside the completion (the default)
PACKED_GQA_NAME = "atr_packed_gqa"  # the name packed_gqa_attention is registered under in transformers
logger = logging.getLogger(__name__)


def check_prompt_allowance(value) -> int:
    """``value`` if it is a whole number >= 1 (``fast_generation_prompt_tokens``), else ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"fast_generation_prompt_tokens must be a whole number >= 1, got {value!r}")
    return value


def check_attention(value) -> str:
    """``value`` if it is one of ``ATTENTIONS`` (``fast_generation_attention``), else ``ValueError`` naming it."""
    if value not in ATTENTIONS:
        raise ValueError(f"fast_generation_attention must be one of {ATTENTIONS}, got {value!r}")
    return value


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
def tensors_kept(model) -> Iterator[int]:
    """Within the block anything may replace the tensors of ``model``'s parameters, gradients and buffers (a
    ``model.to(dtype)``); after it (also on an error) every parameter, gradient and buffer is again the very tensor
    it was before, so its dtype and bits are the earlier ones. Nothing is copied: the earlier tensors are kept
    alive through the block (a cast model's memory comes on top). Yields how many tensors it keeps.

    Why: TRL 1.16's continuous-batching generation (``use_transformers_continuous_batching``) casts the whole
    policy to bf16 (``bf16``) or fp16 (``fp16``) in place and leaves it so: from then on the trainable LoRA weights
    and the optimizer's updates live in bf16, where an Adam step of the paper's size (lr 5e-6) on a weight of
    ~0.05 rounds away (bf16's spacing there is ~2.4e-4). Measured on CPU with stock TRL: after 4 steps, 0.6% of
    LoRA A entries had moved beyond bf16 rounding, against 99.9% without continuous batching
    (``tests/test_fast_generation.py``)."""
    parameters = [(p, p.data, p.grad) for p in model.parameters()]
    buffers = [(m, name, b) for m in model.modules() for name, b in m._buffers.items() if b is not None]
    try:
        yield len(parameters) + len(buffers)
    finally:
        for parameter, data, grad in parameters:
            parameter.data = data
            parameter.grad = grad
        for module, name, buffer in buffers:
            module._buffers[name] = buffer


def packed_gqa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """An attention function of transformers' ``AttentionInterface`` signature. For one query token under
    grouped-query attention (``n_rep = module.num_key_value_groups > 1`` query heads per key/value head), SDPA on
    the key/value heads as cached, with a group's query heads as its query positions:

        out[b, g * n_rep + r] = softmax(scale * q[b, g * n_rep + r] K[b, g]^T + mask[b]) V[b, g],   r < n_rep

    computed as ``q (B, H, 1, D) -> (B, H / n_rep, n_rep, D)`` against ``K, V (B, H / n_rep, L, D)``: no
    ``repeat_kv`` copy of the cache. A mask shared by the heads ``(B, 1, 1, L)`` broadcasts; one row per query head
    ``(B, H, 1, L)`` is folded like the queries. Every other call (several query tokens: prefill and the training
    forwards; no GQA; a position bias, softcap or returned weights) is transformers' ``sdpa_attention_forward``
    unchanged. Returns ``(B, 1, H, D)`` and no weights, as transformers' SDPA does."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n_rep = int(getattr(module, "num_key_value_groups", 1) or 1)
    batch, heads, q_len, head_dim = query.shape
    other = kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
    if q_len != 1 or n_rep == 1 or other or kwargs.get("output_attentions", False):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    groups = heads // n_rep
    if groups * n_rep != heads or key.shape[1] != groups:
        raise ValueError(
            f"packed_gqa_attention: {heads} query heads in groups of {n_rep} need {heads / n_rep:g} key/value heads, "
            f"got {key.shape[1]}"
        )
    mask = attention_mask
    if mask is not None and mask.dim() == 4 and mask.shape[1] == heads and heads > 1:
        mask = mask.reshape(mask.shape[0], groups, n_rep, mask.shape[-1])
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(batch, groups, n_rep, head_dim), key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    return out.reshape(out.shape[0], heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def register_packed_gqa() -> str:
    """Register ``packed_gqa_attention`` with transformers' ``AttentionInterface`` (and SDPA's mask builder with
    its ``AttentionMaskInterface``, so the masks are SDPA's) under ``PACKED_GQA_NAME``; returns the name. Calling
    it again changes nothing."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED_GQA_NAME, packed_gqa_attention)
    AttentionMaskInterface.register(PACKED_GQA_NAME, sdpa_mask)
    return PACKED_GQA_NAME


def _model_configs(model) -> list:
    """The distinct model configs among ``model``'s modules (a PEFT wrapper, its base model, its layers share them)."""
    from transformers import PretrainedConfig

    found: dict[int, object] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if isinstance(config, PretrainedConfig):
            found.setdefault(id(config), config)
    return list(found.values())


def check_packed_gqa_model(model) -> None:
    """Raise ``ValueError`` naming the model's attention implementation unless it is ``"sdpa"``: ``packed_gqa``
    replaces SDPA's decode step and nothing else."""
    names = sorted({str(c._attn_implementation) for c in _model_configs(model)} - {"sdpa", PACKED_GQA_NAME})
    if names:
        raise ValueError(
            f"fast_generation_attention='packed_gqa' replaces SDPA's decode step; the model attends with {names}: "
            "load it with attn_implementation='sdpa' or leave fast_generation_attention='sdpa'"
        )


@contextlib.contextmanager
def attention_for_generation(model, attention: str) -> Iterator[str]:
    """Within the block ``model`` attends with ``attention`` (one of ``ATTENTIONS``): nothing changes for
    ``"sdpa"``; for ``"packed_gqa"`` every config of the model names ``packed_gqa_attention`` (registered), and
    after the block (also on an error) ``"sdpa"`` again. Yields the implementation's name."""
    if check_attention(attention) == "sdpa":
        yield "sdpa"
        return
    check_packed_gqa_model(model)
    name = register_packed_gqa()
    configs = _model_configs(model)
    for config in configs:
        config._attn_implementation = name
    try:
        yield name
    finally:
        for config in configs:
            config._attn_implementation = "sdpa"


@contextlib.contextmanager
def _compiled_generation(model) -> Iterator[int]:
    with lora_merged_for_generation(model) as merged, input_embedding_hooks_set_aside(model):
        yield merged


@contextlib.contextmanager
def generation_context(mode: str, model, attention: str = "sdpa") -> Iterator[int]:
    """The context TRL's generation runs in for ``mode`` (a resolved mode): the LoRA merged for ``"merged_lora"``;
    merged and the input embedding's hooks set aside for ``"compiled"``; nothing for ``"off"``; in each, the model
    attends with ``attention`` (``attention_for_generation``). Yields the number of LoRA layers merged."""
    if mode == "compiled":
        inner = _compiled_generation(model)
    else:
        inner = lora_merged_for_generation(model) if mode == "merged_lora" else contextlib.nullcontext(0)
    with attention_for_generation(model, attention), inner as merged:
        yield merged


def compiled_generation_config(
    generation_config, *, device: torch.device | str, prompt_allowance: int = PROMPT_ALLOWANCE
):
    """A copy of TRL's ``generation_config`` for mode ``"compiled"``: ``cache_implementation="static"`` with
    ``max_cache_len = max_new_tokens + prompt_allowance`` (``ATRGRPOConfig.fast_generation_prompt_tokens``; one
    cache shape for every generation, so one compiled decode step), ``disable_compile=False`` and a ``CompileConfig``: ``reduce-overhead`` (CUDA graphs) on a GPU;
    elsewhere inductor's default mode, with transformers' ``_compile_all_devices`` flag (it compiles only on
    accelerators otherwise), which is what the CPU tests run."""
    import copy

    from transformers import CompileConfig

    check_prompt_allowance(prompt_allowance)
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
