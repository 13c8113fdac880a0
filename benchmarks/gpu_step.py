"""One command for one GPU: training steps of ATRGRPOTrainer against stock ``trl.GRPOTrainer`` on a randomly
initialised Qwen3-1.7B architecture, with the paper's LoRA and Table 4's batch geometry.

No hub access: the model is ``Qwen3ForCausalLM`` built from the published Qwen3-1.7B sizes
(``QWEN3_1_7B``) with random weights, the tokenizer is Qwen3's real one built offline
(``atr_llm.tokenizer.qwen3_tokenizer``), the prompts are the package's arithmetic task. A random model
earns no task reward, so the reward is a deterministic function of the completion's token ids (it has
spread, so advantages and gradients are not zero); what is measured is cost, not learning.

Each case (trainer kind x backend) runs in a fresh process with the same seed, model, LoRA initialisation
and data: bf16, LoRA r = 32, alpha = 64 on all linear layers, gradient checkpointing, per-device batch 8,
gradient accumulation 4, 8 generations per prompt, ``num_iterations: 2``, ``loss_type: dr_grpo``.
Reported per case: step time split into generation (``_generate_and_score_completions``: sampling, rewards,
old log-probs), forward + backward and optimizer; completion tokens generated per second and tokens
trained per second; peak GPU memory. Across cases: the first micro-batch's loss and the gradient of the
first optimizer step (where w = 1 exactly, so every clipping rule gives the same loss) compared with the
first case, and whether the cases sampled the same completions (gradients are compared only where they did: on
an H200 one seed in two processes sampled different completions, stock against stock too; the fixed-batch probe,
one batch through each ATR case's ``_compute_loss``, is the comparison that holds there).

    python -m benchmarks.gpu_step                         # 20 steps per case, completions up to 1,536 tokens
    python -m benchmarks.gpu_step --max-completion-length 512 --steps 20
    python -m benchmarks.gpu_step --tiny --steps 2        # the same code on CPU with a tiny model (CI smoke test)
    python -m tools.gpu_wheels                       # the wheels a GPU machine needs beyond torch & co.

Writes ``figures/bench/<card>/gpu_step.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

# Qwen/Qwen3-1.7B's config.json (published sizes); the weights are random here.
QWEN3_1_7B = dict(
    vocab_size=151_936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40_960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)


def table4_grpo_fields() -> dict:
    """The paper's Table 4 (``atr_llm.presets.TABLE4``, the presets' source) restricted to GRPOConfig's fields."""
    import dataclasses

    from trl import GRPOConfig

    from atr_llm.presets import TABLE4

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    return {k: v for k, v in TABLE4.items() if k in fields}


def table4_lora() -> dict:
    from atr_llm.presets import TABLE4

    return {"r": TABLE4["lora_r"], "alpha": TABLE4["lora_alpha"], "targets": TABLE4["lora_target_modules"]}


def synthetic_reward(completion_ids, **_) -> list[float]:
    """A deterministic reward in [0, 1] with spread: (sum of the completion's token ids mod 11) / 10."""
    return [float(sum(ids) % 11) / 10.0 for ids in completion_ids]


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepTimer:
    """Wall-clock time (device-synchronised) of the parts of each optimizer step."""

    def __init__(self):
        self.steps: list[dict] = []  # one record per optimizer step (see make_callback)
        self.generation_calls: list[dict] = []  # seconds and completion tokens per generation call
        self._gen_s = 0.0
        self._gen_tokens = 0
        self._trained_tokens = 0
        self.first_loss: float | None = None
        self.first_completions: str | None = None


