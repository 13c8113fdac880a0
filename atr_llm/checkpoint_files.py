"""Whether a saved checkpoint or model folder will load, read from its files before any model is built.

A resume is refused before the run builds its model, writes a file or takes its lock when any file it needs is
missing or damaged (``checkpoint_file_problem``): the weights (every safetensors header whole, and for a full model
each tensor its config builds, by name and shape: ``weights_problem``), the optimizer's and scheduler's states, the
random streams, the generation-cycle record and the trainer state, each loaded as transformers and this package load
them, and read for the entries they read. Nothing is unpickled beyond ``torch.load(weights_only=True)``: no code in a
checkpoint runs. An evaluation checks the folders it loads the same way (``model_folder_problem``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import warnings
from pathlib import Path

import torch

from .checkpoints import CYCLE_FILE, METHOD_FILE, STATE_FILE, checkpoint_step, cycle_record_problem

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""The files one of which a checkpoint holds its weights in (full model, a PEFT adapter, sharded, or legacy)."""


def _first_line(error: BaseException) -> str:
    return ((str(error).strip().splitlines() or [type(error).__name__])[0])[:160]


def _torch_archive(path: Path) -> tuple[object, str | None]:
    """``(what path holds, None)`` loaded as transformers and this package load it, or ``(None, why it does not
    load)``: ``torch.load`` with ``weights_only=True`` (nothing in it is called or imported) under transformers'
    ``safe_globals`` (numpy's RNG state, as ``Trainer._load_rng_state`` allows it), memory-mapped so that the
    tensors' bytes are not read. A zip whose pickle is garbage, or names a function (a crafted file), is refused
    naming the file."""
    import zipfile

    from transformers.trainer_pt_utils import safe_globals

    if not zipfile.is_zipfile(path):
        return None, f"{path.name} is damaged (not a torch.save archive)"
    try:
        with safe_globals():
            return torch.load(path, weights_only=True, mmap=True, map_location="cpu"), None
    except pickle.UnpicklingError:
        return None, (
            f"{path.name} holds more than tensors and numbers (torch.load with weights_only=True refuses it: a "
            "damaged, crafted or foreign file; nothing in it was run)"
        )
    except Exception as e:  # noqa: BLE001 - zipfile and torch each raise their own
        return None, f"{path.name} is damaged ({type(e).__name__}: {_first_line(e)})"


RNG_KEYS = ("python", "numpy", "cpu")
"""The entries of ``rng_state*.pth`` transformers' ``Trainer._load_rng_state`` reads on every device."""


def rng_state_problem(name: str, state) -> str | None:
    """Why ``state`` (a loaded ``rng_state*.pth`` named ``name``) is not what ``Trainer._save_rng_state`` writes, or
    None: ``RNG_KEYS`` present, Python's state a ``random.getstate()`` triple, numpy's a ``get_state()`` tuple
    naming its generator, the CPU's a byte tensor (``random.setstate``, ``np.random.set_state`` and
    ``torch.set_rng_state`` raise on anything else, after the model is built)."""
    lacks = [k for k in RNG_KEYS if not isinstance(state, dict) or k not in state]
    if lacks:
        return f"{name} lacks the random state of {', '.join(lacks)}"
    python, numpy, cpu = (state[k] for k in RNG_KEYS)
    if not (isinstance(python, tuple) and len(python) == 3 and isinstance(python[1], tuple)):
        return f"{name}'s python state is not random.getstate()'s"
    if not (isinstance(numpy, tuple) and len(numpy) == 5 and isinstance(numpy[0], str)):
        return f"{name}'s numpy state is not numpy.random.get_state()'s"
    if not (isinstance(cpu, torch.Tensor) and cpu.dtype == torch.uint8):
        return f"{name}'s cpu state is not torch.get_rng_state()'s (a byte tensor)"
    return None


