"""The CPU table's protocol: its runs, benchmarks and settings, where a run lives, and what a finished run must
agree on to join a table (the data layout every other module of ``experiments.cpu_table`` reads)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import atr_llm
from atr_llm.checkpoints import FORMER_MASK_DEFAULTS
from atr_llm.presets import RUNS

BASE_CONFIG = Path(atr_llm.__file__).parent / "configs" / "cpu-table.yaml"


def base_config_value(key: str):
    """``key`` of ``BASE_CONFIG`` (cpu-table.yaml), the training settings every run starts from."""
    import yaml

    return yaml.safe_load(BASE_CONFIG.read_text())[key]


def run_directory(runs_dir: Path | str, run: str, seed: int) -> Path:
    """Where (``run``, ``seed``) trains and writes its checkpoints and ``result.json``."""
    return Path(runs_dir) / f"{run}-s{seed}"


TASK = "arithmetic-3step-steps"


GROUP_SIZE: int = base_config_value("num_generations")
"""Completions per prompt (cpu-table.yaml's ``num_generations``: 8)."""


EVAL_SAMPLING = dict(temperature=0.3, top_p=0.95)  # the paper's evaluation sampling (Sec. 5)


BENCHMARKS: dict[str, dict] = {
    "steps-test-T0.3": EVAL_SAMPLING,
    "steps-test-T1": dict(temperature=1.0, top_p=1.0),  # the training sampling: what GRPO's reward measures
}
"""Benchmark name -> sampling; every benchmark is the same held-out problems of ``TASK``."""


TABLE2 = ["clip", "clip-higher", "dual-clip", "dcpo", "clip-cov", "sapo", "atr"]


TABLE3 = ["kl1", "kl2", "is-kl3", "clip-eps0.329", "clip-eps0.422", "clip-higher-0.329-0.422"]


PAPER_CLIP_HIGHER = ["clip-higher-0.329-0.5", "clip-higher-0.329-0.6"]
"""The paper's own Table 3 clip-higher rows (eps_low 0.329, eps_high 0.5 / 0.6; ``atr_llm.presets.RUNS``); the
default table has clip-higher at ATR's range (0.329, 0.422) instead (the matched control), so these run on request."""


DELTA_ABLATION = ["atr-delta0.03", "atr-delta0.05", "atr-delta0.1", "atr-delta0.15"]


FORM_CONTROL = ["clip-mask", "atr-min"]
"""Each rule in the form the default table does not train it in (``atr`` trains the mask form there:
``MASK_FORM_RUNS``): clip as a mask (both signs frozen outside
[0.8, 1.2]) and atr in PPO's min form (its exact range [0.671, 1.422], frozen only where the advantage's sign
makes the clipped objective the smaller one)."""


TRUST_REGION_RULES = ["atr-seq", "dppo-kl", "cispo", "reinforce-tis"]
"""The rules the trust-region study (docs/experiments/trust-region.md) adds to clip, clip-higher, atr and atr-min:
ATR at the sequence level, DPPO's binary-KL mask, CISPO (verl's defaults: the IS weight clamped to [0.8, 1.2]) and
REINFORCE with truncated IS and no trust region (``cispo`` with no lower bound and the cap 2, i.e.
sg[min(w, 2)] A grad log pi: verl's bypass-mode REINFORCE with token TIS at its default cap;
``tests/studies/test_cpu_table.py`` checks the identity)."""


CONTROLS: dict[str, dict] = {"shuffled": {"reward_control": "shuffled"}}
"""Runs that are controls, not rules: run name -> the ``python -m atr_llm.train`` fields (beyond the method's) that
make it one. ``shuffled`` trains clip's rule (the default table's reference) on rewards permuted within each group
(``atr_llm.rewards.GroupShuffledReward``): the same reward distribution with no signal. A rule comparison counts
only where clip beats both its own SFT model and this arm (``statistics.comparison_validity``)."""


_NOT_PRESETS: dict[str, dict] = {
    # ATR's ratio range at delta = 0.07 is [0.671, 1.422]: clip-higher with exactly that range is the matched control
    "clip-higher-0.329-0.422": {"method": "clip_higher", "epsilon_low": 0.329, "epsilon_high": 0.422},
    "atr-delta0.03": {"method": "atr", "delta": 0.03},
    "atr-delta0.15": {"method": "atr", "delta": 0.15},
    "clip-mask": {"method": "clip", "form": "mask"},
    "atr-min": {"method": "atr", "form": "min"},
    "atr-seq": {"method": "atr_seq"},
    "dppo-kl": {"method": "dppo_kl"},
    "cispo": {"method": "cispo"},
    "reinforce-tis": {"method": "cispo", "epsilon_low": 1.0, "epsilon_high": 1.0},
    "shuffled": dict(RUNS["clip"]),  # a control: clip's rule on shuffled rewards (``CONTROLS``)
}


def _spec(run: str) -> dict:
    return RUNS[run] if run in RUNS else _NOT_PRESETS[run]


_ALL_RUNS = TABLE2 + TABLE3 + PAPER_CLIP_HIGHER + DELTA_ABLATION + FORM_CONTROL + TRUST_REGION_RULES + list(CONTROLS)


MASK_FORM_RUNS = tuple(
    run for run in _ALL_RUNS if _spec(run)["method"] in FORMER_MASK_DEFAULTS and "form" not in _spec(run)
)
"""Runs that trained the mask form (the Section 4 pure-clip objective; ``atr_theory.READINGS``): those of a rule in
``atr_llm.checkpoints.FORMER_MASK_DEFAULTS`` that name no form (``atr``, ``kl1``, ``kl2``, ``is-kl3``, the delta ablation):
their rules' default when the committed tables were trained (until 2026-11-27; now PPO's min, the Section 2
surrogate), kept here so that every committed row keeps its meaning and a rerun reproduces it. ``run_form`` labels
each row."""


CPU_RUNS: dict[str, dict] = {
    run: {**_spec(run), **({"form": "mask"} if run in MASK_FORM_RUNS else {})} for run in _ALL_RUNS
}
"""Run name -> method, form where it is not the rule's default, and parameters (the paper's presets where it has
one: ``atr_llm.presets.RUNS``), in the table's order: Table 2, Table 3, the paper's other clip-higher rows, the
ablation, the form controls."""


def run_form(run: str) -> str | None:
    """The form ``run`` trains (``"min"`` or ``"mask"``), or None for a rule with one form only (soft, none, or the
    SFT model)."""
    import atr_theory as at

    if run not in CPU_RUNS:
        return None
    spec = at.get_method(CPU_RUNS[run]["method"])
    return CPU_RUNS[run].get("form", spec.default_form) if len(spec.forms) > 1 else None


ABLATION_DELTAS: dict[str, float] = {run: CPU_RUNS[run]["delta"] for run in ["atr", *DELTA_ABLATION]}
"""Run name -> ATR's delta for the delta ablation: ``atr`` (the paper's 0.07) and ``DELTA_ABLATION``."""


FULL = dict(
    runs=TABLE2 + TABLE3 + DELTA_ABLATION,
    seeds=[0, 1, 2],
    sft_steps=600,
    max_steps=1000,
    save_steps=250,
    test_problems=200,
    samples=8,
)


QUICK = dict(runs=["clip", "atr"], seeds=[0], sft_steps=20, max_steps=4, save_steps=2, test_problems=16, samples=8)


def run_args(run: str) -> list[str]:
    """``python -m atr_llm.train`` arguments that select ``run``'s method and parameters (and, for a control,
    what makes it one: ``CONTROLS``)."""
    from atr_llm.config import config_field

    spec = CPU_RUNS[run]
    args = ["--method", spec["method"]]
    for k, v in spec.items():
        if k != "method":
            args += [f"--{config_field(k)}", str(v)]
    for k, v in CONTROLS.get(run, {}).items():
        args += [f"--{k}", str(v)]
    return args


MACHINE_FILE = "machine.json"
"""Written beside an SFT model by ``train_sft``: the ``machine_kind`` that trained it."""


def machine_kind() -> str:
    """The kind of machine this process computes on, as far as it decides an SFT model's bits beyond seed and
    protocol: the CPU's model name and the vector instruction set torch dispatches to, the CUDA device when one is
    available (TRL's trainers use it), and torch's version -- e.g. ``"AMD EPYC | cpu AVX2 | torch 2.13.0+cpu"``.
    Two machines that agree here are taken to train the same SFT model from the same seed (kernels of one ISA and
    torch build round alike); the cpu-table's starts are these kinds (``start_labels``)."""
    import platform

    import torch

    name = ""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    name = name or platform.processor() or platform.machine()
    parts = [name, f"cpu {torch.backends.cpu.get_cpu_capability()}"]
    if torch.cuda.is_available():
        parts.append(f"cuda {torch.cuda.get_device_name(0)}")
    return " | ".join([*parts, f"torch {torch.__version__}"])


def sft_machine(model_dir: Path | str) -> str | None:
    """The machine kind recorded beside an SFT model (``MACHINE_FILE``), or None for a model trained before
    it was recorded."""
    path = Path(model_dir) / MACHINE_FILE
    return json.loads(path.read_text())["machine"] if path.exists() else None


def weights_id(model_dir: Path | str) -> str:
    """Identity of a saved model's weights: the first 16 hex digits of SHA-256 over every tensor of its
    ``*.safetensors`` files in name order (name, dtype, shape, then the raw bytes). File metadata and
    shard layout do not enter, so two saves of equal weights agree and a change of one bit in one weight does not."""
    import torch
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {model_dir}: not a saved model directory")
    tensors = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # the raw bits, any dtype (bfloat16 too)
    return digest.hexdigest()[:16]


def evaluation_problems(test_problems: int, task: str = TASK):
    """The first ``test_problems`` problems of ``task``'s test split, seed 12345: the problems every evaluation of
    the table grades (their row index is the ``problem_id`` of the samples it writes)."""
    from atr_llm.data import OFFLINE_TASKS, arithmetic_dataset

    return arithmetic_dataset(test_problems, seed=12345, **{**OFFLINE_TASKS[task], "split": "test"})


def grpo_learning_rate(requested: float | None) -> float | None:
    """The ``learning_rate`` setting of a table: ``None`` for cpu-table.yaml's own rate (so tables written before
    the option existed keep their rows), else the requested rate (> 0, finite), which makes a protocol of its own."""
    if requested is None:
        return None
    if not (math.isfinite(requested) and requested > 0):
        raise ValueError(f"--learning-rate must be a finite number > 0, got {requested}")
    if requested == float(base_config_value("learning_rate")):
        return None
    return requested


def train_argv(job: dict, output_dir: Path | str, max_steps: int, save_steps: int) -> list[str]:
    """``python -m atr_llm.train`` arguments of ``job``'s run (``run``, ``seed``, ``sft_dir``, optionally
    ``learning_rate`` and ``device``) from its seed's SFT model into ``output_dir``: cpu-table.yaml, then the run's
    method and parameters (``run_args``)."""
    argv = ["--config", str(BASE_CONFIG), "--model_name_or_path", str(job["sft_dir"]), "--seed", str(job["seed"])]
    argv += ["--output_dir", str(output_dir), "--max_steps", str(max_steps), "--save_steps", str(save_steps)]
    argv += run_args(job["run"])
    if job.get("learning_rate") is not None:  # a protocol other than cpu-table.yaml's rate (``--learning-rate``)
        argv += ["--learning_rate", repr(float(job["learning_rate"]))]
    for knob in OFF_POLICY_KNOBS:  # how far off-policy (``--num-iterations``, ``--steps-per-generation``)
        if job.get(knob) is not None:
            argv += [f"--{knob}", str(int(job[knob]))]
    for knob in REGIME_KNOBS:  # the learning regime's levers (``--prompts-per-step``, ``--warmup-steps``)
        if job.get(knob) is not None:
            argv += REGIME_KNOBS[knob](int(job[knob]))
    checkpoints = max_steps // save_steps
    if checkpoints > base_config_value("save_total_limit"):  # keep every evaluated checkpoint of a long run
        argv += ["--save_total_limit", str(checkpoints + 1)]
    if job.get("device", "cpu") != "cpu":
        argv += ["--use_cpu", "false"]
    if job.get("measure_true_kl"):  # a measurement only: the same weights with it on or off (tests)
        argv += ["--measure_true_kl", "true"]
    return argv


def result_at_step(result: dict, step: int) -> dict:
    """``result`` as a run of ``step`` training steps would have written it: its evaluations at checkpoints <= ``step``
    and its training curves up to ``step`` (the SFT model's own result, step 0, unchanged). With the constant learning
    rate of cpu-table.yaml a run's checkpoint at ``step`` holds the weights of a ``step``-step run of the same seed
    (``tests/studies/test_cpu_table.py`` trains both and compares), so this is that shorter run's result without training it.
    One exception, in the curves only: a run also logs its last step when that is off the logging interval (10 steps
    in cpu-table.yaml), a point the longer run never logged; at multiples of 10 the curves agree too."""
    if result["run"] == "sft":
        return result
    steps = sorted(int(s) for s in result["evals"])
    if step not in steps:
        raise ValueError(
            f"{result['run']} seed {result['seed']} has no evaluated checkpoint at step {step} (it has {steps}): "
            "--at-step must be a step at which the runs saved a checkpoint (a multiple of save_steps, <= max_steps)"
        )
    shorter = {
        **result,
        "evals": {s: v for s, v in result["evals"].items() if int(s) <= step},
        "curves": [c for c in result["curves"] if c["step"] <= step],
    }
    shorter.pop("acted", None)  # a summary of the whole run, not of its first ``step`` steps
    return shorter


def _result_of(run: str, job: dict) -> dict:
    """The head of a finished result: which run, which seed, and the SFT model (and its machine) it started from."""
    return {"run": run, "seed": job["seed"], "sft_model": job["sft_model"], "sft_machine": job.get("sft_machine")}


def _started_from(result: dict, job: dict, path: Path) -> dict:
    """A finished result read back, checked to have started from the job's SFT model (results written before
    the SFT model was recorded take the job's, and its machine kind with it) and, for a GRPO run, to have been
    trained and saved as the job asks (``refuse_other_protocol``)."""
    recorded = result.setdefault("sft_model", job["sft_model"])
    result.setdefault("sft_machine", job.get("sft_machine"))
    if recorded != job["sft_model"]:
        raise ValueError(
            f"{path} started from SFT model {recorded}, but {job['sft_dir']} now holds {job['sft_model']}: "
            "the SFT model was trained again; move the run away (or use another --runs-dir) to train it anew"
        )
    if result["run"] != "sft":
        refuse_other_protocol(result, job, path)
    return result


def refuse_other_protocol(result: dict, job: dict, path: Path) -> None:
    """Raise if the finished GRPO run ``result`` (read from ``path``) was trained with another learning rate or step
    count, or saved its evaluated checkpoints at another interval, than ``job`` asks for. A result written before
    these were recorded was trained at cpu-table.yaml's rate (the only one then) for as many steps as its last
    evaluation's, with a checkpoint at its first evaluation's step; those values are filled into ``result``."""
    evaluated = sorted(int(step) for step in result["evals"])
    result.setdefault("learning_rate", None)
    for knob in (*OFF_POLICY_KNOBS, *REGIME_KNOBS):  # results written before a knob existed ran at the yaml's value
        result.setdefault(knob, None)
    result.setdefault("max_steps", evaluated[-1])
    result.setdefault("save_steps", evaluated[0])
    for key in _RUN_PROTOCOL_KEYS:
        if result[key] != job.get(key):
            raise ValueError(
                f"{path} was trained with {key} = {result[key]}, this invocation asks for {job.get(key)} "
                "(None: cpu-table.yaml's): use another --runs-dir for another protocol"
            )


OFF_POLICY_KNOBS = ("num_iterations", "steps_per_generation")
"""TRL fields that set how far off-policy a run trains (None: cpu-table.yaml's); each value is a protocol of its own."""


def off_policy_knob(name: str, requested: int | None) -> int | None:
    """The setting of an ``OFF_POLICY_KNOBS`` field: ``None`` for cpu-table.yaml's own value (so tables written
    before the option existed keep their rows), else the requested integer (>= 1)."""
    if requested is None:
        return None
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1, got {requested!r}")
    import yaml

    base = yaml.safe_load(BASE_CONFIG.read_text())
    own = base.get(name)
    if name == "steps_per_generation" and own is None:  # TRL's default: gradient_accumulation_steps
        own = base.get("gradient_accumulation_steps", 1)
    return None if requested == own else requested


ACTED_KEYS = (
    "clip/frac_masked",
    "clip/frac_clipped_low",
    "clip/frac_clipped_high",
    "clip/frac_ratio_moved",
    "clip/ratio_p05",
    "clip/ratio_p95",
    "entropy",
    "clip/frac_outside_against_advantage",
    "clip/frac_outside_with_advantage",
)


TRUE_KL_KEYS = (
    "true_kl/mean",
    "true_kl/p95",
    "true_kl/reverse_mean",
    "true_kl/reverse_p95",
    "true_kl/frac_above_delta",
    "true_kl/frac_above_delta_kept",
    "true_kl/frac_above_delta_dropped",
    "true_kl/k3_rank_corr",
    "true_kl/k1_mean",
    "true_kl/k3_mean",
    "true_kl/mean_against_advantage",
)
"""What a run trained with ``--measure-true-kl`` logs (``atr_llm.true_kl.true_kl_summary``), summarised by
``acted_summary`` like ``ACTED_KEYS``."""


def acted_summary(history: list[dict], true_kl_delta: float = 0.07) -> dict:
    """How much a run's rule acted: the mean over its logged rows (also those of steps that reuse a batch and log no
    reward; TRL averages each row over the optimizer steps since the previous one) of each ``ACTED_KEYS`` entry,
    and the mean entropy in the first and the last fifth of the rows. ``clip/frac_masked``: tokens whose gradient the rule removed; ``clip/frac_clipped_*``: tokens whose
    ratio or weight a bound acted on (a soft rule truncates without masking); ``clip/frac_outside_*_advantage``: tokens
    outside the rule's range against / with their advantage (``atr_theory.outside_by_advantage``; None for runs that
    did not log them)."""
    import statistics

    rows = [h for h in history if "clip/frac_masked" in h and "step" in h]
    out: dict = {"logged_steps": len(rows)}
    for key in ACTED_KEYS:
        values = [h[key] for h in rows if h.get(key) is not None]
        out[key] = statistics.fmean(values) if values else None
    measured = [h for h in rows if h.get("true_kl/mean") is not None]
    if measured:  # --measure-true-kl: each key's mean over the logged rows, and how often a row's mean exceeded delta
        for key in TRUE_KL_KEYS:
            values = [h[key] for h in measured if h.get(key) is not None]
            out[key] = statistics.fmean(values) if values else None
        out["true_kl/frac_rows_above_delta"] = statistics.fmean(
            [float(h["true_kl/mean"] > true_kl_delta) for h in measured]
        )
    entropy = [h["entropy"] for h in rows if h.get("entropy") is not None]
    fifth = max(1, len(entropy) // 5)
    out["entropy_first_fifth"] = statistics.fmean(entropy[:fifth]) if entropy else None
    out["entropy_last_fifth"] = statistics.fmean(entropy[-fifth:]) if entropy else None
    return out


REGIME_KNOBS = {
    "prompts_per_step": lambda prompts: ["--per_device_train_batch_size", str(prompts * GROUP_SIZE)],
    "warmup_steps": lambda steps: ["--warmup_steps", str(steps), "--lr_scheduler_type", "constant_with_warmup"],
}
"""The learning regime's levers beyond the learning rate, SFT length and reuse (None: cpu-table.yaml's, 32 prompts
per step and no warmup): each value a protocol of its own, and its ``python -m atr_llm.train`` arguments. With
a warmup the rate is constant after it, so a checkpoint at step S still holds an S-step run's weights."""


def regime_knob(name: str, requested: int | None) -> int | None:
    """The setting of a ``REGIME_KNOBS`` field: None for cpu-table.yaml's own (32 prompts per step, no warmup), else
    the requested integer (prompts per step >= 1, warmup steps >= 1)."""
    if requested is None:
        return None
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1, got {requested!r}")
    own = base_config_value("per_device_train_batch_size") // GROUP_SIZE if name == "prompts_per_step" else None
    return None if requested == own else requested


_RUN_PROTOCOL_KEYS = ("learning_rate", "max_steps", "save_steps", *OFF_POLICY_KNOBS, *REGIME_KNOBS)
"""What a finished GRPO run records of how it was trained and saved, beyond its method, seed and SFT model."""


CURVE_KEYS = (
    "step",
    "reward",
    "entropy",
    "completions/mean_length",
    "completions/clipped_ratio",
    "clip/frac_masked",
    "clip/ratio_max",
    "reward_std",
    "frac_reward_zero_std",
    "grad_norm",
)
"""What each logged row of a run keeps in the curves file. ``reward_std``, ``frac_reward_zero_std`` (TRL: the
fraction of groups whose rewards are all equal, which give no gradient) and ``grad_norm`` (transformers) are empty in
rows written before 2026-11-29; ``grad_norm`` is also empty in a run's last row when that step is off the logging
interval (transformers' end-of-training row does not carry it)."""


_PROTOCOL_KEYS = (
    "sft_steps",
    "max_steps",
    "save_steps",
    "test_problems",
    "samples",
    "task",
    "base_config",
    "benchmarks",
    "learning_rate",
    *OFF_POLICY_KNOBS,
    *REGIME_KNOBS,
)
"""Settings that must agree for two invocations' rows to share one table (everything but runs, seeds, device)."""


def protocol_differences(settings: dict, other: dict) -> list[str]:
    """The ``_PROTOCOL_KEYS`` in which two tables' settings differ: rows of tables that differ in none of them
    were trained and evaluated the same way, and may be compared (or pooled) across the tables."""
    return [key for key in _PROTOCOL_KEYS if settings.get(key) != other.get(key)]