def _peak_gib() -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def make_callback(timer: StepTimer, grad_path: Path | None):
    """A transformers TrainerCallback filling ``timer`` and printing one ``CASE-STEP {json}`` line per optimizer
    step (so a case stopped by a time limit still reports its steps), and saving the first step's gradient."""
    import torch
    from transformers import TrainerCallback

    class _Cb(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            _sync()
            self._t0 = time.perf_counter()
            self._t_opt = self._opt_s = float("nan")
            timer._gen_s, timer._gen_tokens, timer._trained_tokens = 0.0, 0, 0

        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            if state.global_step == 0 and grad_path is not None:
                grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
                torch.save(grads, grad_path)
            _sync()
            self._t_opt = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            _sync()
            self._opt_s = time.perf_counter() - self._t_opt

        def on_step_end(self, args, state, control, **kw):
            _sync()
            rec = {
                "step": state.global_step,
                "step_s": time.perf_counter() - self._t0,
                "generation_s": timer._gen_s,
                "optimizer_s": self._opt_s,
                "generated_tokens": timer._gen_tokens,
                "trained_tokens": timer._trained_tokens,
                "peak_gpu_memory_GiB": _peak_gib(),
                "first_microbatch_loss": timer.first_loss,
                "first_completions_sha": timer.first_completions,
            }
            timer.steps.append(rec)
            print("CASE-STEP " + json.dumps(rec), flush=True)

    return _Cb()


def instrument(trainer, timer: StepTimer) -> None:
    """Wrap the trainer's generation and loss to time them and record the first loss and completions."""
    gen = trainer._generate_and_score_completions
    compute_loss = trainer.compute_loss

    def timed_generation(inputs):
        _sync()
        t0 = time.perf_counter()
        out = gen(inputs)
        _sync()
        dt = time.perf_counter() - t0
        n = int(out["completion_mask"].sum())
        timer.generation_calls.append({"s": dt, "completion_tokens": n})
        timer._gen_s += dt
        timer._gen_tokens += n
        if timer.first_completions is None:
            timer.first_completions = hashlib.sha256(out["completion_ids"].cpu().numpy().tobytes()).hexdigest()[:16]
        return out

    def recorded_loss(model, inputs, *args, **kwargs):
        loss = compute_loss(model, inputs, *args, **kwargs)
        if timer.first_loss is None:
            timer.first_loss = float(loss.detach().float())
        timer._trained_tokens += int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
        return loss

    trainer._generate_and_score_completions = timed_generation
    trainer.compute_loss = recorded_loss


def build_model(tiny: bool, seed: int):
    """Qwen3-1.7B's architecture with random bf16 weights on the GPU (``tiny``: the CPU smoke-test model)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    from atr_llm.tiny import build_tokenizer_and_model
    from atr_llm.tokenizer import qwen3_tokenizer

    if tiny:
        return build_tokenizer_and_model("toy", seed=seed)
    tok = qwen3_tokenizer()
    torch.manual_seed(seed)
    config = Qwen3Config(**QWEN3_1_7B, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, do_sample=True
    )
    return tok, model


def unsloth_model(model, tok, args):
    """Save the random model and load it back through the backend's Unsloth loader (bf16, no 4-bit, Table 4's LoRA)."""
    import torch

    from atr_llm.unsloth_backend import unsloth_lora_model

    path = tempfile.mkdtemp()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    del model
    torch.cuda.empty_cache()
    lora = table4_lora()
    model, _ = unsloth_lora_model(
        path,
        max_seq_length=256 + args.max_completion_length,
        r=lora["r"],
        lora_alpha=lora["alpha"],
        target_modules=lora["targets"],
        seed=args.seed,
        dtype=torch.bfloat16,
    )
    return model, None


def reinit_lora(model, seed: int) -> None:
    """Every case starts from the same adapter: lora_A drawn from a generator seeded by the module's path
    (the part from ``layers.``), lora_B zero, whichever library built the adapter."""
    import torch

    for name, p in model.named_parameters():
        if "lora_A" not in name and "lora_B" not in name:
            continue
        key = name[name.find("layers.") :]
        g = torch.Generator().manual_seed(seed * 1_000_003 + int(hashlib.sha256(key.encode()).hexdigest()[:8], 16))
        with torch.no_grad():
            if "lora_A" in name:
                bound = 1.0 / p.shape[1] ** 0.5  # peft's kaiming-uniform(a=sqrt 5) bound
                p.copy_((torch.rand(p.shape, generator=g, dtype=torch.float32) * 2 - 1) * bound)
            else:
                p.zero_()


def fixed_batch_probe(trainer, seed: int, path: Path) -> float:
    """The loss of one fixed batch through the trainer's own ``_compute_loss`` and its LoRA gradient (saved to
    ``path``): left-padded prompts of different lengths, old log-probs = current ones + noise (so ratios move and
    clipping acts), random advantages. The same batch and adapter in every case, so backends can be compared."""
    import torch

    model = trainer.model
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed + 7)
    B, P, T = 8, 32, min(64, trainer.max_completion_length)
    pad_id = trainer.processing_class.pad_token_id
    prompt = torch.randint(10, 50_000 if len(trainer.processing_class) > 50_000 else 300, (B, P), generator=g)
    left = torch.randint(0, P // 2, (B,), generator=g)
    prompt_mask = (torch.arange(P)[None, :] >= left[:, None]).long()
    prompt = torch.where(prompt_mask.bool(), prompt, torch.full_like(prompt, pad_id))
    completion = torch.randint(10, prompt.max().item(), (B, T), generator=g)
    completion_mask = (torch.arange(T)[None, :] < torch.randint(T // 4, T + 1, (B,), generator=g)[:, None]).long()
    inputs = {
        "prompt_ids": prompt.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion.to(device),
        "completion_mask": completion_mask.to(device),
        "advantages": torch.randn(B, generator=g).to(device),
        "num_items_in_batch": completion_mask.sum().to(device),
    }
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    model.train()
    with torch.no_grad():
        old = trainer._get_per_token_logps_and_entropies(model, ids, mask, T)[0]
    inputs["old_per_token_logps"] = old + 0.2 * torch.randn(old.shape, generator=g).to(device)
    trainer.current_gradient_accumulation_steps = 1
    model.zero_grad()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    torch.save({n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}, path)
    model.zero_grad()
    return float(loss.detach().float())


def parse_kind(kind: str) -> tuple[str, dict]:
    """``method[+MODE][+cb][+packed][+pN]`` -> (method, the ATRGRPOConfig fields it sets): ``atr+compiled`` is ATR
    with ``fast_generation='compiled'``; ``+cb`` turns on TRL's ``use_transformers_continuous_batching``
    (transformers' paged ``generate_batch``); ``+packed`` sets ``fast_generation_attention='packed_gqa'``; ``+p128``
    sets ``fast_generation_prompt_tokens=128`` (the static cache's prompt allowance). Raises ValueError naming the
    part that is none of these."""
    from atr_llm.fast_generation import MODES

    method, *flags = kind.split("+")
    modes = [f for f in flags if f in MODES]
    allowances = [f for f in flags if len(f) > 1 and f[0] == "p" and f[1:].isdigit() and int(f[1:]) >= 1]
    unknown = [f for f in flags if f not in MODES and f not in ("cb", "packed") and f not in allowances]
    repeated = len(modes) > 1 or len(allowances) > 1 or flags.count("cb") > 1 or flags.count("packed") > 1
    compiled = modes[:1] == ["compiled"]  # +pN sizes the compiled path's cache, which +cb would bypass (ATRGRPOConfig)
    if unknown or repeated or (allowances and not compiled) or ("cb" in flags and compiled):
        raise ValueError(
            f"{kind!r}: expected method[+MODE][+cb][+packed][+pN] with MODE in {', '.join(MODES)} and N >= 1 (+pN "
            "with +compiled only, +cb without it)"
        )
    fields = {"fast_generation": modes[0] if modes else "off"}
    if "cb" in flags:
        fields["use_transformers_continuous_batching"] = True
    if "packed" in flags:
        fields["fast_generation_attention"] = "packed_gqa"
    if allowances:
        fields["fast_generation_prompt_tokens"] = int(allowances[0][1:])
    return method, fields


def split_steps(kind: str, steps: int) -> tuple[str, int]:
    """``KIND:N`` -> (KIND, N): a case's own number of optimizer steps; ``KIND`` -> (KIND, ``steps``)."""
    name, sep, n = kind.partition(":")
    if not sep:
        return kind, steps
    if not n.isdigit() or int(n) < 1:
        raise ValueError(f"{kind!r}: the steps after ':' must be a whole number >= 1")
    return name, int(n)


def _prompt_tensors(trainer, prompts_ids: list[list[int]]):
    """Left-padded ids and attention mask of ``prompts_ids`` on the trainer's device (TRL's layout)."""
    import torch

    device = trainer.accelerator.device
    pad = trainer.processing_class.pad_token_id
    width = max(len(p) for p in prompts_ids)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts_ids], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts_ids], device=device)
    return ids, mask


