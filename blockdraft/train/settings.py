"""`TrainConfig`: one training run's settings (docs/training.md §1 defaults), validated when built."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from ..config import gamma_for_block_size
from ..errors import ConfigError
from ..io.vocab import VOCAB_FILE
from .compiled import COMPILE_MODES

# Fields that only say how to watch or where to find things; anything else changes the run, so a resume refuses it.
# A time budget is one too: it counts the run's training seconds across resumes, so a larger one trains a resumed run
# further (a budgeted run is not reproducible step for step anyway). So is compiling: the same function, rounded in
# another order.
OPERATIONAL_FIELDS = ("data_dirs", "out_dir", "save_every", "eval_every", "log_every", "resume", "cache_features",
                      "feature_store", "time_budget", "save_draft_every_seconds", "draft_dir", "compile")


@dataclass(frozen=True)
class TrainConfig:
    """One training run (docs/training.md §1 defaults). batch_size counts sequences per optimizer step, all ranks
    together; micro_batch_size is per rank (None: the rank's whole share at once)."""

    data_dirs: tuple[Path, ...]  # one `blockdraft data` folder, or several read as one set in this order
    out_dir: Path
    num_draft_layers: int = 5
    block_size: int = 16
    gamma: float | None = None  # None: the published value for block_size (7, 5, 4 for 16, 10, 8)
    anchors: int = 512
    max_seq_len: int = 3072
    lr: float = 6e-4
    warmup_fraction: float = 0.04
    min_lr: float = 0.0
    weight_decay: float = 0.0
    clip: float = 1.0
    epochs: int = 6
    batch_size: int = 32
    micro_batch_size: int | None = None
    save_every: int = 500
    eval_every: int = 500
    log_every: int = 10
    val_fraction: float = 0.02  # held out at random, unless a data folder has its own val/ shards
    seed: int = 0
    dtype: str = "bfloat16"  # autocast compute dtype; master weights and optimizer state stay fp32
    cpu_autocast: bool = False  # CPU runs in fp32 unless this is set
    max_steps: int | None = None  # caps the run and its schedule
    init_from: Path | None = None  # start from this draft folder instead of a random init
    init_target_layers: tuple[int, ...] | None = None  # start each draft layer from this target layer (target_init.py)
    grow_layers: int = 0  # append this many layers to init_from's, each adding nothing at the start (grow.py)
    mask_token_id: int | None = None  # None: docs/training.md §1's order (tokenizer mask, spare row, unused special)
    target_layer_ids: tuple[int, ...] | None = None  # None: the default rule
    resume: bool = True  # continue out_dir/checkpoint if present
    standardize_features: bool = False  # train fc on per-dimension standardized features (see BlockForward)
    scale_sequences: int = 32  # training sequences the feature scale is measured on
    cache_features: bool = False  # keep each sequence's target features in memory: one target forward per run
    feature_store: bool = False  # read features from each data folder's store (feature_store.py); implies the cache
    kd_weight: float = 0.0  # λ of (1-λ)·CE + λ·KD (docs/training.md §3): 0 is plain CE, 1 pure KD
    weighting: str = "decay"  # slot weights: "decay" exp(-(k-1)/gamma), or "dpace" (docs/training.md §3)
    dpace_alpha: float = 0.5  # D-PACE's acceptance floor α
    proposal_vocab: bool = False  # score only the ids the decoder drafts from (decode/vocab.py) and prompt ids
    head_ids: int | None = None  # score only the N most frequent response ids (and prompt ids), the labels outside
    # them left out; the draft then proposes these N (implies a proposal vocabulary)
    head_ids_from: Path | None = None  # as head_ids, over the ids of this draft folder's proposal vocabulary (e.g.
    # the init_from draft's, so that a continuation over other data keeps the head its parent was trained with)
    time_budget: float | None = None  # seconds from the first step: stop after the step that crosses it (see _lr)
    save_draft_every_seconds: float | None = None  # also write the draft folder this often, not only at the end
    draft_dir: Path | None = None  # where the draft folder goes; None: out_dir/draft
    compile: str = "off"  # torch.compile the draft's forward: off, on, or auto (long runs; compiled.py)

    def __post_init__(self) -> None:
        for name in ("out_dir", "init_from", "draft_dir", "head_ids_from"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        folders = (self.data_dirs,) if isinstance(self.data_dirs, (str, Path)) else tuple(self.data_dirs)
        object.__setattr__(self, "data_dirs", tuple(Path(folder) for folder in folders))
        for name in ("target_layer_ids", "init_target_layers"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        problems = [f"`{name}` must be an integer >= {low}, got {getattr(self, name)!r}"
                    for name, low in (("num_draft_layers", 1), ("block_size", 2), ("anchors", 1), ("max_seq_len", 2),
                                      ("epochs", 1), ("batch_size", 1), ("save_every", 1), ("eval_every", 1),
                                      ("log_every", 1), ("micro_batch_size", 1), ("max_steps", 1),
                                      ("scale_sequences", 1), ("head_ids", 2), ("grow_layers", 0))
                    if getattr(self, name) is not None and not _int_at_least(getattr(self, name), low)]
        checks = [("lr", self.lr > 0, "> 0"), ("min_lr", 0 <= self.min_lr <= self.lr, "in [0, lr]"),
                  ("warmup_fraction", 0 <= self.warmup_fraction < 1, "in [0, 1)"),
                  ("weight_decay", self.weight_decay >= 0, ">= 0"), ("clip", self.clip > 0, "> 0"),
                  ("val_fraction", 0 <= self.val_fraction < 1, "in [0, 1)"),
                  ("kd_weight", 0 <= self.kd_weight <= 1, "in [0, 1]"),
                  ("weighting", self.weighting in ("decay", "dpace"), "decay or dpace"),
                  ("dpace_alpha", 0 <= self.dpace_alpha <= 1, "in [0, 1]"),
                  ("compile", self.compile in COMPILE_MODES, " or ".join(COMPILE_MODES)),
                  ("gamma", self.gamma is None or self.gamma > 0, "> 0 or None"),
                  ("time_budget", self.time_budget is None or self.time_budget > 0, "> 0 seconds or None"),
                  ("save_draft_every_seconds", self.save_draft_every_seconds is None
                   or self.save_draft_every_seconds > 0, "> 0 seconds or None"),
                  # float16 autocast would need loss scaling against gradient underflow, which the trainer does not do
                  ("dtype", self.dtype in ("bfloat16", "float32"), "bfloat16 or float32 (float16 needs loss scaling)")]
        problems += [f"`{name}` must be {want}, got {getattr(self, name)!r}" for name, ok, want in checks if not ok]
        if self.init_target_layers is not None and self.init_from is not None:
            # Both would set the draft's weights: one would silently overwrite the other.
            problems.append("`init_target_layers` and `init_from` both choose the starting weights; keep one")
        if self.grow_layers and self.init_from is None:
            # Growing needs a draft to grow: a fresh draft of num_draft_layers is what --layers alone trains.
            problems.append("`grow_layers` appends layers to the `init_from` draft; set `init_from`, or drop "
                            "`grow_layers` and set `num_draft_layers` for a fresh draft")
        if self.head_ids is not None and self.head_ids_from is not None:
            problems.append("`head_ids` and `head_ids_from` both choose the head's ids; keep one")
        if self.head_ids_from is not None and not (self.head_ids_from / VOCAB_FILE).is_file():
            problems.append(f"`head_ids_from` {self.head_ids_from} has no {VOCAB_FILE}: name a draft folder trained "
                            f"with a head over chosen ids, or set `head_ids` N to take the data's N most frequent")
        problems += _data_problems(self.data_dirs)
        if problems:
            raise ConfigError("invalid training config: " + "; ".join(problems) + "; fix these settings")
        if self.gamma is None:
            gamma_for_block_size(self.block_size)  # no published gamma for this K: refuse now, not mid-run

    @property
    def data_names(self) -> str:
        return ", ".join(str(folder) for folder in self.data_dirs)

    @property
    def draft_folder(self) -> Path:
        return self.draft_dir if self.draft_dir is not None else self.out_dir / "draft"

    @property
    def loss_gamma(self) -> float:
        """The decay's gamma; inf (weights = validity) under D-PACE, whose weights come from the model."""
        if self.weighting == "dpace":
            return math.inf
        return self.gamma if self.gamma is not None else gamma_for_block_size(self.block_size)

    @property
    def loss_dpace_alpha(self) -> float | None:
        return self.dpace_alpha if self.weighting == "dpace" else None

    @staticmethod
    def field_default(name: str):
        """A field's default: what a checkpoint written before the field existed ran with."""
        return {f.name: f.default for f in dataclasses.fields(TrainConfig)}[name]

    def run_fields(self) -> dict:
        """The fields that define the run's result, as JSON values (stored with every checkpoint)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in OPERATIONAL_FIELDS}
        return {k: str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def _data_problems(folders: tuple[Path, ...]) -> list[str]:
    """An empty list, or a folder named twice (its examples would count double)."""
    if not folders:
        return ["`data_dirs` must name at least one data folder"]
    seen: dict[Path, Path] = {}
    problems = []
    for folder in folders:
        key = folder.resolve()
        if key in seen:
            problems.append(f"`data_dirs` names {seen[key]} twice (as {folder}); its examples would count double")
        seen.setdefault(key, folder)
    return problems


def _int_at_least(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low