def optimizer_state_problem(state, parameters: list[tuple[int, ...]] | None = None) -> str | None:
    """Why ``state`` (a loaded ``optimizer.pt``) is not a ``torch.optim.Optimizer.state_dict()`` for a model whose
    trainable tensors have the shapes ``parameters`` (None: not known), or None: a dict with ``state`` a dict and
    ``param_groups`` a non-empty list of dicts, each with its ``params`` a list of integer ids; the groups together
    hold one id per parameter (``Optimizer.load_state_dict`` refuses another count, after the model is built); each
    parameter's moments (its state's tensors) of one shape, and those shapes the parameters' (as a multiset: a moment
    of another shape crashed the fused Adam step, a segmentation fault)."""
    from collections import Counter

    if not isinstance(state, dict) or not isinstance(state.get("state"), dict):
        return "optimizer.pt is not an optimizer's state (expected its 'state' and 'param_groups')"
    groups = state.get("param_groups")
    if not isinstance(groups, list) or not groups or not all(
        isinstance(g, dict) and isinstance(g.get("params"), list) and all(type(i) is int for i in g["params"])
        for g in groups
    ):
        return "optimizer.pt's param_groups are not a list of groups of parameter ids"
    held = sum(len(g["params"]) for g in groups)
    if parameters is None:
        return None
    if held != len(parameters):
        return f"optimizer.pt holds the state of {held} tensors; the checkpoint's model trains {len(parameters)}"
    moments = Counter()
    for entry in state["state"].values():
        shapes = {tuple(t.shape) for t in entry.values() if isinstance(t, torch.Tensor) and t.dim() > 0}
        if len(shapes) > 1:
            return f"optimizer.pt holds moments of different shapes for one parameter ({sorted(shapes)})"
        moments.update(shapes)
    stray = moments - Counter(parameters)
    if stray:
        return f"optimizer.pt holds moments of a shape the model's parameters do not have ({next(iter(stray))})"
    return None


def scheduler_state_problem(state, groups: int | None = None) -> str | None:
    """Why ``state`` (a loaded ``scheduler.pt``) is not a learning-rate scheduler's ``state_dict()`` for an optimizer
    of ``groups`` parameter groups, or None: a dict with an integer ``last_epoch``; a ``LambdaLR`` (every schedule of
    transformers' ``get_scheduler`` but the plateau one: it has ``base_lrs``) also one ``lr_lambdas`` entry per
    group."""
    if not isinstance(state, dict) or type(state.get("last_epoch")) is not int:
        return "scheduler.pt is not a scheduler's state (expected its 'last_epoch')"
    base = state.get("base_lrs")
    if base is None:
        return None
    lambdas = state.get("lr_lambdas")
    if not isinstance(base, list) or not isinstance(lambdas, list) or len(lambdas) != len(base):
        return "scheduler.pt's base_lrs and lr_lambdas do not pair up (one per parameter group)"
    if not all(isinstance(b, (int, float)) and math.isfinite(b) and b >= 0 for b in base):
        return f"scheduler.pt's base learning rates {base} are not finite numbers >= 0"
    if groups is not None and len(base) != groups:
        return f"scheduler.pt schedules {len(base)} parameter groups; optimizer.pt has {groups}"
    return None


