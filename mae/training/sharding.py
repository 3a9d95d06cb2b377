"""Fully sharded training (FSDP2, torch's ``fully_shard``) through Lightning's ``ModelParallelStrategy``.

``FSDP2Strategy`` shards each transformer block, then the whole network, over every process (ZeRO-3:
parameters, gradients and optimizer state each held once across the processes); the stackable recipe
``strategy/fsdp`` selects it. On GPUs under ``trainer.precision: bf16-mixed`` the sharded parameters stay
fp32 and each block computes with bf16 copies, its gradients reduced in fp32; on CPU (gloo) everything
is fp32. Checkpoints are a folder of shards (torch distributed checkpoint, read back on any number of
processes, or by one with ``mae.convert.sharded_checkpoint``) or one full file, as ``checkpoint`` says.
"""

import os
import shutil
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.strategies import ModelParallelStrategy, ParallelStrategy
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from mae.compat.lightning import set_data_parallel_only
from mae.convert.sharded_checkpoint import (
    META_FILE,
    indexed_optimizer_state,
    is_sharded_checkpoint,
    read_training_checkpoint,
)
from mae.errors import ConfigError
from mae.io.atomic import check_free_space, replace_folder
from mae.training.checkpointing import check_replaceable_checkpoint, tensor_bytes

CheckpointFormat = Literal["sharded", "full"]


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as pure data parallelism: every process holds one shard
    of each block (the data-parallel mesh spans the world; no tensor parallelism).

    Args:
        checkpoint: "sharded": each process writes its shards into a checkpoint folder (fast, no
            gathering; resumable on another number of processes); "full": the whole state is gathered
            on rank 0 and written as one ``.ckpt`` file, as without sharding.
        reshard_after_forward: free each block's gathered parameters after its forward (ZeRO-3; gathered
            again for the backward) rather than keeping them until the backward (less communication,
            more memory).
        process_group_backend: None: gloo on CPU, NCCL on GPUs.
        timeout: of the collectives.
    """

    def __init__(
        self,
        checkpoint: CheckpointFormat = "sharded",
        reshard_after_forward: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        if checkpoint not in ("sharded", "full"):
            raise ConfigError(
                f"trainer.strategy.init_args.checkpoint must be 'sharded' or 'full', got {checkpoint!r}"
            )
        super().__init__(
            save_distributed_checkpoint=checkpoint == "sharded",
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.checkpoint_format = checkpoint
        self.reshard_after_forward = reshard_after_forward

    def setup_environment(self) -> None:
        # The world size is known once the processes are: one data-parallel dimension over all of them.
        set_data_parallel_only(self, self.num_nodes * self.num_processes)
        super().setup_environment()

    def shard(self, network: nn.Module, blocks: Iterable[nn.Module], precision: str) -> None:
        """``fully_shard`` each of ``blocks``, then ``network`` (what is left: embeddings, norms, head),
        over the data-parallel mesh. A caller of another method than ``forward`` gathers ``network``'s own
        parameters first (``network.unshard()``: the monitors' ``evaluating``)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy()
        if precision == "bf16-mixed":
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        mesh = self.device_mesh["data_parallel"]
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=self.reshard_after_forward)
        fully_shard(network, mesh=mesh, mp_policy=policy, reshard_after_forward=self.reshard_after_forward)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | Path, storage_options: Any = None
    ) -> None:
        """A sharded checkpoint is written into a temporary folder beside ``filepath`` and renamed into
        place when every process has written its shards, so that a kill during the save leaves the
        previous checkpoint intact (a file there, of a run on one process, is replaced too); a full one goes
        through the checkpoint IO (an atomic file)."""
        if self.checkpoint_format == "full":
            # rank 0 through the checkpoint IO (an atomic file that also replaces a sharded folder once
            # written), not Lightning's own path, which first removes a sharded checkpoint there
            ParallelStrategy.save_checkpoint(self, checkpoint, filepath, storage_options)
            return
        path = Path(self.broadcast(str(filepath)))
        check_replaceable_checkpoint(path)  # a file or checkpoint folder is replaced, a user's folder not
        tmp = path.with_name(f".{path.name}.tmp-{self.broadcast(os.getpid())}")
        local = torch.tensor(float(tensor_bytes(checkpoint)), device=self.root_device)  # NCCL: on the GPU
        check_free_space(path, int(self.reduce(local, reduce_op="sum").item()))  # the same on every process
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
        except BaseException:
            if self.is_global_zero:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.barrier()
        if self.is_global_zero:
            if not (tmp / META_FILE).is_file():
                raise RuntimeError(f"the sharded checkpoint {tmp} is incomplete: no {META_FILE}")
            replace_folder(tmp, path)
        self.barrier()

    def load_checkpoint(
        self, checkpoint_path: str | Path, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """A sharded checkpoint folder as Lightning loads it; a ``.ckpt`` file (of a run on one process, or
        ``checkpoint: full``) read by the safe loader and put into the shards on every process, its
        optimizer states keyed by parameter name through the optimizers' own parameter order (Lightning
        numbers them in the network's order, which the weight-decay groups do not follow). Returns the
        checkpoint's other entries."""
        path = Path(self.broadcast(str(checkpoint_path)))
        if is_sharded_checkpoint(path):
            return super().load_checkpoint(path, weights_only=weights_only)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        checkpoint = read_training_checkpoint(path)
        options = StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True, strict=self.lightning_module.strict_loading
        )
        set_model_state_dict(self.model, checkpoint.pop("state_dict"), options=options)
        for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states", []), strict=True):
            named = named_optimizer_state(state, self.model, optimizer)
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=named, options=options)
        return checkpoint


def named_optimizer_state(state: dict[str, Any], module: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """An optimizer state keyed by parameter index (``Optimizer.state_dict``'s layout) keyed by the names of
    ``module``'s parameters instead, index ``i`` being the ``i``-th parameter of ``optimizer``'s groups in
    order: the inverse of ``mae.convert.sharded_checkpoint.indexed_optimizer_state``."""
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    order = [names[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]
    return {
        "state": {order[index]: value for index, value in state.get("state", {}).items()},
        "param_groups": [
            {**group, "params": [order[index] for index in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def transformer_blocks(network: nn.Module) -> list[nn.Module]:
    """The blocks FSDP2 shards one by one: the elements of ``network.blocks`` and, for an MAE,
    ``network.decoder_blocks``."""
    return [block for name in ("blocks", "decoder_blocks") for block in getattr(network, name, [])]


def total_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of ``tensors`` taken together; of sharded tensors (FSDP2), over every process's shards
    (a collective: call it on every process), so that every process takes the same decision on it."""
    norm = torch.nn.utils.get_total_norm(tensors)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def full_training_state(module: nn.Module, optimizers: list[Optimizer]) -> tuple[dict, list[dict]]:
    """The whole state dicts of the sharded ``module`` and of its ``optimizers`` (keyed by parameter index,
    as ``Optimizer.state_dict``), gathered from every process's shards onto each process, on the CPU: a
    collective, so every process calls it."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    state = get_model_state_dict(module, options=options)
    optimizer_states = [
        indexed_optimizer_state(get_optimizer_state_dict(module, optimizer, options=options))
        for optimizer in optimizers
    ]
    return move_data_to_device(state, "cpu"), move_data_to_device(optimizer_states, "cpu")


def is_sharded(trainer: pl.Trainer | None) -> bool:
    """Whether ``trainer`` trains with FSDP2 (every process must then take part in each forward)."""
    return trainer is not None and isinstance(trainer.strategy, FSDP2Strategy)
