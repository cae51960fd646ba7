"""Training checkpoints: all a killed run needs to continue as if it had never stopped (docs/training.md §7).

`out/checkpoint/` holds
- `config.json` + `model.safetensors`: the draft's fp32 master weights (a loadable draft folder as well);
- `trainer_state.safetensors`: the AdamW state, flattened to `<parameter name>.<exp_avg|exp_avg_sq|step>`;
- `trainer_state.json`: step, epoch, position in the epoch, schedule, seeds, the data's fingerprint (a resume
  refuses other data) and the run's TrainConfig;
- `trainer_weights.safetensors` (standardized-feature runs only): the trained weights that differ from the
  exported ones (fc' = fc · diag(s)), bit for bit, so that a resumed run continues exactly.
Only safetensors and JSON: nothing is pickled. Data order and anchors are functions of (seed, epoch, step,
index), so the step and the position restore them; there is no RNG state to carry.

A new checkpoint is written to `checkpoint.partial/` and swapped in by renames; a kill while saving leaves
the previous checkpoint (possibly as `checkpoint.old/`) intact. The exported draft folder (`save_draft`) is
swapped in the same way, so a run cut short at any moment leaves a loadable draft where it wrote one.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..config import DraftConfig
from ..io.vocab import write_vocab
from ..errors import CheckpointError, ConfigError, InputError
from ..io.checkpoint import is_draft_folder, read_checkpoint, write_checkpoint
from .settings import TrainConfig

from .run import Run

CHECKPOINT = "checkpoint"
STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.safetensors"
TRAINED_TENSORS = "trainer_weights.safetensors"


def latest_checkpoint(out: Path) -> Path | None:
    """The complete checkpoint under `out` (the json is written last), else the one a kill left as `.old`."""
    for name in (CHECKPOINT, CHECKPOINT + ".old"):
        if (out / name / STATE_JSON).is_file():
            return out / name
    return None


def save_training_state(out: Path, cfg: DraftConfig, tensors: dict[str, torch.Tensor],
                        optimizer: torch.optim.Optimizer, names: list[str], state: dict,
                        trained: dict[str, torch.Tensor] | None = None) -> Path:
    """Write `out/checkpoint/` (draft `tensors` fp32, optimizer, state json) atomically; returns its path.

    `names` are the trainable parameters' names in optimizer order; `trained`, the exact trained tensors that
    differ from `tensors` (read back by `read_trained_tensors`).
    """
    final, partial = out / CHECKPOINT, out / (CHECKPOINT + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    write_checkpoint(partial, cfg, tensors, dtype=torch.float32)
    save_file(_flatten_optimizer(optimizer, names), str(partial / STATE_TENSORS), metadata={"format": "pt"})
    if trained:
        contiguous = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in trained.items()}
        save_file(contiguous, str(partial / TRAINED_TENSORS), metadata={"format": "pt"})
    (partial / STATE_JSON).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    return _swap_in(partial, final)


def save_draft(folder: Path, cfg: DraftConfig, tensors: dict[str, torch.Tensor], vocab_ids: list[int],
               vocab_size: int, vocab_source: str) -> Path:
    """Write the exported draft (bf16 weights, sharded below 15 MiB, and its proposal vocabulary) to `folder`
    atomically: `folder.partial/` first, then renames. Only a draft folder (or nothing) is ever replaced."""
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()) and not is_draft_folder(folder):
        raise CheckpointError(f"{folder} exists and holds no DFlash draft; the run would replace it with its draft: "
                              "choose a new or empty folder for the draft")
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    write_checkpoint(partial, cfg, tensors, dtype=torch.bfloat16)
    write_vocab(partial, vocab_ids, vocab_size, source=vocab_source)
    return _swap_in(partial, folder)


def _swap_in(partial: Path, final: Path) -> Path:
    """Replace `final` by the complete folder `partial`: at every moment one of them (or `final.old`) is whole."""
    old = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    partial.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def restore(run: Run) -> int | None:
    """Load out_dir's checkpoint into the run (if resuming); returns its step, or None for a fresh run."""
    cfg = run.cfg
    folder = latest_checkpoint(cfg.out_dir)
    if folder is None:
        return None
    if not cfg.resume:
        raise InputError(f"{cfg.out_dir} already holds a training checkpoint; pass resume=True (--resume) to "
                         "continue it, or choose an empty out_dir")
    state = read_training_state(folder)
    stored = {k: state["config"].get(k, TrainConfig.field_default(k)) for k in cfg.run_fields()}
    changed = sorted(k for k, v in cfg.run_fields().items() if stored[k] != v)
    if changed:
        raise ConfigError(f"cannot resume {folder}: {changed} differ from the run that wrote it "
                          f"({ {k: stored[k] for k in changed} }); use the same settings or a new out_dir")
    _check_same_data(folder, state.get("data"), run)
    stored_dtype, dtype = state.get("target_dtype"), dtype_name(run.forward.target.dtype)
    if stored_dtype is not None and stored_dtype != dtype:  # the features, and so the draft's inputs, would change
        raise ConfigError(f"cannot resume {folder}: its target ran in {stored_dtype}, this one in {dtype}; pass "
                          f"--target-dtype {stored_dtype}, or continue into a new out_dir with --init-from")
    load_training_state(folder, run.draft_cfg, run.forward.draft, run.optimizer, run.names)
    if run.forward.scale is not None:  # the checkpoint's draft is the exported one; fc' comes bit-exact
        run.forward.load_trained_state(read_trained_tensors(folder))
    run.step, run.epoch, run.position = state["step"], state["epoch"], state["position"]
    run.skipped = state.get("skipped", 0)
    # The seconds trained so far (0 in checkpoints written before they were kept): a time budget and the schedule
    # it drives go on from there.
    run.elapsed = run.draft_saved = float(state.get("elapsed", 0.0))
    return run.step


