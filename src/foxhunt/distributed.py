"""Data-parallel training with PyTorch's own engine (``torchrun`` + DistributedDataParallel).

Run ``torchrun --nproc_per_node N -m foxhunt.cli train ...``: each rank collects with its own
environments (seeded ``seed + rank``) into its own replay, samples its own effective batch, and
DDP averages gradients once per optimizer step (all micro-batches but the last run under
``no_sync``). With equal per-rank batches the step equals one step over all ranks' samples.
Only rank 0 writes the run directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def _env(name: str, default: str | None = None) -> str:
    """A variable torchrun sets in the environment, or one line naming it (unset or empty)."""
    from foxhunt.errors import ConfigError

    text = os.environ.get(name, default)
    if not text and default is None:
        raise ConfigError(
            f"{name} must be set when WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} (a data-parallel "
            "job): start it with `torchrun --nproc_per_node N -m foxhunt.cli train ...`, or unset "
            "WORLD_SIZE to train in one process"
        )
    return str(text)


def _env_int(name: str, default: str | None = None) -> int:
    """An integer torchrun sets in the environment, or one line naming what is wrong."""
    from foxhunt.errors import ConfigError

    text = _env(name, default)
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got: {text!r}") from None


def launched_world_size() -> int:
    """The number of processes torchrun started this one among (1 when it did not)."""
    return _env_int("WORLD_SIZE", "1")


def init_from_env(device_type: str = "cpu") -> DistInfo:
    """Join the process group torchrun describes in the environment (no-op for one process)."""
    world = launched_world_size()
    if world <= 1:
        return DistInfo()
    from foxhunt.errors import ConfigError

    rank = _env_int("RANK")
    local_rank = _env_int("LOCAL_RANK", "0")
    if not 0 <= rank < world:
        raise ConfigError(f"RANK must lie in [0, WORLD_SIZE={world}), got: {rank}")
    if not dist.is_initialized():
        _env("MASTER_ADDR")  # torchrun sets both; torch's own refusal is a traceback
        _env_int("MASTER_PORT")
        backend = "nccl" if device_type == "cuda" and torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
    if device_type == "cuda" and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank)


def current() -> DistInfo:
    """The running job's DistInfo (single process when no group is initialised)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    return DistInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )


def shutdown() -> None:
    """Leave the process group cleanly: every rank reaches the barrier before teardown, so no
    rank exits while a peer is still inside a collective (gloo aborts the process if one does)."""
    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
