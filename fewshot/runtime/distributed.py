"""Multi-process training under torchrun: process group set-up from the environment."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Distributed:
    """This process's place in the job: rank, number of processes, local rank."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs and writes checkpoints."""
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """This process's device: under torchrun, each rank its own GPU (the current device,
        which NCCL collectives use)."""
        if self.world == 1 or device.type != "cuda":
            return device
        local = torch.device("cuda", self.local_rank)
        torch.cuda.set_device(local)
        return local


def init_distributed(device: torch.device) -> Distributed:
    """Join the torchrun job described by RANK/WORLD_SIZE/LOCAL_RANK (a no-op without them).

    NCCL on GPUs, gloo on CPUs.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Distributed()
    info = Distributed(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return info


def close_distributed(info: Distributed, agreed: bool) -> None:
    """Leave the torchrun job: tear the process group down, so no rank aborts at exit.

    `agreed`: every rank ended the same way (finished, or stopped at the same step), so all wait
    at a barrier first; without it a rank that finishes early tears its connections down while
    rank 0 still writes its checkpoints, and gloo may abort it (SIGABRT). After a failure of one
    rank the others would wait forever, so there is no barrier then.
    """
    if info.world == 1 or not dist.is_initialized():
        return
    if agreed:
        dist.barrier()
    dist.destroy_process_group()


def end_rank(status: int) -> None:
    """End a torchrun rank whose command is done, with `status`, skipping the interpreter's
    finalisation (a no-op in a single process). There gloo's threads are torn down after the
    process group, and a rank whose work was finished and saved could still abort (SIGABRT,
    "terminate called without an active exception"), which torchrun reports as the job
    failing. Nothing is left to finalise: the command closed its files and the group."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def gather_objects(obj: object, info: Distributed) -> list | None:
    """Every rank's `obj` in rank order, on every rank (None in a single process)."""
    if info.world == 1:
        return None
    objects: list = [None] * info.world
    dist.all_gather_object(objects, obj)
    return objects


def any_rank(value: int, info: Distributed) -> int:
    """The largest of every rank's `value` (e.g. a stop signal number), on every rank."""
    if info.world == 1:
        return value
    flag = torch.tensor([value], dtype=torch.long)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def broadcast_from_main(obj: object, info: Distributed) -> object:
    """Rank 0's `obj` on every rank."""
    if info.world == 1:
        return obj
    objects = [obj]
    dist.broadcast_object_list(objects, src=0)
    return objects[0]
