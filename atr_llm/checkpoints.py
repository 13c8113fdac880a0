"""Which checkpoints a run can resume from: only complete ones, so a run killed while writing one loses nothing.

transformers writes ``checkpoint-N/`` in place, its ``trainer_state.json`` after the weights, optimizer, scheduler
and RNG states; a process killed during the write leaves a folder without that file or with a cut one. A checkpoint
is complete when its ``trainer_state.json`` parses (``is_complete_checkpoint``); resuming from "latest" takes
the newest complete one, and an incomplete one named explicitly is refused.

A resumed run continues as the uninterrupted one would (``ExactResumeMixin``, a part of ``ATRGRPOTrainer``): the
sampler's order across epochs, and TRL's generation cycle (the micro-step counter and the buffered batch,
``save_cycle_state``) saved in every checkpoint.

Every checkpoint and the final model also record the rule they trained (``METHOD_FILE``: name, form, parameters), and
the model it trains, so that a resume cannot switch rule, form, parameters or model silently
(``check_resume_compatible``) and an evaluation names the form.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import warnings
from pathlib import Path

import torch
from transformers import TrainerCallback

FORM_DEFAULT_CHANGED = "2026-11-27"
FORMER_MASK_DEFAULTS = ("atr", "kl1", "kl2", "is_kl3", "tr_ppo")
"""The rules whose default form was the mask form until ``FORM_DEFAULT_CHANGED`` (PPO's min since): a checkpoint of
one of them whose record names no form trained the mask form (``recorded_choice``)."""

STATE_FILE = "trainer_state.json"
LATEST = ("latest", "true", "True")
"""``--resume_from_checkpoint`` values that mean the newest complete checkpoint of ``--output_dir``."""


def checkpoint_step(path: Path) -> int | None:
    """N of a ``checkpoint-N`` folder name, else None."""
    m = re.fullmatch(r"checkpoint-(\d+)", Path(path).name)
    return int(m.group(1)) if m else None


METHOD_FILE = "atr_method.json"
"""Written into every checkpoint and into ``final/``: ``{"method", "form", "params", "model"}`` of the rule the run
trains and the model it trains (``model_identity``)."""

ARCHITECTURE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
"""``config.json`` entries two models must share for one's weights to load into the other."""

COMPUTATION_KEYS = (
    "hidden_act",
    "intermediate_size",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
)
"""``config.json`` entries that change what the weights compute without changing their shapes: a resume loads the
checkpoint's weights into the model the run builds, so one of these edited in the checkpoint's ``config.json`` (or
set otherwise for the run) would be ignored; compared where both sides name them."""


def model_identity(model) -> dict:
    """What a checkpoint records of the model it trained: its config's ``ARCHITECTURE_KEYS`` and ``COMPUTATION_KEYS``
    and the name or path it
    was loaded from (``_name_or_path``; empty for a model built from a config, as the tiny one)."""
    config = getattr(model, "config", None)
    keys = (*ARCHITECTURE_KEYS, *COMPUTATION_KEYS)
    identity = {k: getattr(config, k) for k in keys if getattr(config, k, None) is not None}
    return {**identity, "name_or_path": str(getattr(config, "_name_or_path", "") or "")}


def write_method_record(folder: Path | str, resolved, model=None) -> Path:
    """``folder/METHOD_FILE`` for ``resolved`` (an ``atr_theory.ResolvedMethod``) and ``model`` (what
    ``model_identity`` records; none without a model)."""
    path = Path(folder) / METHOD_FILE
    record = {"method": resolved.name, "form": resolved.form, "params": dict(resolved.params)}
    if model is not None:
        record["model"] = model_identity(model)
    path.write_text(json.dumps(record))
    return path


def recorded_method(folder: Path | str) -> dict | None:
    """The rule a checkpoint (or final model) folder trained: its ``METHOD_FILE``; for a folder written before that
    file existed, its ``training_args.bin`` (TRL's config, unpickled), where a rule of ``FORMER_MASK_DEFAULTS`` with
    no form trained the mask form (``"recorded": "legacy default"``). None when neither says."""
    folder = Path(folder)
    if (folder / METHOD_FILE).is_file():
        return {**json.loads((folder / METHOD_FILE).read_text()), "recorded": METHOD_FILE}
    args_file = folder / "training_args.bin"
    if not args_file.is_file():
        return None
    fields = pickled_fields(args_file)
    method, form = fields.get("method"), fields.get("form")
    if not isinstance(method, str) or not (form is None or isinstance(form, str)):
        return None
    import atr_theory as at

    name = at.get_method(method).name if method in at.METHODS else method
    if form is None and name in FORMER_MASK_DEFAULTS:
        return {"method": name, "form": "mask", "recorded": "legacy default"}
    return {"method": name, "form": form, "recorded": "training_args.bin"}


class _Inert:
    """What ``pickled_fields`` builds in place of every class or function a pickle names: nothing is imported or
    called; the state a pickle gives it (BUILD) is kept, items and appends are dropped."""

    def __init__(self, *args, **kwargs):
        self.state: dict = {}

    def __setstate__(self, state):
        if isinstance(state, tuple) and state and isinstance(state[0], dict):  # (__dict__, __slots__ state)
            state = state[0]
        self.state = state if isinstance(state, dict) else {}

    def __call__(self, *args, **kwargs):  # a stand-in used as a callable (e.g. getattr(cls, name)(...))
        return _Inert()

    def __setitem__(self, key, value):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass


class _InertUnpickler(pickle.Unpickler):
    def find_class(self, module, name):  # never an import: every global becomes _Inert
        return _Inert

    def persistent_load(self, pid):  # a tensor's storage: not read
        return None


def pickled_fields(path: Path | str) -> dict:
    """The top-level fields of the object pickled in ``path`` (a ``torch.save`` zip archive such as TRL's
    ``training_args.bin``), read without running any of it: no module is imported and no constructor, function or
    ``__reduce__`` callable in the file is called (every global the pickle names becomes an inert stand-in), so a
    crafted checkpoint cannot execute code here. Values that are plain data (str, numbers, None, lists, dicts) come
    back as they were; anything else as a stand-in. {} when the file is not such an archive or cannot be read."""
    import io
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if name is None:
                return {}
            loaded = _InertUnpickler(io.BytesIO(archive.read(name))).load()
    except Exception:  # noqa: BLE001 - a damaged or foreign file: nothing is known
        return {}
    if isinstance(loaded, _Inert):
        return dict(loaded.state)
    return dict(loaded) if isinstance(loaded, dict) else {}


def describe_recorded_method(record: dict | None) -> str | None:
    """``"atr, mask form"`` (and why, for a legacy default), or None."""
    if record is None:
        return None
    text = f"{record['method']}, {record['form']} form" if record.get("form") else record["method"]
    if record.get("recorded") == "legacy default":
        text += f" (recorded without a form before {FORM_DEFAULT_CHANGED}, when that was {record['method']}'s default)"
    return text


def checkpoint_model(checkpoint: Path | str) -> dict:
    """What ``checkpoint`` says of the model it trained: its ``METHOD_FILE``'s ``model``, else the ``config.json`` of a
    full-model checkpoint (``ARCHITECTURE_KEYS``, ``COMPUTATION_KEYS``), else a LoRA adapter's base model name; {} when nothing does."""
    folder = Path(checkpoint)
    record = recorded_method(folder) or {}
    if record.get("model"):
        return dict(record["model"])
    for file, read in (
        ("config.json", config_model),
        (
            "adapter_config.json",
            lambda d: {"name_or_path": d["base_model_name_or_path"]} if d.get("base_model_name_or_path") else {},
        ),
    ):
        try:
            return read(json.loads((folder / file).read_text()))
        except (OSError, ValueError, AttributeError):
            continue
    return {}


def config_model(values: dict) -> dict:
    """A ``config.json``'s ``ARCHITECTURE_KEYS`` and ``COMPUTATION_KEYS`` entries."""
    return {k: values[k] for k in (*ARCHITECTURE_KEYS, *COMPUTATION_KEYS) if k in values}


def _config_file_model(checkpoint: Path | str) -> dict:
    """``checkpoint/config.json``'s entries ``config_model`` keeps; {} without a readable one (an adapter)."""
    try:
        values = json.loads((Path(checkpoint) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config_model(values) if isinstance(values, dict) else {}


def _a_path(name: str | None) -> bool:
    """Whether a model's ``name_or_path`` is a folder (absolute, relative, or present here) rather than a hub id."""
    return bool(name) and (Path(name).is_absolute() or name.startswith(".") or Path(name).exists())


def check_resume_compatible(checkpoint: Path | str, resolved, model: dict | None = None, *, name=str) -> None:
    """Refuse (ValueError) to resume ``checkpoint`` with a configuration that trains something else: another rule,
    the same rule in another form, other parameter values (``resolved``, an ``atr_theory.ResolvedMethod``), or
    another model (``model``: what is known of it, ``model_identity``'s keys; only keys both sides know are
    compared, and a name only when both are hub ids: a run's folder may move). ``name(param)`` is the option a parameter is set by (``atr_llm.config.config_field``). A checkpoint
    that recorded none of these is resumed as it is."""
    record = recorded_method(checkpoint)
    again = "to continue it as it was trained, or start a new run in another --output_dir"
    if record is not None and record["method"] != resolved.name:
        raise ValueError(
            f"{checkpoint} trained {describe_recorded_method(record)}; this configuration trains {resolved.name}. "
            f"Pass --method {record['method']} {again}"
        )
    if record is not None and record.get("form") is not None and record["form"] != resolved.form:
        raise ValueError(
            f"{checkpoint} trained {describe_recorded_method(record)}; this "
            f"configuration trains {resolved.name} in the {resolved.form} form. Pass --form {record['form']} {again}"
        )
    for param, value in (record or {}).get("params", {}).items():
        if param in resolved.params and float(resolved.params[param]) != float(value):
            raise ValueError(
                f"{checkpoint} trained {resolved.name} with {name(param)} {value:g}; this configuration sets "
                f"{resolved.params[param]:g}. Pass --{name(param)} {value:g} {again}"
            )
    # what the checkpoint recorded, then its config.json: a resume loads the weights into the model this run builds
    # and never reads that file, so an entry edited there would be ignored
    for trained in (checkpoint_model(checkpoint), _config_file_model(checkpoint)):
        mine = dict(model or {})
        if any(_a_path(side.get("name_or_path")) for side in (trained, mine)):  # a folder may move with its run
            trained.pop("name_or_path", None), mine.pop("name_or_path", None)
        differ = [k for k in trained if k in mine and trained[k] != mine[k]]
        if differ:
            said = lambda k, v: "a model built from a config (the tiny one)" if k == "name_or_path" and not v else repr(v)  # noqa: E731
            shown = ", ".join(f"{k} {said(k, trained[k])} there, {said(k, mine[k])} here" for k in differ)
            raise ValueError(f"{checkpoint} trained another model ({shown}); resume it with the model it trained")


def is_complete_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` holds a checkpoint written to its end (its ``trainer_state.json`` parses as a JSON object)."""
    state = Path(path) / STATE_FILE
    try:
        return isinstance(json.loads(state.read_text()), dict)
    except (OSError, ValueError):
        return False


def complete_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every complete ``checkpoint-N`` in ``run_dir``, by step."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(checkpoint_step(p), p) for p in run_dir.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted((step, p) for step, p in found if is_complete_checkpoint(p))


def latest_complete_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of ``run_dir`` (None when there is none)."""
    found = complete_checkpoints(run_dir)
    return found[-1][1] if found else None


CYCLE_FILE = "atr_grpo_cycle_rank{rank}.pt"
"""Per process, in each checkpoint: TRL's micro-step counter and its buffered generation batch (``save_cycle_state``)."""


def save_cycle_state(folder: Path, rank: int, step: int, buffered_inputs) -> Path:
    """Write where a run is inside TRL's generation cycle: its micro-step counter ``_step`` (which decides when the
    next batch is generated: every ``steps_per_generation * num_iterations``) and the buffered generation batch the
    next steps train on (completions, advantages, old log-probs), tensors on the CPU."""

    def to_cpu(value):
        if isinstance(value, torch.Tensor):
            return value.detach().to("cpu")
        if isinstance(value, dict):
            return {k: to_cpu(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(to_cpu(v) for v in value)
        return value

    path = Path(folder) / CYCLE_FILE.format(rank=rank)
    torch.save({"step": int(step), "buffered_inputs": to_cpu(buffered_inputs)}, path)
    return path


def load_cycle_state(folder: Path, rank: int, device) -> dict | None:
    """``save_cycle_state``'s record of ``folder`` for process ``rank``, tensors on ``device``; None if absent. Read
    with ``weights_only=True`` (tensors and plain containers only: a crafted file cannot run code); a file that does
    not load that way is refused with a ValueError naming it."""
    path = Path(folder) / CYCLE_FILE.format(rank=rank)
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # noqa: BLE001 - damaged, or holds more than tensors and plain data
        raise ValueError(
            f"{path} cannot be read as a checkpoint's generation-cycle record (tensors and plain data only): "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; resume from another checkpoint"
        ) from None
    problem = cycle_record_problem(state)
    if problem:
        raise ValueError(f"{path} is not a generation-cycle record ({problem})")
    return state


def cycle_record_problem(state) -> str | None:
    """Why ``state`` (a loaded ``CYCLE_FILE``) is not what ``save_cycle_state`` writes, or None: a dict whose ``step``
    is an integer >= 0 (TRL's micro-step counter) and which holds ``buffered_inputs``."""
    if not isinstance(state, dict) or "buffered_inputs" not in state:
        return "expected a step and buffered_inputs"
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"step {step!r}; expected an integer >= 0"
    return None


def _saved_state(checkpoint) -> dict:
    """The ``trainer_state.json`` of a saved checkpoint (checked by ``atr_llm.checkpoint_files`` before a resume)."""
    return json.loads((Path(checkpoint) / STATE_FILE).read_text())


def trained_steps(checkpoint) -> int:
    """The optimizer steps a saved checkpoint had taken: the ``global_step`` in its ``trainer_state.json``."""
    return int(_saved_state(checkpoint)["global_step"])


def completed_epochs(checkpoint) -> int:
    """Whole epochs a saved checkpoint had finished: ``floor`` of the ``epoch`` in its ``trainer_state.json``."""
    return math.floor(_saved_state(checkpoint)["epoch"] + 1e-6)  # 250 steps of 250 per epoch may be stored as 0.9999999


class LogAtEveryCheckpoint(TrainerCallback):
    """Log at every step that saves a checkpoint, as well as every ``logging_steps``.

    A logged value averages the steps since the previous log: TRL's metrics (reward, clip fractions, entropy, ...)
    are buffered per step and transformers' loss is summed in the training loop, and neither buffer is in a
    checkpoint. A run resumed from a checkpoint that lies between two logs therefore logged, at its next log, the
    mean over the steps after the checkpoint only (measured: the ``--quick`` table, checkpoint at step 2, log at
    step 4, a reward of 0.0117 after the resume against 0.0137 uninterrupted, with the same weights). Logging when a
    checkpoint is saved empties both buffers there, so every log covers the same steps in a resumed and an
    uninterrupted run. Where ``save_steps`` is a multiple of ``logging_steps`` nothing changes.

    Not at the last step (``global_step >= max_steps``, where transformers saves a final checkpoint): its buffered
    metrics go into the run's closing entry of ``log_history`` beside ``train_loss``, as stock TRL's do (TRL's own
    tests read ``policy_loss``, ``entropy_coef`` and ``aux_loss`` from ``log_history[-1]``); nothing trains after that
    checkpoint, so no resumed run can log differently."""

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save and state.global_step < state.max_steps:
            control.should_log = True
        return control


class ExactResumeMixin:
    """A run resumed from a checkpoint sees the prompts in the uninterrupted run's order, and logs what the
    uninterrupted run logs (``LogAtEveryCheckpoint``).

    TRL's ``RepeatSampler`` draws one permutation per epoch from a generator seeded once and has no ``set_epoch``;
    on resume transformers builds a fresh sampler and skips batches of the current epoch only, so after k finished
    epochs the resumed run replayed permutation 1 where the uninterrupted run draws permutation k + 1 (measured: a
    clip run resumed at an epoch boundary differed in the weights of every later checkpoint). Here the fresh
    sampler's generator first draws the k permutations the uninterrupted run had drawn (test: resumed = uninterrupted,
    weights bit for bit, at and off an epoch boundary)."""

    _epochs_before_resume = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(LogAtEveryCheckpoint())

    def _save_checkpoint(self, model, trial):
        """The checkpoint, with where the run is inside TRL's generation cycle (``CYCLE_FILE``, one per process):
        written first, so a checkpoint complete by ``trainer_state.json`` always has it."""
        folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        save_cycle_state(folder, self.accelerator.process_index, self._step, self._buffered_inputs)
        if self.accelerator.is_main_process:
            write_method_record(folder, self.args.resolved_method, self.model)
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """transformers' resume hook (TRL restores its entropy controller here too): also the generation cycle, so
        that a run resumed between two generations trains on the batch the uninterrupted run had buffered."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        state = load_cycle_state(Path(checkpoint), self.accelerator.process_index, self.accelerator.device)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if state is not None:
            self._step, self._buffered_inputs = state["step"], state["buffered_inputs"]
        elif self.state.global_step * self.args.gradient_accumulation_steps % generate_every:
            warnings.warn(
                f"{checkpoint} holds no generation-cycle state ({CYCLE_FILE}: written by atr-grpo since the generation "
                f"cycle is saved) and lies between two generations (every {generate_every} micro-steps): the resumed "
                "run generates a new batch where the uninterrupted run reused its buffered one, so it will not end "
                "with the same weights",
                stacklevel=2,
            )

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None) -> None:
        """transformers' load of the checkpoint's weights, then a look at each loaded tensor: a NaN or an infinity
        in one (a run that diverged, a damaged file) is refused naming the tensor, before any step trains on it
        (the loss met it first, at the first step). A pass over the weights in memory; reading them from the file
        before the model is built would cost a full read of the model."""
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        for name, tensor in (model if model is not None else self.model).named_parameters():
            if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
                raise ValueError(
                    f"{resume_from_checkpoint} cannot be resumed: its weight {name} holds a NaN or an infinity "
                    "(a diverged run or a damaged file); resume an earlier checkpoint"
                )

    def _issue_warnings_after_load(self, load_result) -> None:
        """transformers' report of the keys a resumed checkpoint lacked, less the tied output head's (``lm_head.weight``
        under ``tie_word_embeddings``: ``save_pretrained`` leaves it out and the loaded model keeps it tied to the
        embeddings, so it is not missing); transformers 5.24 compares with ``_keys_to_ignore_on_save`` only and
        reported it on every resume, which read like damage."""
        tied = set(getattr(self.model, "_tied_weights_keys", None) or ()) if self._head_is_tied() else set()
        if tied and set(load_result.missing_keys) & tied:
            missing = [k for k in load_result.missing_keys if k not in tied]
            load_result = type(load_result)(missing_keys=missing, unexpected_keys=list(load_result.unexpected_keys))
        super()._issue_warnings_after_load(load_result)

    def _head_is_tied(self) -> bool:
        """Whether the model's output head is its input embeddings' tensor (checked, not read from the config)."""
        model = self.accelerator.unwrap_model(self.model)
        head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
        return head is not None and embeddings is not None and head.weight is embeddings.weight

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        checkpoint = resume_from_checkpoint
        if checkpoint is True or checkpoint in LATEST:  # the newest *complete* checkpoint (atr_llm.checkpoints)
            checkpoint = latest_complete_checkpoint(self.args.output_dir)
            if checkpoint is None:
                raise ValueError(f"--resume_from_checkpoint latest: no complete checkpoint in {self.args.output_dir}")
            checkpoint = str(checkpoint)
        if checkpoint:  # the same check as the command line's (atr_llm.config.RunConfig), on the loaded model
            check_resume_compatible(checkpoint, self.args.resolved_method, model_identity(self.model))
        self._epochs_before_resume = completed_epochs(checkpoint) if checkpoint else 0
        return super().train(checkpoint, *args, **kwargs)

    def _get_train_sampler(self, *args, **kwargs):
        sampler = super()._get_train_sampler(*args, **kwargs)
        if getattr(sampler, "shuffle", False):
            for _ in range(self._epochs_before_resume):  # the permutations of the epochs already trained
                torch.randperm(sampler.num_samples, generator=sampler.generator)
        return sampler
