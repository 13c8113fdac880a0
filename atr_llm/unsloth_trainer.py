"""``UnslothATRGRPOTrainer``: the package's trainer mixins on Unsloth's generated ``GRPOTrainer`` (a module of its
own so that ``atr_llm.unsloth_backend``, which the config's checks import, never imports the trainer)."""

from __future__ import annotations

from .unsloth_backend import check_unsloth_config, require_unsloth, unsloth_logps_and_entropies


def unsloth_trainer_class():
    """``UnslothATRGRPOTrainer``: our loss (``atr_theory.policy_loss``) on Unsloth's generated GRPOTrainer, scored by
    ``unsloth_logps_and_entropies`` for the current, old and reference log-probs alike."""
    require_unsloth()
    import trl

    from .trainer import ATRLossMixin, ExactResumeMixin  # after require_unsloth: unsloth first, then trl

    if "Unsloth" not in trl.GRPOTrainer.__name__:
        raise RuntimeError(f"trl.GRPOTrainer is {trl.GRPOTrainer.__name__}, not Unsloth's: is unsloth importable?")

    class UnslothATRGRPOTrainer(ExactResumeMixin, ATRLossMixin, trl.GRPOTrainer):
        def __init__(self, *args, **kwargs):
            check_unsloth_config(kwargs.get("args"))
            super().__init__(*args, **kwargs)

        def _get_per_token_logps_and_entropies(
            self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, *a, **kw
        ):
            logps, entropies = unsloth_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, self.temperature, batch_size, compute_entropy
            )
            return logps, entropies, None  # Unsloth's generated trainer unpacks three values (the third: aux loss)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if return_outputs:
                raise ValueError("return_outputs is not supported")
            return self._compute_loss(model, inputs)

    return UnslothATRGRPOTrainer