def _generate_like_trl(trainer, ids, mask, config, mode: str, attention: str | None = None, **kwargs):
    """``generate`` inside TRL's own generation context (unwrapped model, checkpointing off, no grad) and the
    trainer's ``fast_generation`` context ``mode`` with ``attention`` (default: the trainer's)."""
    import torch
    from trl.models.utils import unwrap_model_for_generation

    from atr_llm.fast_generation import generation_context

    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
        generation_context(mode, trainer.model, attention or getattr(trainer, "fast_generation_attention", "sdpa")),
    ):
        return model.generate(input_ids=ids, attention_mask=mask, generation_config=config, **kwargs)


def compiled_check(trainer, prompts_ids: list[list[int]], new_tokens: int = 8) -> dict:
    """Does the compiled decode step compute the policy's current logits? Greedy generation of ``prompts_ids``
    through ``fast_generation='compiled'`` (static cache, compiled decode step, CUDA graphs on a GPU) against TRL's
    eager generation, in TRL's own generation context; compared: the logits of the first *decoded* token (the
    prefill is eager in both). Then 0.01 is added to every lora_B in place (as an optimizer step changes it, only
    larger) and the comparison repeated: a compiled step that kept the weights it was captured with matches the old
    eager logits, not the new ones. Reported: max |compiled - eager| before and after, and the max change of the
    eager logits the edit made (the size a stale step's error would have)."""
    import copy

    import torch

    ids, mask = _prompt_tensors(trainer, prompts_ids)
    compiled = copy.deepcopy(trainer.generation_config)
    compiled.do_sample, compiled.max_new_tokens = False, new_tokens
    compiled.max_cache_len = trainer.generation_config.max_cache_len  # the cache (and graph) of training
    eager = copy.deepcopy(compiled)
    eager.cache_implementation, eager.max_cache_len, eager.disable_compile, eager.compile_config = (
        None,
        None,
        True,
        None,
    )

    def first_decoded_logits(config, mode):  # eager: transformers' own SDPA, whatever the trainer's attention
        attention = None if mode == "compiled" else "sdpa"
        out = _generate_like_trl(
            trainer, ids, mask, config, mode, attention, output_scores=True, return_dict_in_generate=True
        )
        return out.scores[1].float()

    before = (first_decoded_logits(compiled, "compiled") - first_decoded_logits(eager, "merged_lora")).abs().max()
    eager_before = first_decoded_logits(eager, "merged_lora")
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.add_(1e-2)
    eager_after = first_decoded_logits(eager, "merged_lora")
    after = (first_decoded_logits(compiled, "compiled") - eager_after).abs().max()
    return {
        "prompts": len(prompts_ids),
        "max_abs_logit_diff_compiled_vs_eager": float(before),
        "max_abs_logit_diff_after_weight_edit": float(after),
        "max_abs_logit_change_of_the_edit": float((eager_after - eager_before).abs().max()),
    }


