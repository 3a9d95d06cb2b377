"""Private names of PyTorch (tested with torch 2.14.1).

- ``torch.utils.data._utils.collate``: ``collate`` with a ``collate_fn_map`` is how torch's own docs
  show a ``default_collate`` with one type collated differently; only ``default_collate`` is public.
- ``DataLoader._get_iterator``: the one method that starts a loader's workers. ``__iter__`` is no
  hook for it: litdata's ``StreamingDataLoader.__iter__`` is a generator, which starts them later.
- ``torch.onnx._constants.ONNX_MAX_OPSET`` and ``torch.onnx._internal.exporter._constants.TORCHLIB_OPSET``:
  the opsets the exporter writes; ``torch.onnx`` exports no name for them.
- ``torch.distributed.checkpoint.default_planner._EmptyStateDictLoadPlanner`` and
  ``torch.distributed.checkpoint.state_dict_loader._load_state_dict``: the planner that builds a state dict
  from a distributed checkpoint's own index, and the load that fills the dict it is given (the public
  ``load`` fills a copy); torch's ``dcp_to_torch_save`` reads with both. A sharded checkpoint is read by
  one process with them, without writing a consolidated copy first.
- ``Optimizer._step_supports_amp_scaling``: how torch marks an optimizer that unscales the gradients
  inside its own step (the fused Adam and AdamW), the flag ``GradScaler.step`` reads; the optimizer's
  ``defaults["fused"]`` says it only for the optimizers that take ``fused``, not for one that declares it
  otherwise.
- The module names that wrappers insert into parameter names (FSDP, activation checkpointing,
  ``torch.compile``): torch defines them in private modules.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.utils.data._utils import collate as _collate

# FSDP (torch.distributed.fsdp._common_utils.FSDP_WRAPPED_MODULE), activation checkpointing
# (torch.distributed.algorithms._checkpoint.checkpoint_wrapper._CHECKPOINT_WRAPPED_MODULE) and
# torch.compile (OptimizedModule._orig_mod).
WRAPPER_MODULE_NAMES = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")

# Builds the state dict it loads from the checkpoint's index; ``keys``: only these top-level entries.
EmptyStateDictLoadPlanner = _EmptyStateDictLoadPlanner


def load_distributed_checkpoint(state_dict: dict, storage_reader: Any, planner: Any) -> None:
    """Fill ``state_dict`` from a distributed checkpoint in this process alone (no process group)."""
    _load_state_dict(state_dict, storage_reader=storage_reader, planner=planner, no_dist=True)


def unscales_in_step(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` unscales the gradients inside its own step (a fused AdamW under a
    ``GradScaler``): before that step its gradients are still multiplied by the loss scale."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def collate_with(batch: list, collate_fn_map: dict[type, Callable]) -> Any:
    """``torch.utils.data.default_collate`` of ``batch``, with the functions of ``collate_fn_map``
    (type -> ``fn(batch, *, collate_fn_map)``) in place of its own for those types."""
    return _collate.collate(batch, collate_fn_map={**_collate.default_collate_fn_map, **collate_fn_map})


def stack_tensors(batch: list[torch.Tensor], **kwargs: Any) -> torch.Tensor:
    """How ``default_collate`` stacks tensors (into shared memory in a loader worker)."""
    return _collate.collate_tensor_fn(batch, **kwargs)


class IteratorStartHook:
    """A ``DataLoader`` mixin: ``start_iterator(start)`` runs around every start of the loader's
    iterator (and so of its workers); ``start()`` makes the iterator."""

    def start_iterator(self, start: Callable[[], Any]) -> Any:
        return start()

    def _get_iterator(self):
        return self.start_iterator(super()._get_iterator)


def onnx_opset_range() -> tuple[int, int]:
    """(lowest, highest) ONNX opset the installed exporter writes natively: the opset its operator
    library (torchlib) is written in, up to torch's declared maximum."""
    from torch.onnx import _constants
    from torch.onnx._internal.exporter._constants import TORCHLIB_OPSET

    return TORCHLIB_OPSET, _constants.ONNX_MAX_OPSET
