"""This process's place in a torchrun job: rank, world size, the one all-reduce training needs, and teardown.

Without torchrun (no WORLD_SIZE > 1 in the environment) it is rank 0 of 1 and every call is a no-op. The
process group is gloo on CPU and NCCL on CUDA; a group someone else started is used and left to them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Ranks:
    """This process's place in a torchrun job (rank 0 of 1 without one)."""

    rank: int = 0
    world: int = 1
    owned: bool = False  # this trainer started the process group, so it also ends it

    @classmethod
    def start(cls, device: torch.device) -> Ranks:
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            return cls(dist.get_rank(), dist.get_world_size(), owned=True)
        return cls()

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(tensor)
        return tensor

    def stop(self, finished: bool) -> None:
        if self.owned:
            if finished:  # every rank leaves together: a gloo rank tearing down while its peer is gone can hang
                dist.barrier()
            dist.destroy_process_group()
