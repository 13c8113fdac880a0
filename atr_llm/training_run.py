"""A run of ``python -m atr_llm.train`` once its configuration is built and checked (``atr_llm.train.parse``): the
model and tokenizer, SFT (unless resuming), GRPO with the chosen rule, the final model and the summary, in the output
folder, which one run at a time holds (``atr_llm.run_lock``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from .files import atomic_write_text, directory_written_whole


def load_model_and_tokenizer(script_args, model_args, training_args):
    from .tiny import build_tokenizer_and_model

    attention = getattr(model_args, "attn_implementation", None)  # checked by check_model_options
    if script_args.tiny:
        tok, model = build_tokenizer_and_model(script_args.tiny_vocab, seed=training_args.seed)
        if attention is not None:
            model.set_attn_implementation(attention)
        dtype = getattr(model_args, "dtype", None)
        if dtype not in (None, "auto"):  # trl.ModelConfig's dtype, honoured for the tiny model too
            import torch

            model = model.to(getattr(torch, dtype))
        return model, tok
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = model_args.model_name_or_path
    if not name:
        raise ValueError("set --model_name_or_path (a hub id such as Qwen/Qwen3-1.7B or a local folder) or --tiny")
    # TRL >= 1.16's ModelConfig has no trust_remote_code field (older ones do)
    hub = {
        "revision": getattr(model_args, "model_revision", None) or "main",
        "trust_remote_code": getattr(model_args, "trust_remote_code", False),
    }
    tok = AutoTokenizer.from_pretrained(name, **hub)
    if tok.pad_token is None or tok.pad_token_id == tok.eos_token_id:
        tok.pad_token = "<|endoftext|>" if "<|endoftext|>" in tok.get_vocab() else tok.eos_token
    dtype = model_args.dtype if getattr(model_args, "dtype", None) not in (None, "auto") else "auto"
    extra = {"attn_implementation": attention} if attention is not None else {}
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **hub, **extra)
    return model, tok


def run(config) -> dict:
    """Train as ``config`` (an ``atr_llm.config.RunConfig``, checked whole when it was built) says: SFT (unless
    resuming), GRPO, the final model and the summary, in its output folder, which one run at a time holds."""
    from .evaluation_generators import vllm_available
    from .run_lock import output_dir_lock

    note = choose_generation(config.script, config.training, vllm_usable=vllm_available())
    if note:
        warnings.warn(note, stacklevel=1)
    out = Path(config.training.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with output_dir_lock(out):  # one run per folder: a second one is refused here, before any model loads
        return _train(config.script, config.training, config.model, config.datasets, out, config.checkpoint)


def _train(script_args, training_args, model_args, loaded, out: Path, checkpoint: Path | None) -> dict:
    """The run itself, from the data to the final model and the summary, inside the folder's lock; ``checkpoint``
    is the folder the run resumes, as ``RunConfig`` resolved and checked it (``latest`` resolved once, there)."""
    from trl import get_peft_config

    from .data import load_source, to_grpo_dataset
    from .rewards import CorrectnessReward, GroupShuffledReward
    from .trainer import ATRGRPOTrainer

    train_ds = loaded.get("dataset_path") or load_source(  # a local file was read by the checks already
        script_args.dataset_name, script_args.dataset_path, script_args.dataset_limit, seed=training_args.seed
    )

    if script_args.backend == "unsloth":
        from .unsloth_backend import load_unsloth_model
        from .unsloth_trainer import unsloth_trainer_class

        model, tok = load_unsloth_model(model_args, training_args)
        trainer_cls = unsloth_trainer_class()
    else:
        model, tok = load_model_and_tokenizer(script_args, model_args, training_args)
        trainer_cls = ATRGRPOTrainer
    peft_config = get_peft_config(model_args)

    if script_args.sft_steps > 0 and checkpoint is None:
        from .sft import run_sft

        sft_ds = loaded.get("sft_dataset_path") or load_source(
            script_args.sft_dataset_name or script_args.dataset_name,
            script_args.sft_dataset_path,
            script_args.dataset_limit,
            seed=training_args.seed + 1,
        )
        model = run_sft(
            model,
            tok,
            sft_ds,
            out / "sft",
            max_steps=script_args.sft_steps,
            learning_rate=script_args.sft_learning_rate,
            batch_size=script_args.sft_batch_size,
            seed=training_args.seed,
            peft_config=peft_config,
            implementation=script_args.sft_implementation,
        )
        if peft_config is not None:  # RL trains a fresh adapter on top of the merged SFT weights
            model = model.merge_and_unload()

    reward = CorrectnessReward(
        timeout_seconds=script_args.reward_timeout_seconds,
        truncated_reward=script_args.truncated_reward,
        eos_token_ids=eos_token_ids(tok, model),
    )
    if script_args.reward_control == "shuffled":  # the no-signal control: same rewards, permuted within each group
        reward = GroupShuffledReward(reward, training_args.num_generations, training_args.seed)
    trainer = trainer_cls(
        model=model,
        reward_funcs=[reward],
        args=training_args,
        train_dataset=to_grpo_dataset(train_ds),
        processing_class=tok,
        peft_config=peft_config,
    )
    trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
    save_final_model(trainer, out)
    summary = summarise(trainer.state.log_history)
    atomic_write_text(out / "train_summary.json", json.dumps(summary, indent=1))
    atomic_write_text(out / "log_history.json", json.dumps(trainer.state.log_history))
    print(json.dumps(summary, indent=1))
    return summary


def save_final_model(trainer, out: Path) -> Path:
    """``out/final``, written whole or not at all: saved into ``final.partial`` and renamed into place (a run killed
    while saving leaves no ``final/`` that looks finished; an earlier ``final/``, with ``--overwrite``, is replaced)."""
    from .checkpoints import write_method_record

    with directory_written_whole(out / "final") as partial:
        trainer.save_model(str(partial))
        if hasattr(trainer.args, "resolved_method"):
            write_method_record(partial, trainer.args.resolved_method, trainer.model)
    return out / "final"


def choose_generation(script_args, training_args, *, vllm_usable: bool) -> str | None:
    """Apply ``use_vllm_if_available``: switch on TRL's colocated vLLM (``use_vllm``, ``vllm_mode="colocate"``)
    when ``vllm_usable`` (vllm importable and CUDA present); else return the warning to print (None: nothing
    to say: the user chose ``use_vllm`` themselves, did not ask, or runs the Unsloth backend, whose vLLM is its
    own ``fast_inference`` and which refuses TRL's vLLM importance-sampling correction)."""
    if not script_args.use_vllm_if_available or training_args.use_vllm or script_args.backend == "unsloth":
        return None
    if vllm_usable:
        training_args.use_vllm = True
        training_args.vllm_mode = "colocate"
        return None
    return (
        "vllm is not usable here (not installed, or no CUDA device): generating with transformers' generate, "
        "which is several times slower for long completions; pip install vllm on a CUDA machine for TRL's "
        "colocated vLLM generation"
    )


def eos_token_ids(tokenizer, model) -> set[int]:
    """The ids that end a completion: the tokenizer's eos and the model's generation-config eos (an int or a
    list), as TRL's generation stops on them."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen if isinstance(gen, (list, tuple)) else [gen])
    return {int(i) for i in ids if i is not None}


def summarise(log_history: list[dict]) -> dict:
    """Mean reward over the first and last quarter of logged steps, and the constraint's masked fraction."""
    steps = [h for h in log_history if "reward" in h]
    if not steps:
        return {"logged_steps": 0}
    q = max(1, len(steps) // 4)
    mean = lambda rows, k: sum(r.get(k, 0.0) for r in rows) / len(rows)  # noqa: E731
    return {
        "logged_steps": len(steps),
        "reward_first_quarter": mean(steps[:q], "reward"),
        "reward_last_quarter": mean(steps[-q:], "reward"),
        "frac_masked_mean": mean(steps, "clip/frac_masked"),
        "ratio_max_mean": mean(steps, "clip/ratio_max"),
        "entropy_last": steps[-1].get("entropy"),
        "completion_length_last": steps[-1].get("completions/mean_length"),
        "truncated_frac_last_quarter": mean(steps[-q:], "completions/clipped_ratio"),
    }
