"""Unsloth backend (``--backend unsloth``, CUDA only). Imported lazily: nothing here runs without it.

What Unsloth 2026.10.9 / unsloth_zoo 2026.10.9 do, read from their source (with the trl 1.15.0 they pin):

- ``import unsloth`` rebinds ``trl.GRPOTrainer`` / ``trl.GRPOConfig`` to generated classes (``UnslothGRPOTrainer``,
  a copy of TRL's source, and a config with ``unsloth_num_chunks``, ``unsloth_grpo_mini_batch``, ...). So unsloth is
  imported before ``atr_llm.trainer`` (``python -m atr_llm.train`` does it when it sees ``backend: unsloth``),
  and ``ATRGRPOConfig`` then carries Unsloth's fields and defaults.
- Unsloth's training forward ignores the 2-D attention mask: its own ``_get_per_token_logps_and_entropies``
  left-packs each row (``unsloth_zoo.rl_replacements.left_pack_padding``: left padding moved to the right, where
  causal attention never sees it) and returns log-probs detached, ``entropies=None``, in a layout ``max_left_pad``
  columns wider than TRL's. None of that fits ``atr_theory.policy_loss``.
- ``UNSLOTH_RETURN_HIDDEN_STATES=1`` makes the model return its last hidden states (after the final norm) in
  ``.logits``; unsloth_zoo's ``chunked_hidden_states_selective_log_softmax_recompute`` turns hidden states and
  the LM head into per-token log-probs (and entropies) chunk by chunk, never holding (B, T, V), with a backward
  that recomputes each chunk's logits.
- Unsloth rewrites TRL's vLLM importance-sampling blocks to ``if False and ...``: no
  ``importance_sampling_ratio`` reaches the loss.

So this backend scores with ``unsloth_logps_and_entropies``: left-pack, hidden states from the model,
unsloth_zoo's chunked scorer **with gradient**, then the rows gathered back into TRL's completion layout. The same
function scores the old (and reference) log-probs, so the ratio is exactly 1 where no update happened. The loss is
``ATRGRPOTrainer``'s ``_compute_loss`` (``atr_theory.policy_loss``, unchanged). The vLLM
importance-sampling correction is refused with a message (Unsloth's trainer never computes its ratio), and so
are the full-distribution methods (tr_ppo, truly_ppo: they need (B, T, V) log-probs that this path never builds).
"""

from __future__ import annotations

import torch

from .model_parts import base_model, environment_variable, is_unsloth_model, last_hidden_states, output_head  # noqa: F401

UNSLOTH_VERSION_READ = "2026.10.9"


def require_unsloth() -> None:
    """Raise a clear error unless CUDA and the ``unsloth`` package are available (imports unsloth: call it before
    anything imports trl's GRPOTrainer / GRPOConfig)."""
    if not torch.cuda.is_available():
        raise ValueError("--backend unsloth needs a CUDA GPU (none found); use --backend trl on CPU")
    try:
        import unsloth  # noqa: F401
    except ImportError as e:
        raise ValueError(f"--backend unsloth needs the unsloth package: pip install 'atr-grpo[gpu]' ({e})") from None


