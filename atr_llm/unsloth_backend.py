"""Unsloth backend (``--backend unsloth``, CUDA only). Imported lazily: nothing here runs without it.

Unsloth rewrites TRL's GRPOTrainer (``UnslothGRPOTrainer``) and its ``compute_loss`` never calls
``_compute_loss``: it computes the loss itself from hidden states. So the override sits in
``compute_loss``: our subclass computes per-token log-probs with a plain forward of the (LoRA) model
and hands them to ``atr_theory.policy_loss`` through :class:`~atr_llm.trainer.ATRGRPOTrainer`'s
``_compute_loss``. This path could not be exercised on this project's CPU machines; it is written
against Unsloth 2026.10's public patching API and fails with a clear message when unavailable.
"""

from __future__ import annotations


def require_unsloth() -> None:
    """Raise a clear error unless CUDA and the ``unsloth`` package are available."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError("--backend unsloth needs a CUDA GPU (none found); use --backend trl on CPU")
    try:
        import unsloth  # noqa: F401
    except ImportError as e:
        raise ValueError(f"--backend unsloth needs the unsloth package: pip install 'atr-grpo[gpu]' ({e})") from None


def load_unsloth_model(model_args, training_args):
    """FastLanguageModel with the paper's LoRA (rank/alpha from ModelConfig)."""
    require_unsloth()
    from unsloth import FastLanguageModel

    model, tok = FastLanguageModel.from_pretrained(
        model_name=model_args.model_name_or_path,
        max_seq_length=(training_args.max_prompt_length or 512) + (training_args.max_completion_length or 1024),
        load_in_4bit=False,
        fast_inference=bool(training_args.use_vllm),
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        target_modules=model_args.lora_target_modules
        or ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        use_gradient_checkpointing="unsloth",
    )
    model_args.use_peft = False  # the adapter is already attached
    return model, tok


def unsloth_trainer_class():
    """A trainer class whose ``compute_loss`` (the method Unsloth's GRPO trainer really uses) routes
    through ATRGRPOTrainer's ``_compute_loss`` and hence ``atr_theory.policy_loss``."""
    require_unsloth()
    from unsloth import PatchFastRL

    PatchFastRL("GRPO", None)
    import trl

    from .trainer import ATRLossMixin

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("return_outputs is not supported")
        return self._compute_loss(model, inputs)

    # built after patching, so the base is Unsloth's GRPOTrainer, not the one imported earlier
    return type("UnslothATRGRPOTrainer", (ATRLossMixin, trl.GRPOTrainer), {"compute_loss": compute_loss})