def _check_same_data(folder: Path, stored: dict | None, run: Run) -> None:
    """Refuse to resume on other data: the step's batches are indices into the examples, so they would change."""
    if stored is None:  # written before checkpoints recorded their data
        return
    if stored["sha256"] != run.data_sha256:
        raise InputError(f"cannot resume {folder}: it was trained on {stored['examples']} examples from "
                         f"{stored['folders']}, and {run.cfg.data_names} now hold {len(run.examples)} other or "
                         "reordered examples; pass the same --data folders in the same order, unchanged, or use a "
                         "new out_dir (with --init-from to continue from its draft)")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def read_training_state(folder: Path) -> dict:
    """The state json of a checkpoint: step, epoch, position, and the TrainConfig fields it was run with."""
    file = folder / STATE_JSON
    try:
        state = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{file} cannot be read ({error}); restore the checkpoint, or resume into a new "
                              "out_dir with --init-from its draft") from error
    fields = {"step": int, "epoch": int, "position": int, "config": dict}
    wrong = [name for name, kind in fields.items()
             if not isinstance(state, dict) or not isinstance(state.get(name), kind)]
    if wrong:
        raise CheckpointError(f"{file} lacks {wrong} (or holds them with other types); it was written by another "
                              "program or damaged: restore the checkpoint, or use a new out_dir")
    return state


def load_training_state(folder: Path, cfg: DraftConfig, draft: torch.nn.Module,
                        optimizer: torch.optim.Optimizer, names: list[str]) -> None:
    """Restore draft weights and optimizer state from `folder` in place."""
    saved_cfg, tensors = read_checkpoint(folder, dtype=torch.float32)
    changed = config_differences(saved_cfg, cfg)
    if changed:
        # Same TrainConfig but another draft shape or interface means another target: continuing would mix them.
        raise CheckpointError(f"{folder}/config.json describes another draft than this run builds ("
                              f"{'; '.join(changed)}); resume with the same target, or use a new out_dir")
    draft.load_state_dict(tensors, strict=True)
    state = _unflatten_optimizer(folder / STATE_TENSORS, names)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, param in enumerate(params):
        slots = state.get(index, {})
        if not state:
            break  # no step taken yet: AdamW has no state to restore
        missing = sorted({"exp_avg", "exp_avg_sq", "step"} - set(slots))
        shapes = [f"{k} {list(slots[k].shape)}" for k in ("exp_avg", "exp_avg_sq")
                  if k in slots and slots[k].shape != param.shape]
        if missing or shapes:
            raise CheckpointError(f"{folder / STATE_TENSORS}: the optimizer state of `{names[index]}` "
                                  f"{'lacks ' + str(missing) if missing else 'has ' + ', '.join(shapes)} (the "
                                  f"parameter is {list(param.shape)}); restore the checkpoint, or use a new out_dir")
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


# How a target was named and which release wrote the checkpoint: another spelling of the same target (a path with
# a trailing slash, a hub id for its local copy) or an upgrade must not block a resume; its fingerprints must match.
NAMING_KEYS = ("target", "target_revision", "version")


def config_differences(saved: DraftConfig, now: DraftConfig) -> list[str]:
    """The fields in which two draft configs differ, as "field: saved X, now Y", naming aside (NAMING_KEYS)."""
    out = []
    for field in dataclasses.fields(DraftConfig):
        a, b = getattr(saved, field.name), getattr(now, field.name)
        if field.name == "provenance":
            a, b = ({k: v for k, v in (p or {}).items() if k not in NAMING_KEYS} for p in (a, b))
            out += [f"provenance.{k}: saved {a.get(k)!r}, now {b.get(k)!r}" for k in sorted(set(a) | set(b))
                    if a.get(k) != b.get(k)]
        elif a != b:
            out.append(f"{field.name}: saved {a!r}, now {b!r}")
    return out


def read_trained_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The exact trained tensors a standardized-feature checkpoint stores beside its exported draft."""
    file = folder / TRAINED_TENSORS
    if not file.is_file():
        raise CheckpointError(f"{folder} has no {TRAINED_TENSORS}, which a standardized-feature run needs to "
                              "resume; it was written by another version or run: use a new out_dir")
    with safe_open(str(file), framework="pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}


def _flatten_optimizer(optimizer: torch.optim.Optimizer, names: list[str]) -> dict[str, torch.Tensor]:
    flat = {}
    for index, slots in optimizer.state_dict()["state"].items():
        for key, value in slots.items():
            flat[f"{names[index]}.{key}"] = torch.as_tensor(value).detach().to("cpu", copy=True).contiguous()
    return flat


def _unflatten_optimizer(file: Path, names: list[str]) -> dict[int, dict[str, torch.Tensor]]:
    index = {name: i for i, name in enumerate(names)}
    state: dict[int, dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(file), framework="pt") as handle:
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as error:  # a missing file (OSError) or a damaged one (SafetensorError)
        raise CheckpointError(f"{file} cannot be read ({error}); restore the checkpoint, or use a new "
                              "out_dir") from error
    for key, tensor in tensors.items():
        name, slot = key.rsplit(".", 1)
        if name not in index:
            raise CheckpointError(f"{file} holds optimizer state for `{name}`, which this draft does not "
                                  "train; resume with the same draft configuration, or use a new out_dir")
        state.setdefault(index[name], {})[slot] = tensor
    return state