def _json_object(path: Path) -> tuple[dict | None, str | None]:
    """``(the JSON object in path, None)``, or ``(None, why it is not one)`` naming the file."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"{path.name} is damaged ({e})"
    return (value, None) if isinstance(value, dict) else (None, f"{path.name} is not a JSON object")


def trainer_state_problem(folder: Path) -> str | None:
    """Why ``STATE_FILE`` cannot restart the trainer as the run that wrote it stood, or None. transformers builds a
    ``TrainerState`` from every key (an unknown one is a TypeError), reads ``global_step`` and ``epoch`` as numbers
    and ``log_history`` as a list of entries (dicts); the step is the one in the folder's name (``checkpoint-N``: a
    larger one would skip the rest of the run and save this checkpoint's weights as the final model), and ``epoch``
    at most ``global_step`` (an epoch takes one step or more; the resume replays the sampler once per epoch)."""
    from transformers import TrainerState

    state, problem = _json_object(folder / STATE_FILE)
    if problem:
        return problem
    unknown = sorted(set(state) - {f.name for f in dataclasses.fields(TrainerState)})
    if unknown:
        return f"{STATE_FILE} has entries transformers' TrainerState does not know ({', '.join(unknown)})"
    step, epoch = state.get("global_step"), state.get("epoch")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"{STATE_FILE} has no step count (global_step {step!r}; expected an integer >= 0)"
    named = checkpoint_step(folder)
    if named is not None and step != named:
        return f"{STATE_FILE}'s global_step {step} is not the step its folder {folder.name} was saved at"
    if isinstance(epoch, bool) or not isinstance(epoch, (int, float)) or not math.isfinite(epoch) or epoch < 0:
        return f"{STATE_FILE} has no epoch (epoch {epoch!r}; expected a number >= 0)"
    if epoch > max(step, 0) + 1e-6:
        return f"{STATE_FILE}'s epoch {epoch:g} is more than its global_step {step} (an epoch takes a step or more)"
    history = state.get("log_history", [])
    if not isinstance(history, list) or not all(isinstance(entry, dict) for entry in history):
        return f"{STATE_FILE}'s log_history is not a list of entries (JSON objects)"
    return None


def method_record_problem(folder: Path | str) -> str | None:
    """Why ``METHOD_FILE`` of ``folder`` (where there is one) is not a record ``write_method_record`` wrote: a JSON
    object with a ``method`` naming a registered rule (``atr_theory.method_names``), a ``form`` among
    ``atr_theory.FORMS`` or null, ``params`` an object of finite numbers and ``model`` an object; or None."""
    import atr_theory as at

    path = Path(folder) / METHOD_FILE
    if not path.is_file():
        return None
    record, problem = _json_object(path)
    if problem:
        return problem
    if not isinstance(record.get("method"), str):
        return f"{METHOD_FILE} names no method (expected a JSON object with a 'method' string)"
    if record["method"] not in at.method_names():
        return f"{METHOD_FILE} names a method this package does not have ({record['method']!r})"
    if not (record.get("form") is None or record["form"] in at.FORMS):
        return f"{METHOD_FILE}'s form {record['form']!r} is not a form ({', '.join(at.FORMS)})"
    params = record.get("params", {})
    if isinstance(params, dict) and (stray := sorted(set(params) - set(at.get_method(record["method"]).params))):
        return f"{METHOD_FILE}'s params name {stray[0]!r}, which {record['method']} does not have"
    if not isinstance(params, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in params.values()
    ):
        return f"{METHOD_FILE}'s params {params!r} are not an object of numbers"
    if not isinstance(record.get("model", {}), dict):
        return f"{METHOD_FILE}'s model {record['model']!r} is not an object"
    return None


def _safetensors_shapes(path: Path) -> tuple[dict | None, str | None]:
    """``({tensor name: shape}, None)`` from ``path``'s header (whole: it parses and covers the file), or
    ``(None, why not)``."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
            integer = [k for k, d in dtypes.items() if not d.startswith(("F", "BF"))]
            if integer:
                return None, f"{path.name} holds {integer[0]} as {dtypes[integer[0]]}, not a floating-point tensor"
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}, None
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type
        return None, f"{path.name} is damaged ({_first_line(e)})"


def model_on_meta(config) -> torch.nn.Module:
    """The causal LM a transformers ``config`` describes, built on the meta device: its modules and shapes, no memory
    and no weights read (what a check needs to know of a model before it loads). transformers' own notices while it
    builds (an unknown ``model_type``) are kept quiet: the caller words the refusal."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.device("meta"):
                return AutoModelForCausalLM.from_config(config)
    finally:
        hf_logging.set_verbosity(verbosity)


def _model_on_meta(folder: Path) -> tuple[torch.nn.Module | None, str | None]:
    """The causal LM ``folder/config.json`` describes, on the meta device (``model_on_meta``), or ``(None, why
    config.json does not describe one)``."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' own notice of an unknown model_type: the refusal says it
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
        return model_on_meta(config), None
    except Exception as e:  # noqa: BLE001 - transformers raises ValueError, KeyError, TypeError, ... per field
        return None, f"config.json does not describe a model this transformers builds ({_first_line(e)})"
    finally:
        hf_logging.set_verbosity(verbosity)


