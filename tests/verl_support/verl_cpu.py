"""verl 0.9.1 on a CPU: what verl lacks there, supplied through its own registries (verl's code is not edited).

Test support, not installed: the end-to-end test's (``tests/test_verl_e2e.py``) harness, usable for a smoke run of a
verl recipe from this repository, not for speed. ``register()``, called in every verl process (by a module named in ``VERL_USE_EXTERNAL_MODULES`` whose
import calls it, with ``VERL_PLATFORM=cpu``; ``environment(hook_module)`` gives both; the end-to-end test's hook is
``tests/verl_support/atr_grpo_verl_cpu_hook.py``) registers:

- a ``cpu`` platform (``verl.plugin.platform.PlatformRegistry``): device ``cpu``, collective backend ``gloo``, and
  Ray's ``GPU`` resource as its accelerator slot, so that Ray started with ``num_gpus=N`` on a machine without GPUs
  (``+ray_kwargs.ray_init.num_gpus=N``) schedules verl's workers as it would on N GPUs;
- verl's FSDP training engine for the ``cpu`` device (``verl.workers.engine.EngineRegistry``; verl registers it for
  cuda and npu only);
- a rollout backend ``transformers`` (``actor_rollout_ref.rollout.name=transformers``): a Ray actor per replica that
  samples with ``transformers``' ``generate`` (temperature, top-p, top-k, log-probabilities of the sampled tokens),
  behind verl's token-in-token-out server interface (``RolloutReplicaRegistry``), and the hybrid worker's adapter
  that copies the trained weights into it before every rollout (``verl.workers.rollout.base._ROLLOUT_REGISTRY``);
- torch's process group for a backend string that names ``cpu:gloo`` twice (verl's ``f"cpu:gloo,{device}:gloo"``
  is ``cpu:gloo,cpu:gloo`` on a CPU, which torch rejects): the duplicate is dropped.

What differs from a GPU run: no vLLM (rollouts are plain ``generate`` calls, one request at a time per replica),
no CUDA IPC (weights travel through Ray's object store), no FlashAttention (use
``+actor_rollout_ref.model.override_config.attn_implementation=sdpa``).
"""

from __future__ import annotations

import asyncio
import os
import types
from contextlib import contextmanager
from typing import Any

import torch

PLATFORM = "cpu"
ROLLOUT_NAME = "transformers"


CPU_OVERRIDES: tuple[str, ...] = (
    f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "actor_rollout_ref.actor.strategy=fsdp2",  # FSDP1 refuses CPU parameters with sync_module_states
    "actor_rollout_ref.ref.strategy=fsdp2",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "+ray_kwargs.ray_init.num_gpus=1",  # Ray's GPU slots stand for the CPU workers (PlatformCPU.ray_resource_name)
    "ray_kwargs.ray_init.num_cpus=8",  # logical: Ray actors' CPU requests, not cores
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",  # v1 trainer: 8 storage actors otherwise
    "data.dataloader_num_workers=0",
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
)
"""verl overrides a CPU run needs on top of a recipe (one worker, the ``transformers`` rollout, FSDP2, sdpa)."""


def environment(hook_module: str) -> dict[str, str]:
    """The environment variables that make every verl process (driver and Ray workers) import ``hook_module`` and
    run on the ``cpu`` platform. ``hook_module`` is a module whose import calls ``register()``: this package ships
    none (importing an installed module must not patch a library); the end-to-end test's is
    ``tests/verl_support/atr_grpo_verl_cpu_hook.py``, on the workers' ``PYTHONPATH``."""
    return {"VERL_USE_EXTERNAL_MODULES": hook_module, "VERL_PLATFORM": PLATFORM}


