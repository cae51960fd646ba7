"""This process's place in a torchrun job: rank, world size, the one all-reduce training needs, and teardown.

Without torchrun (no WORLD_SIZE > 1 in the environment) it is rank 0 of 1 and every call is a no-op. The
process group is gloo on CPU and NCCL on CUDA; a group someone else started is used and left to them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import ConfigError


def rank_device(device: str, environ=os.environ) -> str:
    """The device this process trains on: under a multi-process torchrun job `cuda` becomes cuda:LOCAL_RANK
    (torchrun gives every rank the same arguments, so one GPU named for all of them would be shared); otherwise
    `device` as given."""
    world = int(environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not str(device).startswith("cuda"):
        return device
    if device != "cuda":
        raise ConfigError(f"--device {device} would put all {world} torchrun ranks on one GPU; pass --device cuda "
                          "and each rank takes its own, cuda:LOCAL_RANK")
    if "LOCAL_RANK" not in environ:
        raise ConfigError(f"WORLD_SIZE is {world} but LOCAL_RANK is not set; start multi-process training with "
                          "torchrun --nproc_per_node N")
    return f"cuda:{int(environ['LOCAL_RANK'])}"


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