def decode_profile(trainer, prompts_ids: list[list[int]], steps: int, top: int = 12) -> dict:
    """Where a decode step's time goes, with the trainer's own generation (its sampling, its ``fast_generation``
    mode and, for ``compiled``, its cache and graph). After a warm-up generation, 8 and 8 + ``steps`` new tokens are
    each timed three times; the difference of the fastest of each over ``steps`` is the wall time of one decode step
    (prefill and fixed costs cancel). Then one generation of 8 + ``steps`` tokens under ``torch.profiler``: the device
    time of its kernels per step (on a CPU: the CPU time of its ops), the share of the wall time that is, the ``top``
    kernels by time per step and the ``top`` CPU ops by their own CPU time per step (Python-side cost shows there).
    EOS is no stop here (``min_new_tokens``), so every call decodes its full length."""
    import copy

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    ids, mask = _prompt_tensors(trainer, prompts_ids)
    cuda = ids.device.type == "cuda"
    mode = getattr(trainer, "fast_generation_mode", "off")

    def config(n):
        c = copy.deepcopy(trainer.generation_config)
        c.max_new_tokens = c.min_new_tokens = n
        return c

    def fastest(n, repeats=3):
        times = []
        for _ in range(repeats):
            _sync()
            t = time.perf_counter()
            _generate_like_trl(trainer, ids, mask, config(n), mode)
            _sync()
            times.append(time.perf_counter() - t)
        return min(times)

    fastest(8, repeats=1)  # warm-up (compiled: the graph of this cache exists already, so nothing compiles here)
    wall_ms = (fastest(8 + steps) - fastest(8)) / steps * 1e3
    n = 8 + steps  # forward passes in the profiled call (its prefill is one of them)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        _generate_like_trl(trainer, ids, mask, config(n), mode)
        _sync()
    averages = prof.key_averages()
    kernels = [e for e in averages if e.device_type == DeviceType.CUDA] if cuda else []
    kernel_us = sum(float(e.self_device_time_total) for e in kernels)
    cpu_ops = [e for e in averages if e.device_type == DeviceType.CPU]
    cpu_us = sum(float(e.self_cpu_time_total) for e in cpu_ops)
    busy_ms = (kernel_us if cuda else cpu_us) / n / 1e3

    def ranked(events, key):
        return [
            {"name": e.key[:120], "ms_per_step": getattr(e, key) / n / 1e3, "calls_per_step": e.count / n}
            for e in sorted(events, key=lambda e: getattr(e, key), reverse=True)[:top]
        ]

    return {
        "mode": mode,
        "batch": len(prompts_ids),
        "decode_steps_timed": steps,
        "wall_ms_per_decode_step": wall_ms,
        "busy_ms_per_step": busy_ms,  # kernels on a GPU, CPU ops on a CPU
        "busy_share": busy_ms / wall_ms if wall_ms > 0 else None,
        "cpu_op_ms_per_step": cpu_us / n / 1e3,
        "top_kernels": ranked(kernels, "self_device_time_total"),
        "top_cpu_ops": ranked(cpu_ops, "self_cpu_time_total"),
    }