# ---------------------------------------------------------------------------------------------------------------
# the platform
# ---------------------------------------------------------------------------------------------------------------
def _cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` with what verl calls on ``torch.cuda`` and ``torch.cpu`` lacks (memory statistics: 0)."""
    module = types.ModuleType("atr_llm_verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    zero = lambda *args, **kwargs: 0  # noqa: E731
    nothing = lambda *args, **kwargs: None  # noqa: E731
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, zero)
    for name in ("empty_cache", "reset_peak_memory_stats", "set_device", "ipc_collect", "reset_max_memory_allocated"):
        setattr(module, name, nothing)
    module.current_device = lambda: 0
    module.device_count = lambda: 1
    module.is_available = lambda: True
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.get_device_name = lambda *args: "cpu"
    module.mem_get_info = lambda *args: (64 << 30, 64 << 30)
    module.memory_stats = lambda *args, **kwargs: {}
    module.get_rng_state = torch.get_rng_state
    module.set_rng_state = torch.set_rng_state
    return module


def _register_platform() -> None:
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    cpu_module = _cpu_device_module()

    @PlatformRegistry.register(platform=PLATFORM)
    class PlatformCPU(PlatformBase):
        """verl's platform interface on a CPU (no accelerator; gloo collectives; Ray's GPU slots as workers)."""

        device_name = "cpu"
        vendor_name = "cpu"
        device_module = cpu_module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM

        def current_device(self) -> str:  # verl passes it to .to(...) and FSDP's device_id: "cpu", not 0
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
            return {"num_gpus": num_gpus}

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None


def _register_engine() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    registered = EngineRegistry._engines
    for model_type, cls_name in (
        ("language_model", "FSDPEngineWithLMHead"),
        ("value_model", "FSDPEngineWithValueHead"),
    ):
        engine = getattr(transformer_impl, cls_name, None)
        for backend in ("fsdp", "fsdp2"):
            if engine is not None and PLATFORM not in registered.get(model_type, {}).get(backend, {}):
                EngineRegistry.register(model_type=model_type, backend=backend, device=PLATFORM)(engine)


def _dedupe_backend(backend: str | None) -> str | None:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"`` (one entry per device type, the first kept)."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    seen, kept = set(), []
    for part in backend.split(","):
        device = part.split(":", 1)[0] if ":" in part else part
        if device not in seen:
            seen.add(device)
            kept.append(part)
    return ",".join(kept)


def _patch_process_group() -> None:
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_atr_grpo_cpu", False):
        return
    original = dist.init_process_group

    def init_process_group(*args, **kwargs):
        if args:
            args = (_dedupe_backend(args[0]), *args[1:])
        if "backend" in kwargs:
            kwargs["backend"] = _dedupe_backend(kwargs["backend"])
        return original(*args, **kwargs)

    init_process_group._atr_grpo_cpu = True
    dist.init_process_group = init_process_group


# ---------------------------------------------------------------------------------------------------------------
# the rollout backend
# ---------------------------------------------------------------------------------------------------------------
def sample_completion(
    model,
    prompt_ids: list[int],
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    eos_ids: list[int],
    logprobs_mode: str = "processed_logprobs",
) -> tuple[list[int], list[float], str]:
    """One sampled completion of ``prompt_ids`` and the log-probability of each of its tokens.

    Sampling: softmax(z / T) restricted by top-k and top-p (``T <= 0``: greedy); stops after an eos id (kept) or
    ``max_tokens`` tokens. Log-probabilities as vLLM's ``logprobs_mode`` (verl's ``rollout.logprobs_mode``):
    ``processed_logprobs`` (verl's default) = log softmax(z / T) over the whole vocabulary, before top-k / top-p;
    ``raw_logprobs`` = log softmax(z). ``z`` are the model's raw logits (``output_logits``).
    Returns (token ids, log-probabilities, ``"stop"`` or ``"length"``)."""
    from transformers import GenerationConfig

    if logprobs_mode not in ("processed_logprobs", "raw_logprobs"):
        raise ValueError(f"logprobs_mode must be 'processed_logprobs' or 'raw_logprobs', got {logprobs_mode!r}")
    greedy = temperature <= 0
    config = GenerationConfig(
        max_new_tokens=max_tokens,
        do_sample=not greedy,
        temperature=1.0 if greedy else float(temperature),
        top_p=1.0 if top_p is None or top_p >= 1 else float(top_p),
        top_k=0 if top_k is None or top_k <= 0 else int(top_k),  # 0: off (transformers' default is 50)
        eos_token_id=eos_ids or None,
        pad_token_id=eos_ids[0] if eos_ids else 0,
        return_dict_in_generate=True,
        output_logits=True,
    )
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), generation_config=config)
    tokens = out.sequences[0, len(prompt_ids) :].tolist()
    scale = 1.0 if greedy or logprobs_mode == "raw_logprobs" else float(temperature)
    logps = [float(torch.log_softmax(out.logits[i][0].float() / scale, -1)[t]) for i, t in enumerate(tokens)]
    finished = bool(tokens) and tokens[-1] in eos_ids
    return tokens, logps, "stop" if finished else "length"


class TransformersServer:
    """A rollout server for one replica: the policy's weights in a ``transformers`` model, sampled on request."""

    def __init__(self, config, model_config, replica_rank: int = 0, node_rank: int = 0, **kwargs) -> None:
        from transformers import AutoModelForCausalLM
        from verl.utils.config import omega_conf_to_dataclass

        self.config = omega_conf_to_dataclass(config)
        self.model_config = model_config
        path = getattr(model_config, "local_path", None) or model_config.path
        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
        self.model.eval()
        generation = self.model.generation_config
        eos = generation.eos_token_id if generation is not None else None
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        self.replica_rank = replica_rank
        torch.manual_seed(int(getattr(self.config, "seed", 0) or 0) + replica_rank)  # reproducible sampling
        self.global_steps = None
        self.weight_updates = 0
        self.requests = 0
        self._lock = asyncio.Lock()

    def get_server_address(self) -> tuple[str, int]:
        return "127.0.0.1", 0

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Copy the trained weights in by name; returns how many tensors were loaded."""
        params = dict(self.model.named_parameters(remove_duplicate=False))  # tied weights under both names
        params.update(dict(self.model.named_buffers(remove_duplicate=False)))
        loaded = 0
        with torch.no_grad():
            for name, tensor in named_tensors:
                key = (
                    name
                    if name in params
                    else name.removeprefix("model.")
                    if name.removeprefix("model.") in params
                    else None
                )
                if key is None:  # e.g. a LoRA adapter's tensors: refused, not skipped (the rollout would go stale)
                    raise ValueError(
                        f"the transformers rollout has no weight {name!r} to update (LoRA adapters are not wired in: "
                        "set actor_rollout_ref.model.lora.merge=True to sync merged weights)"
                    )
                params[key].copy_(tensor.to(params[key].dtype))
                loaded += 1
        self.weight_updates += 1
        return loaded

    def stats(self) -> dict[str, Any]:
        return {"weight_updates": self.weight_updates, "requests": self.requests, "global_steps": self.global_steps}

    async def generate(self, prompt_ids, sampling_params: dict[str, Any], request_id: str, **kwargs):
        from verl.utils import normalize_token_ids
        from verl.workers.rollout.replica import TokenOutput

        prompt_ids = normalize_token_ids(prompt_ids)
        params = dict(sampling_params)
        budget = self.config.prompt_length + self.config.response_length - len(prompt_ids)
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", min(self.config.response_length, budget)))
        max_tokens = max(1, min(int(max_tokens), self.config.response_length))
        async with self._lock:  # one request at a time: the model is not re-entrant
            tokens, logps, reason = await asyncio.to_thread(
                sample_completion,
                self.model,
                prompt_ids,
                max_tokens,
                float(params.get("temperature", 1.0)),
                float(params.get("top_p", 1.0)),
                int(params.get("top_k", -1)),
                self.eos_ids,
                getattr(self.config, "logprobs_mode", "processed_logprobs"),
            )
        self.requests += 1
        return TokenOutput(
            token_ids=tokens,
            log_probs=logps if params.get("logprobs") else None,
            stop_reason="completed" if reason in ("stop", "length") else reason,
            extra_fields={"global_steps": self.global_steps},
        )

    async def wake_up(self, tags: list[str] | None = None):
        return None

    async def sleep(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps

    async def wait_for_requests_to_drain(self):
        async with self._lock:
            return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False):
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True):
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


def server_name(replica_rank: int, node_rank: int = 0) -> str:
    """The Ray actor name of a replica's server (verl's ``<rollout name>_server_<replica>_<node>`` pattern)."""
    return f"{ROLLOUT_NAME}_server_{replica_rank}_{node_rank}"


def _replica_class():
    import ray
    from verl.workers.rollout.replica import RolloutReplica

    class TransformersReplica(RolloutReplica):
        """One ``TransformersServer`` actor per replica, on the node of the replica's first worker."""

        async def launch_servers(self):
            name = server_name(self.replica_rank) + self.name_suffix
            server = (
                ray.remote(TransformersServer)
                .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
                .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
            )
            self.servers = [server]
            address, port = await server.get_server_address.remote()
            self._server_handle = server
            self._server_address = f"{address}:{port}"

        async def abort_request(self, request_id: str):
            return {"aborted": False, "request_id": request_id}

    return TransformersReplica


class TransformersServerAdapter:
    """The hybrid worker's side of the ``transformers`` rollout: sends the trained weights to the replica's server
    (rank 0 of each replica does; the others' shards are gathered by verl's weight generator on every rank)."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kwargs) -> None:
        from verl.utils.config import omega_conf_to_dataclass

        self.config = omega_conf_to_dataclass(config)
        self.model_config = model_config
        self.device_mesh = device_mesh
        rank = int(os.environ.get("RANK", "0"))
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        world *= self.config.pipeline_model_parallel_size
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_first = rank % world == 0
        self._server = None

    def _server_handle(self):
        import ray

        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    @torch.no_grad()
    async def update_weights(self, weights, global_steps: int = None, wire_format: str = "named_tensors", **kwargs):
        if wire_format != "named_tensors":
            raise ValueError(f"the transformers rollout takes wire_format='named_tensors', got {wire_format!r}")
        named = [(name, tensor.detach().to("cpu", copy=True)) for name, tensor in weights]
        if not self.is_first:
            return None
        server = self._server_handle()
        await server.load_weights.remote(named)
        if global_steps is not None:
            await server.set_global_steps.remote(global_steps)
        return None

    def generate_sequences(self, prompts):
        raise NotImplementedError("the transformers rollout is served asynchronously (TransformersServer.generate)")


def _register_rollout() -> None:
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.TransformersServerAdapter"
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _replica_class)


def register() -> None:
    """Register the platform, the engine, the rollout backend and the backend-string fix (idempotent). Called by a
    hook module in every verl process (``environment``); importing this module registers and patches nothing."""
    _register_platform()
    _patch_process_group()
    _register_engine()
    _register_rollout()
