"""The parts of a transformers / PEFT / Unsloth causal LM that the trainer's loss reads: the base model inside a
PEFT wrapper, the final hidden states, and the output head (imported by both ``atr_llm.trainer`` and
``atr_llm.unsloth_backend``, so neither imports the other at import time)."""

from __future__ import annotations

import contextlib
import os

import torch


def is_unsloth_model(model) -> bool:
    """Unsloth's loaders add ``for_training`` / ``for_inference`` to the models they return."""
    return hasattr(model, "for_training") and hasattr(model, "for_inference")


@contextlib.contextmanager
def environment_variable(name: str, value: str):
    """``os.environ[name] = value`` inside the block, the earlier value (or its absence) restored after it."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def base_model(model):
    """The transformers model inside a PEFT wrapper (the model itself when there is none)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def last_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L, H) final-norm hidden states: Unsloth's ``UNSLOTH_RETURN_HIDDEN_STATES=1`` protocol on an Unsloth model,
    the decoder body (``model.model``) on a plain transformers / PEFT model."""
    if is_unsloth_model(model):
        with environment_variable("UNSLOTH_RETURN_HIDDEN_STATES", "1"):
            return model(input_ids=input_ids, attention_mask=attention_mask).logits
    return base_model(model).model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def output_head(model) -> torch.nn.Module:
    """The LM head (output embedding) of a transformers / PEFT / Unsloth model."""
    return base_model(model).get_output_embeddings()


def head_snapshot(model) -> dict[str, torch.Tensor | None]:
    """pi_old's LM head, kept beside its hidden states: a copy of each head tensor that trains, None for a frozen
    one (then the current tensor is pi_old's too, as with LoRA on the decoder)."""
    head = output_head(model)
    return {
        name: (t.detach().clone() if t.requires_grad else None)
        for name, t in (("weight", head.weight), ("bias", getattr(head, "bias", None)))
        if t is not None
    }