def one_case(kind: str, backend: str, args, grad_path: Path) -> dict:
    """Train ``args.steps`` optimizer steps of one trainer kind ('stock' or an atr_theory method) and measure."""
    import warnings

    if backend == "unsloth":
        import unsloth  # noqa: F401  (first: it patches trl and transformers when imported)
    import torch
    import trl
    from peft import LoraConfig

    from atr_llm import data
    from atr_llm.trainer import ATRGRPOConfig, ATRGRPOTrainer

    cuda = torch.cuda.is_available() and not args.tiny
    tok, model = build_model(args.tiny, args.seed)
    lora = table4_lora()
    peft_config = LoraConfig(
        r=lora["r"], lora_alpha=lora["alpha"], target_modules=lora["targets"], task_type="CAUSAL_LM"
    )
    if backend == "unsloth":
        model, peft_config = unsloth_model(model, tok, args)
    common = {
        **{k: v for k, v in table4_grpo_fields().items() if k != "save_steps"},  # nothing is saved (save_strategy no)
        # the recorded H100 numbers used transformers' default optimizer (fused AdamW), not the presets' adamw_torch
        "optim": "adamw_torch_fused",
        "output_dir": tempfile.mkdtemp(),
        "max_steps": args.steps,
        "max_completion_length": args.max_completion_length,
        "save_strategy": "no",
        "seed": args.seed,
        "bf16": cuda,
        "use_cpu": not cuda,
    }
    if args.tiny:
        common.update(per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2)
    prompts = data.to_grpo_dataset(data.arithmetic_dataset(256, seed=args.seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "stock":  # with unsloth imported, trl.GRPOTrainer is Unsloth's generated UnslothGRPOTrainer
            cfg = trl.GRPOConfig(**common)
            cls = trl.GRPOTrainer
        else:
            method, fields = parse_kind(kind)  # "atr+merged_lora": ATR with atr_llm.fast_generation's mode
            cfg = ATRGRPOConfig(method=method, **fields, **common)
            if backend == "unsloth":
                from atr_llm.unsloth_trainer import unsloth_trainer_class

                cls = unsloth_trainer_class()
            else:
                cls = ATRGRPOTrainer
        trainer = cls(
            model=model,
            reward_funcs=[synthetic_reward],
            args=cfg,
            train_dataset=prompts,
            processing_class=tok,
            peft_config=peft_config,
        )
    reinit_lora(trainer.model, args.seed)
    probe = {}
    if kind != "stock" and not args.skip_probe:
        probe_path = grad_path.with_name(grad_path.stem + "-fixed.pt")
        probe = {
            "fixed_batch_loss": fixed_batch_probe(trainer, args.seed, probe_path),
            "fixed_batch_grad": str(probe_path),
        }
        print("CASE-PROBE " + json.dumps(probe), flush=True)
    timer = StepTimer()
    instrument(trainer, timer)
    trainer.add_callback(make_callback(timer, grad_path))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer.train()
    check = {}
    batch = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation  # training's cache shape
    texts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in prompts]
    batch_ids = [tok(t)["input_ids"] for t in texts[:batch]]
    if getattr(trainer, "fast_generation_mode", "off") == "compiled":
        check = {"compiled_check": compiled_check(trainer, batch_ids)}
        print("CASE-CHECK " + json.dumps(check), flush=True)
    if args.profile_decode and kind != "stock" and not getattr(trainer, "use_transformers_continuous_batching", False):
        check["decode_profile"] = decode_profile(trainer, batch_ids, args.profile_decode)
        print("CASE-PROFILE " + json.dumps(check["decode_profile"]), flush=True)
    n_trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    model_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    logged = [{k: v for k, v in r.items() if isinstance(v, (int, float))} for r in trainer.state.log_history]
    extra = {
        "wall_s": time.perf_counter() - t0,
        "trainable_parameters": n_trainable,
        "model_bytes": model_bytes,
        "fast_generation": getattr(trainer, "fast_generation_mode", "off"),
        "fast_generation_attention": getattr(trainer, "fast_generation_attention", "sdpa"),
        "static_cache_len": getattr(trainer.generation_config, "max_cache_len", None),
        "continuous_batching": bool(getattr(trainer, "use_transformers_continuous_batching", False)),
        "logged": logged,
        **probe,
        **check,
    }
    return summarise(kind, backend, timer.steps, extra)


def summarise(kind: str, backend: str, steps: list[dict], extra: dict | None = None) -> dict:
    """Per-case totals from the per-step records. The first generation (CUDA / kernel warm-up) is reported
    apart: ``*_after_first`` averages leave out step 1."""
    row = {"kind": kind, "backend": backend, "steps": len(steps), "per_step": steps, **(extra or {})}
    if not steps:
        return row
    later = steps[1:] or steps

    def mean(key, rs):
        return sum(r[key] for r in rs) / len(rs)

    gen_steps = [r for r in later if r["generation_s"] > 0]
    fb = [r["step_s"] - r["generation_s"] - r["optimizer_s"] for r in later]
    row.update(
        step_s_mean_after_first=mean("step_s", later),
        generation_s_per_call_after_first=mean("generation_s", gen_steps) if gen_steps else None,
        generated_tokens_per_s_after_first=(
            sum(r["generated_tokens"] for r in gen_steps) / sum(r["generation_s"] for r in gen_steps)
            if gen_steps and all(r["generated_tokens"] is not None for r in gen_steps)
            else None
        ),
        forward_backward_s_per_step=sum(fb) / len(fb),
        optimizer_s_per_step=mean("optimizer_s", later),
        trained_tokens_per_s=(
            sum(r["trained_tokens"] for r in later) / max(sum(fb), 1e-9)
            if all(r["trained_tokens"] is not None for r in later)
            else None
        ),
        peak_gpu_memory_GiB=max((r["peak_gpu_memory_GiB"] or 0) for r in steps) or None,
        first_microbatch_loss=steps[0]["first_microbatch_loss"],
        first_completions_sha=steps[0]["first_completions_sha"],
    )
    return row


def parse_steps(stdout: str) -> list[dict]:
    """The ``CASE-STEP`` records a case printed."""
    return [json.loads(ln[len("CASE-STEP ") :]) for ln in stdout.splitlines() if ln.startswith("CASE-STEP ")]


def grad_difference(ref: dict, other: dict) -> dict:
    """Relative difference and cosine of two saved {parameter name: gradient} dicts over their common names."""
    import torch

    common = sorted(set(ref) & set(other))
    a = torch.cat([ref[n].flatten() for n in common]).double()
    b = torch.cat([other[n].flatten() for n in common]).double()
    return {
        "grad_tensors_compared": len(common),
        "grad_tensors_only_in_one": len(set(ref) ^ set(other)),
        "grad_rel_diff": float((a - b).norm() / a.norm().clamp_min(1e-30)),
        "grad_cosine": float((a @ b) / (a.norm() * b.norm()).clamp_min(1e-30)),
        "grad_norm": float(a.norm()),
    }


def compare_fixed_batch(rows: list[dict]) -> dict:
    """The fixed-batch loss and LoRA gradient of every ATR case against the first one (e.g. unsloth vs trl)."""
    import torch

    done = [r for r in rows if r.get("fixed_batch_grad") and Path(r["fixed_batch_grad"]).exists()]
    ref = torch.load(done[0]["fixed_batch_grad"]) if done else None
    labels = case_labels(done)
    return {
        f"{label} vs {labels[0]}": {
            "loss": [done[0]["fixed_batch_loss"], row["fixed_batch_loss"]],
            **grad_difference(ref, torch.load(row["fixed_batch_grad"])),
        }
        for row, label in zip(done[1:], labels[1:])
    }


def case_labels(rows: list[dict]) -> list[str]:
    """``kind/backend`` of each case, with ``#i`` (its position) where a kind/backend pair is run more than once."""
    plain = [f"{r['kind']}/{r['backend']}" for r in rows]
    return [f"{lab}#{i}" if plain.count(lab) > 1 else lab for i, lab in enumerate(plain)]


def compare_first_steps(rows: list[dict], grad_paths: list[Path]) -> dict:
    """First micro-batch loss and first-step LoRA gradient of every case against the first case.

    At the first micro-batch w = 1, so every rule gives the same loss and gradient *on the same completions*.
    Where a case sampled other completions (on a GPU, two processes with one seed were seen to: stock against
    stock on an H200, 2026-11-26), its loss and gradient are of another batch: the gradient is then not compared
    and the entry says so; the fixed-batch probe (``fixed_batch_agreement``) is the comparison that holds there."""
    import torch

    ref = torch.load(grad_paths[0]) if grad_paths[0].exists() else None
    labels = case_labels(rows)
    out = {}
    for row, path, label in zip(rows[1:], grad_paths[1:], labels[1:]):
        same = row["first_completions_sha"] == rows[0]["first_completions_sha"]
        entry = {
            "same_completions": same,
            "loss_abs_diff": abs(row["first_microbatch_loss"] - rows[0]["first_microbatch_loss"]),
        }
        if not same:
            entry["note"] = "different completions: loss and gradient are of different batches (gradient not compared)"
        elif ref is not None and path.exists():
            entry.update(grad_difference(ref, torch.load(path)))
        out[f"{label} vs {labels[0]}"] = entry
    return out


def copy_bandwidth_gbps(device: str) -> float:
    """The device's memory bandwidth as a large copy moves it (read + write), GB/s: the median of 5 copies of 1 GiB
    (64 MiB on CPU). The bandwidth floor of a decode step is the model's bytes over it."""
    import statistics

    import torch

    n = (1 << 30) if device == "cuda" else (1 << 26)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        _sync()
        t = time.perf_counter()
        dst.copy_(src)
        _sync()
        times.append(time.perf_counter() - t)
    return 2 * n / statistics.median(times[1:]) / 1e9


def add_decode_floor(row: dict, max_completion_length: int, bandwidth_gbps: float) -> None:
    """A decode step must read every weight once: ``decode_floor_ms`` = the model's bytes over the copy bandwidth.
    ``decode_ms_per_step`` = generation time per call over its decode steps (every completion of a random model
    runs to ``max_completion_length``; the call's scoring and old log-probs are in it too, so this is an upper
    bound), and its ratio to the floor."""
    gen = row.get("generation_s_per_call_after_first")
    if row.get("model_bytes") is None:
        return
    floor_ms = row["model_bytes"] / (bandwidth_gbps * 1e9) * 1e3
    row["decode_floor_ms"] = floor_ms
    if gen:
        row["decode_ms_per_step"] = gen / max_completion_length * 1e3
        row["decode_ms_over_floor"] = row["decode_ms_per_step"] / floor_ms


def environment() -> dict:
    import importlib.metadata as md

    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__}
    for name in ("transformers", "trl", "peft", "accelerate", "datasets", "unsloth", "unsloth_zoo"):
        try:
            env[name] = md.version(name)
        except md.PackageNotFoundError:
            env[name] = None
    env["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return env


def refuse_unsloth(args) -> None:
    """Refuse ``unsloth`` in ``--backends`` where Unsloth cannot run (``atr_llm.unsloth_backend.require_unsloth``'s
    conditions, found without importing it: importing unsloth patches trl and transformers): with ``--tiny`` (its
    model and trainer stay on the CPU), without a CUDA GPU, or without the package."""
    import importlib.util

    import torch

    from atr_llm.command_line import refuse

    backends = ",".join(args.backends)
    if args.tiny:
        raise refuse("--backends", backends, "Unsloth needs a CUDA GPU and --tiny runs on the CPU; use --backends trl")
    if not torch.cuda.is_available():
        raise refuse("--backends", backends, "Unsloth needs a CUDA GPU (none found here); use --backends trl")
    if importlib.util.find_spec("unsloth") is None:
        raise refuse("--backends", backends, "Unsloth is not installed: pip install 'atr-grpo[gpu]'; or --backends trl")


def check_arguments(args) -> None:
    """Every refusal before a model loads: counts, the kinds and backends, the timeout, the output path, the GPU."""
    import atr_theory as at
    from atr_llm.command_line import UsageError, refuse
    from atr_llm.fast_generation import MODES

    for kind in args.kinds.split(","):
        try:
            name, _ = split_steps(kind, args.steps)
        except ValueError as e:
            raise refuse("--kinds", args.kinds, str(e)) from None
        if name == "stock":
            continue
        try:
            method, _ = parse_kind(name)
        except ValueError:
            method = None
        if method not in at.METHODS:
            raise refuse(
                "--kinds",
                args.kinds,
                f"{kind!r} is not 'stock', a method or method+MODE[+cb][+packed][+pN] (MODE in "
                f"{', '.join(MODES)}; cb: continuous batching; packed: packed_gqa attention; pN: N prompt tokens "
                "in compiled's static cache)",
            )
    if "unsloth" in args.backends:
        refuse_unsloth(args)
    if not args.tiny:
        import torch

        if not torch.cuda.is_available():
            raise UsageError(
                "no CUDA GPU here, which gpu_step needs; --tiny runs the same code on CPU with a tiny model"
            )


def main(argv=None) -> dict:
    from atr_llm.cli_types import SEED, CommaList, Integer, Real, Text, WriteFile
    from atr_llm.command_line import Parser

    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=Integer(1), default=20, help="optimizer steps per case (default 20)")
    ap.add_argument("--max-completion-length", type=Integer(1), default=1536, help="Table 4: 1536")
    ap.add_argument(
        "--kinds",
        type=Text(),
        default="stock,atr,atr+merged_lora",
        help="comma list: 'stock' (trl.GRPOTrainer), methods, and method+MODE for a fast_generation mode "
        "(atr+merged_lora: LoRA merged while generating; atr+compiled: merged, static KV cache, compiled decode "
        "step), each with an optional +cb (TRL's use_transformers_continuous_batching), +packed "
        "(fast_generation_attention='packed_gqa'), +pN (fast_generation_prompt_tokens=N) and :N (its own --steps)",
    )
    ap.add_argument(
        "--backends",
        type=CommaList(choices=("trl", "unsloth")),
        default="trl",
        help="comma list of 'trl' and 'unsloth'",
    )
    ap.add_argument("--seed", type=SEED, default=0)
    ap.add_argument("--tiny", action="store_true", help="a tiny model on CPU (smoke test of this script)")
    ap.add_argument(
        "--out",
        type=WriteFile(),
        help="default: figures/bench/<card>/gpu_step.json (<card>: h100, h200, ...; cpu with --tiny)",
    )
    ap.add_argument(
        "--skip-probe",
        action="store_true",
        help="no fixed-batch probe before training (to check whether it changes what the case samples)",
    )
    ap.add_argument(
        "--case-timeout", type=Real(0, open_low=True), default=None, help="seconds before a case is stopped"
    )
    ap.add_argument(
        "--profile-decode",
        type=Integer(0),
        default=0,
        metavar="N",
        help="after training, time N decode steps of each method case's generation and profile them "
        "(where a decode step's time goes: decode_profile in the case's row; 0: not done)",
    )
    ap.add_argument(
        "--case", type=Text(1000), help=argparse.SUPPRESS
    )  # internal: kind,backend,grad_path in this process
    args = ap.parse_args(argv)
    if not args.case:
        check_arguments(args)
    if args.out is None and not args.case:
        from benchmarks._machine import default_output

        args.out = str(default_output("gpu_step.json", "cpu" if args.tiny else "cuda"))

    if args.case:
        kind, backend, grad_path = args.case.split(",")
        kind, args.steps = split_steps(kind, args.steps)
        try:
            row = one_case(kind, backend, args, Path(grad_path))
        except Exception as e:  # reported in the JSON, the other cases still run
            row = {
                "kind": kind,
                "backend": backend,
                "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc(),
            }
        print("CASE-RESULT " + json.dumps(row))
        return row

    tmp = Path(tempfile.mkdtemp())
    rows, grads = [], []
    # measured first, so a run stopped between cases still has its decode floor
    bandwidth = copy_bandwidth_gbps("cpu" if args.tiny else "cuda")
    for backend in args.backends:
        for kind in args.kinds.split(","):
            grad_path = tmp / f"grad-{len(rows)}-{kind}-{backend}.pt"  # one file per case, kinds may repeat
            cmd = [sys.executable, "-m", "benchmarks.gpu_step", "--case", f"{kind},{backend},{grad_path}"] + [
                a for a in (argv if argv is not None else sys.argv[1:])
            ]
            print(f"== {kind} / {backend}", flush=True)
            try:
                res = subprocess.run(
                    cmd,
                    capture_output=True,
                    text=True,
                    timeout=args.case_timeout,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            except subprocess.TimeoutExpired as e:
                so = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                res = subprocess.CompletedProcess(cmd, -9, so, f"stopped after {e.timeout} s (--case-timeout)")
            lines = [ln for ln in res.stdout.splitlines() if ln.startswith("CASE-RESULT ")]
            if not lines:
                row = summarise(split_steps(kind, args.steps)[0], backend, parse_steps(res.stdout))
                for ln in res.stdout.splitlines():  # the fixed-batch probe ran before training
                    if ln.startswith("CASE-PROBE "):
                        row.update(json.loads(ln[len("CASE-PROBE ") :]))
                row.update(error=f"exit {res.returncode}", trace=res.stderr[-4000:])
            else:
                row = json.loads(lines[-1][len("CASE-RESULT ") :])
            rows.append(row)
            grads.append(grad_path)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            add_decode_floor(row, args.max_completion_length, bandwidth)
            partial = {"partial": True, "environment": environment(), "copy_bandwidth_GBps": bandwidth, "cases": rows}
            Path(args.out).write_text(json.dumps(partial, indent=1))
            if "error" in row:
                print(
                    f"   failed: {row['error']} after {row.get('steps', 0)} steps\n{row.get('trace', '')[-2000:]}",
                    flush=True,
                )
            if row.get("steps"):
                gen = row["generation_s_per_call_after_first"]
                print(
                    f"   {row['steps']} steps: step {row['step_s_mean_after_first']:.2f} s (generation "
                    f"{gen if gen is None else round(gen, 2)} s per call, fwd+bwd {row['forward_backward_s_per_step']:.2f} s, "
                    f"optimizer {row['optimizer_s_per_step']:.3f} s); {row['trained_tokens_per_s']} trained tok/s; "
                    f"peak {row['peak_gpu_memory_GiB']} GiB; first loss {row['first_microbatch_loss']}",
                    flush=True,
                )
    ok = [(r, g) for r, g in zip(rows, grads) if r.get("steps")]
    result = {
        "command": "python -m benchmarks.gpu_step " + " ".join(argv if argv is not None else sys.argv[1:]),
        "environment": environment(),
        "model": "tiny (CPU smoke test)" if args.tiny else {"architecture": "Qwen3-1.7B, random init", **QWEN3_1_7B},
        "geometry": {**table4_grpo_fields(), "max_completion_length": args.max_completion_length},
        "lora": table4_lora(),
        "copy_bandwidth_GBps": bandwidth,
        "cases": rows,
        "first_step_agreement": compare_first_steps([r for r, _ in ok], [g for _, g in ok]) if len(ok) > 1 else {},
        "fixed_batch_agreement": compare_fixed_batch(rows),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("first_step_agreement", "fixed_batch_agreement")}, indent=1))
    print("wrote", args.out)
    return result


if __name__ == "__main__":
    from atr_llm.command_line import run_command

    run_command(main)
