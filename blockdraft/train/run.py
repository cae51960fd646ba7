"""The state of one training run: what the loop reads and advances, and what a checkpoint stores of it
(trainer.py runs it, checkpointing.py saves and restores it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import DraftConfig
from ..model.target import Target
from .batches import epoch_batches
from .data import Example
from .evaluate import BlockMetrics
from .features import FeatureCache
from .forward import BlockForward
from .ranks import Ranks
from .settings import TrainConfig


@dataclass
class Run:
    """Everything the loop reads and advances; the position (step, epoch, position) is what a checkpoint stores."""

    cfg: TrainConfig
    target: Target
    ranks: Ranks
    examples: list[Example]
    train_indices: list[int]
    val_indices: list[int]
    draft_cfg: DraftConfig
    forward: BlockForward
    model: torch.nn.Module  # forward, wrapped in DDP under torchrun, called through torch.compile (compiled.py)
    optimizer: torch.optim.Optimizer
    names: list[str]
    head: torch.Tensor
    autocast_dtype: torch.dtype | None
    total_steps: int
    step: int = 0
    epoch: int = 0
    position: int = 0
    metrics: BlockMetrics | None = None
    last_train: dict | None = None
    last_val: dict | None = None
    grad_norm: float = 0.0
    skipped: int = 0
    batches: dict = field(default_factory=dict)
    cache: FeatureCache | None = None
    vocab: torch.Tensor | None = None  # [N] the proposal vocabulary the head is limited to (proposal_vocab)
    vocab_ids: list[int] = field(default_factory=list)  # the draft's proposal vocabulary, written beside it
    vocab_source: str = ""
    data_sha256: str = ""  # `data_fingerprint` of the examples: a resume must find the same data
    lr: float = 0.0  # the learning rate of the last step
    started: float = 0.0  # monotonic() at the first step of this process
    elapsed: float = 0.0  # seconds since `started` after the last step, the same on every rank
    draft_saved: float = 0.0  # `elapsed` when the draft folder was last written

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def finished(self) -> bool:
        """All steps done, or the time budget spent."""
        budget = self.cfg.time_budget
        return self.step >= self.total_steps or (budget is not None and self.elapsed >= budget)

    @property
    def max_len(self) -> int:
        return min(self.cfg.max_seq_len, self.target.max_positions)

    def batches_of(self, epoch: int) -> list[list[int]]:
        """The epoch's global batches (only the current epoch's are kept)."""
        if epoch not in self.batches:
            self.batches = {epoch: epoch_batches(self.train_indices, epoch, self.cfg.batch_size, self.cfg.seed)}
        return self.batches[epoch]