def weights_problem(folder: Path | str) -> tuple[str | None, list[tuple[int, ...]] | None]:
    """``(why the full model saved in folder would not load as its config.json builds it, or None, the shapes of the
    tensors that model trains)``: every ``model*.safetensors`` header whole, and the tensors they hold those of the
    model ``config.json`` builds (``_model_on_meta``), by name and shape, none missing but a tied one (transformers
    leaves a missing tensor at its fresh initialisation and only logs it). ``(None, None)`` where the folder holds no
    full model in safetensors (an adapter, or legacy ``.bin`` weights)."""
    folder = Path(folder)
    saved: dict = {}
    for path in sorted(folder.glob("*.safetensors")):
        shapes, problem = _safetensors_shapes(path)
        if problem:
            return problem, None
        saved.update(shapes if path.name.startswith("model") else {})
    if not saved or not (folder / "config.json").is_file():
        return None, None
    model, problem = _model_on_meta(folder)
    if problem:
        return problem, None
    expected = model.state_dict(keep_vars=True)
    tensors: dict[int, str] = {}
    tied = {name for name, t in expected.items() if tensors.setdefault(id(t), name) != name}
    missing = sorted(set(expected) - set(saved) - tied)
    unknown = sorted(set(saved) - set(expected))
    wrong = [f"{k} {saved[k]} (config: {tuple(expected[k].shape)})" for k in sorted(set(saved) & set(expected))
             if saved[k] != tuple(expected[k].shape)]
    for what, names in (("lack", missing), ("hold tensors its config.json has no place for:", unknown),
                        ("hold tensors of another shape:", wrong)):
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            return f"the saved weights {what} {', '.join(names[:3])}{more}", None
    return None, [tuple(p.shape) for p in model.parameters() if p.requires_grad]


def _config_files_problem(folder: Path) -> str | None:
    for name in ("config.json", "adapter_config.json"):
        if (folder / name).is_file() and (problem := _json_object(folder / name)[1]):
            return problem
    return None


def model_folder_problem(folder: Path | str, *, tokenizer: bool = False) -> str | None:
    """Why the saved model or adapter in ``folder`` would not load, read from its files before anything loads, or
    None: ``config.json`` / ``adapter_config.json`` not a JSON object, the weights (``weights_problem``), the rule
    it trained (``method_record_problem``: an evaluation names it), or (``tokenizer``) no tokenizer file (``tokenizer.json``, ``tokenizer.model`` or ``vocab.json``)."""
    folder = Path(folder)
    problem = _config_files_problem(folder) or weights_problem(folder)[0] or method_record_problem(folder)
    if problem:
        return problem
    if tokenizer and not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return "has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)"
    return None


def _buffered_batch_problem(buffered) -> str | None:
    """Why a cycle record's ``buffered_inputs`` is not the batch TRL buffers (``GRPOTrainer._buffered_inputs``): None
    before the first generation, else a non-empty list of dicts in which the completion tensors (``completion_ids``,
    ``completion_mask``, the per-token log-probs) share one shape and the prompt tensors another; or None."""
    if buffered is None:
        return None
    if not isinstance(buffered, list) or not buffered or not all(isinstance(b, dict) for b in buffered):
        return "buffered_inputs is not a non-empty list of batches"
    for batch in buffered:
        for prefix, keys in (("completion", ("completion_ids", "completion_mask", "old_per_token_logps",
                                             "ref_per_token_logps", "sampling_per_token_logps")),
                             ("prompt", ("prompt_ids", "prompt_mask"))):
            shapes = {k: tuple(batch[k].shape) for k in keys if isinstance(batch.get(k), torch.Tensor)}
            if len(set(shapes.values())) > 1:
                return f"its buffered {prefix} tensors differ in shape ({shapes})"
    return None


def _missing_states(folder: Path) -> list[str]:
    missing = [name for name in ("optimizer.pt", "scheduler.pt") if not (folder / name).is_file()]
    return missing + ([] if any(folder.glob("rng_state*.pth")) else ["rng_state*.pth"])


