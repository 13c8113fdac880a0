"""verl 0.9.1 end to end on a CPU: ``python -m verl.trainer.main_ppo`` trains a tiny Qwen3 with this package's loss.

Runs where verl, Ray and TransferQueue are importable (``make test-verl-e2e`` builds that environment); skipped
elsewhere. What verl lacks on a CPU (a platform, a rollout server) comes from ``tests/verl_support/verl_cpu.py`` through verl's own
registries; verl itself is not edited. Each run: Ray started locally by verl, the tiny Qwen3 of ``atr_llm.tiny``
after 400 SFT steps on the arithmetic task (so that some completions are right and GRPO's advantages are not all
0), data written by ``python -m atr_llm.verl.data --train arithmetic --tests arithmetic``, the project's reward
(``reward.custom_reward_function.path=pkg://atr_llm.verl.data``), 2 GRPO steps of 2 prompts x 4 completions with
2 updates per generated batch (``ppo_epochs=2``, so the ratio moves and the trust region can act).

A run fails here if verl's trainer does not finish, if our loss is not what verl called (its ``actor/atr_*``
metrics are missing), if a parameter set outside verl (``$ATR_GRPO_PARAMS`` through Ray's ``runtime_env``) or in
verl's config (``policy_loss.atr_params``, or verl's own ``clip_ratio_*``) is not the one the workers used, if a
dumped rollout's score is not ``atr_llm.verl.data.compute_score`` of its text, or if the saved weights equal the
initial ones. Both of verl's trainers: the legacy ``RayPPOTrainer`` (``trainer.use_v1=False``) and v1.

The documented recipe (docs/trainer.md, "verl") is checked here too: its overrides compose against verl's own
config schema, pass verl's config validation, and give the TRL preset's batch (completions per optimizer step,
updates per batch, optimizer steps, learning rate, weight decay).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("verl")
pytest.importorskip("transfer_queue")
pytest.importorskip("hydra")

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "atr_grpo/arithmetic"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder with ``model/`` (the tiny Qwen3 after SFT) and ``data/`` (verl parquet files of the arithmetic task)."""
    import torch

    from atr_llm import data, sft, tiny

    root = tmp_path_factory.mktemp("verl_e2e")
    torch.manual_seed(0)
    tokenizer, model = tiny.build_tokenizer_and_model(seed=0)
    train = data.arithmetic_dataset(n=512, split="train")
    sft.plain_sft(model, tokenizer, train, max_steps=400, learning_rate=3e-3, batch_size=64)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    out = subprocess.run(
        [sys.executable, "-m", "atr_llm.verl.data", "--out", str(root / "data"), "--train", "arithmetic",
         "--tests", "arithmetic"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return root


HARNESS = ROOT / "tests" / "verl_support"
"""The CPU harness (``verl_cpu.py``) and the hook the workers import, a folder put on their ``PYTHONPATH``."""


def _cpu_support():
    """``tests/verl_support/verl_cpu.py``, imported from its file as the workers import it (its folder on their
    ``PYTHONPATH``): a dependency of verl's environment installs a top-level ``tests`` package of its own, which hides
    this repository's ``tests`` there."""
    import importlib.util

    if "verl_cpu" not in sys.modules:
        spec = importlib.util.spec_from_file_location("verl_cpu", HARNESS / "verl_cpu.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["verl_cpu"] = module
        spec.loader.exec_module(module)
    return sys.modules["verl_cpu"]


def _overrides(root: Path, run: str, method: str, v1: bool) -> list[str]:
    CPU_OVERRIDES = _cpu_support().CPU_OVERRIDES

    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={root / 'data' / 'train.parquet'}",
        f"data.val_files={root / 'data' / 'arithmetic.parquet'}",
        "data.train_batch_size=2",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        f"actor_rollout_ref.model.path={root / 'model'}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode=atr_grpo_{method}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.rollout.n=4",  # 16 scored rollouts: all-equal scores have probability ~3e-4
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "reward.custom_reward_function.path=pkg://atr_llm.verl.data",
        "reward.custom_reward_function.name=compute_score",
        *CPU_OVERRIDES,
        f"trainer.use_v1={v1}",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=2",
        f"trainer.default_local_dir={root / run / 'checkpoints'}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        f"trainer.rollout_data_dir={root / run / 'rollouts'}",
        "trainer.logger=[console,file]",
        f"trainer.experiment_name={run}",
    ]


def run_verl(root: Path, run: str, method: str, v1: bool, extra: list[str]) -> dict:
    """``python -m verl.trainer.main_ppo`` with the CPU support loaded; returns its metrics per step, its dumped
    rollouts, its checkpoint folder and its output."""
    environment = _cpu_support().environment

    (root / run).mkdir()
    metrics_file = root / run / "metrics.jsonl"
    hooks = str(HARNESS)  # atr_grpo_verl_cpu_hook: registers the CPU support on import
    path = os.pathsep.join(p for p in (hooks, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, **environment("atr_grpo_verl_cpu_hook"), "PYTHONPATH": path}
    env.update({"VERL_FILE_LOGGER_PATH": str(metrics_file), "RAY_DEDUP_LOGS": "0"})
    env.pop("ATR_GRPO_PARAMS", None)  # parameters reach the workers only as each case passes them
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *_overrides(root, run, method, v1), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=root / run, env=env, timeout=900)
    log = out.stdout + out.stderr
    assert out.returncode == 0, f"verl exited {out.returncode}:\n{log[-6000:]}"
    metrics = {}
    for line in metrics_file.read_text().splitlines():
        row = json.loads(line)
        metrics[row["step"]] = row["data"]
    rollouts = []
    for path in sorted((root / run / "rollouts").glob("*.jsonl")):
        rollouts += [json.loads(line) for line in path.read_text().splitlines()]
    return {"metrics": metrics, "rollouts": rollouts, "checkpoints": root / run / "checkpoints", "log": log}


CASES = {
    # the recipe's way: $ATR_GRPO_PARAMS handed to every Ray worker through verl's ray_init runtime_env
    "legacy-atr-env": (
        "atr",
        False,
        ["+ray_kwargs.ray_init.runtime_env.env_vars.ATR_GRPO_PARAMS='{\"delta\": 0.05}'"],
        {"actor/atr_param_delta": 0.05},
    ),
    # verl's config: the policy-loss config class with atr_params, recorded in verl's config dump
    "v1-atr-config": (
        "atr",
        True,
        [
            "actor_rollout_ref.actor.policy_loss._target_=atr_llm.verl.config.PolicyLossConfig",
            "+actor_rollout_ref.actor.policy_loss.atr_params={delta:0.05}",
        ],
        {"actor/atr_param_delta": 0.05},
    ),
    # another rule, its bounds from verl's own fields
    "v1-dppo_kl": (
        "dppo_kl",
        True,
        ["actor_rollout_ref.actor.clip_ratio_low=0.1", "actor_rollout_ref.actor.clip_ratio_high=0.15"],
        {"actor/atr_param_delta_low": 0.1, "actor/atr_param_delta_high": 0.15},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_verl_trains_with_the_plugin_loss_on_cpu(workdir, case):
    from safetensors.torch import load_file

    from atr_llm.verl.data import compute_score

    method, v1, extra, expected_params = CASES[case]
    result = run_verl(workdir, case, method, v1, extra)
    metrics = result["metrics"]
    assert sorted(metrics) == [1, 2], f"steps logged: {sorted(metrics)}"

    # our loss ran on every step (only atr_llm.verl.plugin reports actor/atr_*), with the parameters passed
    for step, m in metrics.items():
        assert m.get("actor/atr_n_tokens", 0) > 0, f"step {step}: no actor/atr_* metrics, the plugin loss did not run"
        for key, value in expected_params.items():
            assert m.get(key) == pytest.approx(value), f"step {step}: {key}={m.get(key)}, expected {value}"
    # two updates per batch: the second sees a moved ratio
    assert max(m["actor/atr_frac_ratio_moved"] for m in metrics.values()) > 0

    # the reward is the project's: every dumped score is compute_score of the completion, and it varies
    rollouts = result["rollouts"]
    assert len(rollouts) == 2 * 2 * 4, len(rollouts)  # steps x prompts x completions
    for row in rollouts:
        assert row["score"] == compute_score(SOURCE, row["output"], row["gts"]), row
    assert {row["score"] for row in rollouts} == {0.0, 1.0}

    # the weights changed and stayed finite
    saved = load_file(result["checkpoints"] / "global_step_2" / "actor" / "huggingface" / "model.safetensors")
    initial = load_file(workdir / "model" / "model.safetensors")
    assert set(saved) == set(initial)
    changed = [name for name in initial if not saved[name].float().equal(initial[name].float())]
    assert changed, "no weight changed in 2 GRPO steps"
    assert all(saved[name].float().isfinite().all() for name in saved)


# ---------------------------------------------------------------------------------------------------------------
# the documented recipe
# ---------------------------------------------------------------------------------------------------------------
def documented_recipe() -> tuple[dict[str, str], list[str]]:
    """The environment assignments and the Hydra overrides of docs/trainer.md's ``main_ppo`` command."""
    text = (ROOT / "docs" / "trainer.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "verl.trainer.main_ppo" in b)
    command = next(c for c in block.replace("\\\n", " ").splitlines() if "verl.trainer.main_ppo" in c)
    words = shlex.split(command)
    start = words.index("verl.trainer.main_ppo")
    env = dict(w.split("=", 1) for w in words[: words.index("python")] if "=" in w)
    return env, words[start + 1 :]


def _compose(overrides: list[str]):
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_documented_recipe_uses_keys_verl_reads_and_passes_its_validation():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    env, overrides = documented_recipe()
    config = _compose(overrides)  # an unknown key (one verl does not read) fails here
    assert config.actor_rollout_ref.rollout.name == "vllm"
    # verl's checks of a vllm rollout import vllm (CUDA only); every other check runs with the rollout renamed
    checked = config.copy()
    checked.actor_rollout_ref.rollout.name = "transformers"
    validate_config(checked, use_reference_policy=need_reference_policy(checked), use_critic=need_critic(checked))
    actor = omega_conf_to_dataclass(checked.actor_rollout_ref.actor)  # verl's own post-init checks
    assert actor.policy_loss.loss_mode == "atr_grpo_atr"
    omega_conf_to_dataclass(checked.actor_rollout_ref.rollout)
    # the reward: verl 0.9.1 reads reward.custom_reward_function (a top-level custom_reward_function is ignored)
    assert config.reward.custom_reward_function.path == "pkg://atr_llm.verl.data"
    assert config.reward.custom_reward_function.name == "compute_score"
    # delta in verl's config, where the loss reads it (and verl's config dump records it)
    from atr_llm.verl import plugin as verl_plugin
    from atr_llm.verl.config import PolicyLossConfig

    assert isinstance(actor.policy_loss, PolicyLossConfig)
    assert OmegaConf.to_container(config.actor_rollout_ref.actor.policy_loss.atr_params) == {"delta": 0.07}
    assert env == {}
    assert verl_plugin.method_params("atr", actor, extra=None).params == {"delta": 0.07}


def test_documented_recipe_has_the_trl_presets_batch():
    import yaml

    _, overrides = documented_recipe()
    config = _compose(overrides)
    preset = yaml.safe_load((ROOT / "atr_llm" / "configs" / "qwen3-1.7b-atr.yaml").read_text())
    actor, n = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout.n
    prompts = config.data.train_batch_size
    per_update = actor.ppo_mini_batch_size * n  # verl's mini-batch size counts prompts
    updates_per_batch = actor.ppo_epochs * (prompts // actor.ppo_mini_batch_size)
    assert per_update == preset["per_device_train_batch_size"] * preset["gradient_accumulation_steps"] == 32
    assert n == preset["num_generations"]
    assert updates_per_batch == preset["num_iterations"] == 2
    assert config.trainer.total_training_steps * updates_per_batch == preset["max_steps"]
    assert actor.optim.lr == preset["learning_rate"] and actor.optim.weight_decay == preset["weight_decay"]
    assert config.actor_rollout_ref.rollout.temperature == preset["temperature"]
    assert config.data.max_response_length == preset["max_completion_length"]
    assert config.actor_rollout_ref.model.lora_rank == preset["lora_r"]  # the FSDP engine's LoRA fields
    assert config.actor_rollout_ref.model.lora_alpha == preset["lora_alpha"]
    assert config.actor_rollout_ref.model.target_modules == "all-linear"
    assert actor.loss_agg_mode == "seq-mean-token-sum-norm" and preset["loss_type"] == "dr_grpo"
    assert config.algorithm.norm_adv_by_std_in_grpo is False and preset["scale_rewards"] == "none"


def test_importing_the_cpu_support_patches_nothing_until_register_is_called():
    """With verl installed, importing the CPU support (``tests/verl_support/verl_cpu.py``) and the plugin leaves torch's ``init_process_group`` and
    verl's platform registry alone; ``register()`` (the test's hook) installs both. Before it became test support,
    the import itself replaced ``init_process_group`` for the whole process."""
    script = (
        "import torch.distributed as dist\n"
        "before = dist.init_process_group\n"
        "import verl_cpu as cpu, atr_llm.verl.plugin\n"
        "assert dist.init_process_group is before, 'patched on import'\n"
        "cpu.register()\n"
        "assert dist.init_process_group is not before, 'register() did not install the backend fix'\n"
        "print('OK')\n"
    )
    path = os.pathsep.join(p for p in (str(HARNESS), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}  # the harness's folder, as the workers have it
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]