def left_pad_counts(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) number of leading zeros of each row of the (B, L) attention mask."""
    return (attention_mask.cumsum(1) == 0).sum(1)


def left_pack(input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """Each row rotated left by its left-padding count: real tokens from column 0, the pads moved to the end (as
    unsloth_zoo's ``left_pack_padding`` lays rows out for Unsloth's mask-free training forward). Returns the packed
    ids and mask and the (B,) shifts."""
    pad = left_pad_counts(attention_mask)
    L = input_ids.size(1)
    src = (torch.arange(L, device=input_ids.device)[None, :] + pad[:, None]) % L
    return input_ids.gather(1, src), attention_mask.gather(1, src), pad


def unsloth_logps_and_entropies(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    temperature: float = 1.0,
    batch_size: int | None = None,
    compute_entropy: bool = False,
    chunks: int = 4,
):
    """Per-token log-probs ``log softmax(W h / temperature)[next token]`` of the last ``logits_to_keep`` tokens, in
    TRL's (B, logits_to_keep) completion layout, with gradient when grad is enabled, and their entropies (no
    gradient) when asked. Rows are left-packed before the forward (Unsloth's training forward ignores the mask),
    scored by ``unsloth_zoo.rl_replacements.chunked_hidden_states_selective_log_softmax_recompute`` (chunks over
    positions, logits recomputed in backward), and gathered back: completion token c of row i is predicted by the
    packed hidden state at ``P - 1 + c - pad_i`` (P = padded prompt length)."""
    from unsloth_zoo.rl_replacements import chunked_hidden_states_selective_log_softmax_recompute as scorer

    head = output_head(model)
    batch_size = batch_size or input_ids.size(0)
    P = input_ids.size(1) - logits_to_keep
    logps, ents = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
        packed, packed_mask, pad = left_pack(ids, mask)
        hidden = last_hidden_states(model, packed, packed_mask)
        cols = (P - 1 + torch.arange(logits_to_keep, device=ids.device))[None, :] - pad[:, None]
        h = hidden.gather(1, cols.clamp(min=0).unsqueeze(-1).expand(-1, -1, hidden.size(-1)))
        lp, ent = scorer(
            h,
            head.weight,
            ids[:, -logits_to_keep:],
            chunks=chunks,
            temperature=temperature,
            lm_head_bias=getattr(head, "bias", None),
            return_entropy=True,
            entropy_requires_grad=False,
        )
        logps.append(lp)
        if compute_entropy:
            ents.append(ent.detach())
    return torch.cat(logps), (torch.cat(ents) if compute_entropy else None)


def unsloth_lora_model(
    path: str,
    max_seq_length: int,
    r: int,
    lora_alpha: int,
    target_modules: list[str],
    seed: int,
    dtype=None,
    fast_inference: bool = False,
):
    """``FastLanguageModel.from_pretrained`` (no 4-bit) with a LoRA from ``FastLanguageModel.get_peft_model``
    (dropout 0, Unsloth's gradient checkpointing). Returns the model and its tokenizer."""
    require_unsloth()
    from unsloth import FastLanguageModel

    model, tok = FastLanguageModel.from_pretrained(
        model_name=path,
        max_seq_length=max_seq_length,
        dtype=dtype,
        load_in_4bit=False,
        fast_inference=fast_inference,
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=r,
        lora_alpha=lora_alpha,
        lora_dropout=0.0,
        target_modules=target_modules,
        use_gradient_checkpointing="unsloth",
        random_state=seed,
    )
    return model, tok


def load_unsloth_model(model_args, training_args):
    """``unsloth_lora_model`` with the paper's LoRA (rank/alpha/targets from ModelConfig)."""
    model, tok = unsloth_lora_model(
        model_args.model_name_or_path,
        # TRL 1.15 / 1.16's GRPOConfig has no max_prompt_length (older ones and Unsloth's patched config may)
        max_seq_length=(getattr(training_args, "max_prompt_length", None) or 512)
        + (training_args.max_completion_length or 1024),
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        target_modules=model_args.lora_target_modules
        or ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        seed=training_args.seed,
        fast_inference=bool(training_args.use_vllm),
    )
    model_args.use_peft = False  # the adapter is already attached
    return model, tok


def check_unsloth_config(args) -> None:
    """Refuse, naming the option, what this backend cannot honour."""
    if "unsloth_grpo_mini_batch" not in type(args).__dataclass_fields__:
        raise RuntimeError(
            "ATRGRPOConfig was defined before unsloth was imported, so it lacks Unsloth's config fields: import "
            "unsloth before atr_llm.trainer (python -m atr_llm.train does it for --backend unsloth)"
        )
    if not args.resolved_method.spec.sampled_tokens_only:
        raise ValueError(
            f"method={args.method!r} reads more than the sampled tokens' log-probs (full (B, T, V) distributions, or "
            "the old policy's top-K), which the Unsloth backend never builds; use --backend trl for tr_ppo, "
            "truly_ppo and dppo_topk_*"
        )
    if getattr(args, "use_vllm", False) and getattr(args, "vllm_importance_sampling_correction", False):
        raise ValueError(
            "vllm_importance_sampling_correction=True cannot be honoured with --backend unsloth: Unsloth's "
            "GRPOTrainer removes TRL's importance-sampling code, so no ratio reaches the loss; set it to false"
        )