def checkpoint_file_problem(checkpoint: str | Path, *, allow_fresh_optimizer: bool = False) -> str | None:
    """Why a resume from ``checkpoint`` would fail or silently lose state, read from its files before any model is
    built, or None: its weights (``WEIGHT_FILES``; ``weights_problem``, and ``config.json`` a JSON object), ``STATE_FILE``
    (``trainer_state_problem``) and ``METHOD_FILE`` (``method_record_problem``); ``optimizer.pt`` (without it
    transformers resumes with fresh Adam moments; runs saved with ``save_only_model`` cannot be resumed),
    ``scheduler.pt`` and the random streams (``rng_state*.pth``: without them the resume is no longer exact), each
    of those and each generation-cycle file (``CYCLE_FILE``) loaded as ``_torch_archive`` loads it and read for
    what the resume reads (``optimizer_state_problem``, ``scheduler_state_problem``, ``RNG_KEYS``,
    ``cycle_record_problem``). ``allow_fresh_optimizer``: a missing ``optimizer.pt``, ``scheduler.pt`` or
    ``rng_state*.pth`` is taken (the run asked to restart them)."""
    folder = Path(checkpoint)
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        return f"no model weights ({' / '.join(WEIGHT_FILES)})"
    problem, trained = _config_files_problem(folder), None
    if not problem:
        problem, trained = weights_problem(folder)
    problem = problem or trainer_state_problem(folder) or method_record_problem(folder)
    if problem:
        return problem
    broken = sorted(p.name for p in folder.iterdir() if p.is_symlink() and not p.exists())
    if broken:
        return f"{broken[0]} is a link to a file that does not exist"
    missing = _missing_states(folder)
    if missing and not allow_fresh_optimizer:
        return (
            f"no {' / '.join(missing)}: resuming would restart Adam's moments, the learning-rate schedule or the random "
            "streams (a run saved with save_only_model); resume from a checkpoint that holds them, or set "
            "allow_fresh_optimizer true (--allow_fresh_optimizer true) to restart them"
        )
    groups = None
    for path in [folder / "optimizer.pt", folder / "scheduler.pt", *sorted(folder.glob("rng_state*.pth")),
                 *sorted(folder.glob(CYCLE_FILE.format(rank="*")))]:
        if not path.is_file():
            continue
        state, problem = _torch_archive(path)
        if path.name == "optimizer.pt":
            problem = problem or optimizer_state_problem(state, trained)
            groups = None if problem else len(state["param_groups"])
        elif path.name == "scheduler.pt":
            problem = problem or scheduler_state_problem(state, groups)
        elif path.name.startswith("rng_state"):
            problem = problem or rng_state_problem(path.name, state)
        else:
            why = problem or cycle_record_problem(state) or _buffered_batch_problem(state["buffered_inputs"])
            problem = why if problem or not why else f"{path.name} is not a generation-cycle record ({why})"
        if problem:
            return problem
    return None


def restored_optimizer_settings(checkpoint: str | Path, training) -> tuple[str, float, float] | None:
    """``(option, value in the checkpoint, value configured)`` for the first optimizer setting a resume of
    ``checkpoint`` would take from its files instead of from ``training`` (an ``ATRGRPOConfig``), or None. torch's
    ``Optimizer.load_state_dict`` restores every group's ``lr`` / ``initial_lr``, ``betas``, ``eps`` and
    ``weight_decay`` and the scheduler's ``base_lrs`` (transformers loads both on resume), so a learning rate, Adam
    beta, epsilon or weight decay changed for the resume was dropped without a word."""
    folder = Path(checkpoint)
    if not (folder / "optimizer.pt").is_file():
        return None
    state, problem = _torch_archive(folder / "optimizer.pt")
    if problem or optimizer_state_problem(state):
        return None
    same = lambda a, b: math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)  # noqa: E731
    groups = state["param_groups"]
    for group in groups:
        saved = {"learning_rate": group.get("initial_lr"), "adam_epsilon": group.get("eps")}
        betas = group.get("betas")
        if isinstance(betas, (list, tuple)) and len(betas) == 2:
            saved |= {"adam_beta1": betas[0], "adam_beta2": betas[1]}
        for name, value in saved.items():
            if isinstance(value, (int, float)) and not same(value, getattr(training, name)):
                return name, float(value), float(getattr(training, name))
    decays = [g.get("weight_decay") for g in groups if isinstance(g.get("weight_decay"), (int, float))]
    if decays and not any(same(d, training.weight_decay) for d in decays) and any(d for d in decays):
        return "weight_decay", float(max(decays)), float(training.weight_decay)
    return None
